"""The claims: one :class:`~mtlflow.experiments.claims.model.Claim` per headline result of COST (Zhou et al.,
NeurIPS 2025), PaLoRA (Dimitriadis et al., ICLR 2025), LDC-MTL (2025) and Ye's thesis (MOML/FORUM ch. 3, ASMG
ch. 4, NORMAL ch. 5): the paper's number with its table or figure, the configuration at ``paper`` scale and at
``ci`` scale (data, model, epochs, seeds, method settings) and the runner (:mod:`.runners`) that measures it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments.claims.model import SCALES, Claim, Scale
from mtlflow.experiments.claims.runners import (
    run_asmg_table,
    run_cost_mechanism,
    run_cost_overhead,
    run_palora_front,
    run_palora_overhead,
    run_step_ratio,
    run_toy_escape,
    run_trained_gain,
)

# 40 epochs of 8 batches: 320 Adam steps, where LS reaches about 90 % test accuracy per digit (3 epochs, 24 steps,
# left every method near 57 % and most comparisons empty)
_MULTIMNIST_CI = {"benchmark": "multimnist", "data_options": {"n_train": 2000, "n_val": 200, "n_test": 500},
                  "train": {"epochs": 40}}
_MULTIMNIST_CI_TEXT = "MultiMNIST (2,000 training images of the shipped digits), LeNet, 40 epochs (320 steps), 3 seeds"
_MULTIMNIST_PAPER = {"benchmark": "multimnist", "data_options": {"mnist_dir": "../shared/realdata/mnist"},
                     "train": {}}


def _cost_gain(key: str, source: str, benchmark: str, paper_text: str, difference: float, paper_config: dict,
               data: str | None) -> Claim:
    cost = {"label": "fairgrad-cost", "method": "fairgrad", "teleport": "cost"}
    base = {"label": "fairgrad", "method": "fairgrad"}

    def config(common: Mapping[str, Any]) -> dict[str, Any]:
        return {**common, "metric": "delta_m", "method": cost, "baseline": base}

    return Claim(
        key=key, paper="COST", source=source,
        statement=f"FairGrad + COST has a lower Δm% than FairGrad on {benchmark}",
        paper_text=paper_text, paper_value=difference, metric="Δm% (test, vs single-task LS)", rule="gain",
        lower_is_better=True, runner=run_trained_gain, data=data,
        scales={"paper": Scale(f"{benchmark}, the benchmark recipe (epochs, batch, model), COST's defaults "
                               "(dominated trigger), 3 seeds", config(paper_config)),
                "ci": Scale("MultiMNIST (2,000 training images of the shipped digits), LeNet, 40 epochs (320 steps), "
                            "COST's defaults, 3 seeds", config(_MULTIMNIST_CI))},
        if_not="the dominated-conflict trigger rarely or never fires on MultiMNIST (docs/research/cost.md), so "
               "COST is FairGrad there; the ci scale is not the paper's benchmark")


def _trained(key: str, paper: str, source: str, statement: str, paper_text: str, difference: float,
             metric: str, method: Mapping[str, Any], baseline: Mapping[str, Any], paper_common: Mapping[str, Any],
             paper_description: str, data: str | None, if_not: str, ci_common: Mapping[str, Any] = _MULTIMNIST_CI,
             ci_description: str = _MULTIMNIST_CI_TEXT,
             ci_sides: Mapping[str, Mapping[str, Any]] | None = None) -> Claim:
    def config(common: Mapping[str, Any], sides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        sides = sides or {"method": method, "baseline": baseline}
        return {**common, "metric": metric, "method": dict(sides["method"]), "baseline": dict(sides["baseline"])}

    return Claim(key=key, paper=paper, source=source, statement=statement, paper_text=paper_text,
                 paper_value=difference,
                 metric=("Δm% (test, vs single-task LS)" if metric == "delta_m"
                         else "mean test accuracy over tasks (%)"),
                 rule="gain", lower_is_better=metric == "delta_m", runner=run_trained_gain, data=data,
                 scales={"paper": Scale(paper_description, config(paper_common)),
                         "ci": Scale(ci_description, config(ci_common, ci_sides))},
                 if_not=if_not)


def _palora_overhead(key: str, benchmark: str, percent: float, source: str) -> Claim:
    config = {"benchmark": benchmark, "data_options": {"model": "segnet"}, "rank": 4, "layers": "all",
              "factorization": "kernel"}
    return Claim(
        key=key, paper="PaLoRA", source=source,
        statement=f"PaLoRA's adapters add {percent} % parameters to the SegNet of {benchmark}",
        paper_text=f"{percent} %", paper_value=percent, metric="adapter parameters / model parameters (%)",
        rule="equals", lower_is_better=True, runner=run_palora_overhead, tolerance=0.05,
        scales={s: Scale("SegNet (no data needed), r = 4, adapters on every layer, k×k kernels factorised as "
                         "LoRA's reference code", config, seeds=(0,)) for s in SCALES},
        if_not="another layer set or factorisation; see docs/research/palora.md",
        no_seeds="a parameter count is deterministic: one value, no interval")


_LDC = {"label": "ldcmtl", "method": "ldcmtl"}
_LS = {"label": "ls", "method": "ls"}
_PALORA = {"label": "palora", "method": "palora"}
_NORMAL = {"label": "ls-normal", "method": "ls", "architecture": "normal"}
_PAMAL = {"label": "palora-pamal", "method": "palora", "hparams": {"schedule": "dirichlet", "rays": 5}}
_CITYSCAPES = {"benchmark": "cityscapes", "data_options": {}, "train": {}}
_NYUV2 = {"benchmark": "nyuv2", "data_options": {}, "train": {}}
_OFFICE31 = {"benchmark": "office31", "data_options": {}, "train": {}}
# COST's ablation (Tables 4, 7, 8; the rows of mtlflow.experiments.cost_ablation.ablation_rows): FairGrad + COST
# with one component removed or changed, per scale. At ci scale the component and adapter rows use the weak
# trigger: the paper's dominated trigger never fires on MultiMNIST (docs/research/cost.md), so every row would be
# FairGrad's own run and the comparison empty.
_COST_FULL = {"label": "fairgrad-cost", "method": "fairgrad", "teleport": "cost"}


def _cost_weak(method: str) -> dict[str, Any]:
    """``method`` + COST with the weak trigger (Def. 1): the ci scale's COST, where Eq. 3 never fires."""
    return {"label": f"{method}-cost-weak", "method": method, "teleport": "cost",
            "teleport_options": {"trigger": "weak"}}


_COST_WEAK = _cost_weak("fairgrad")
_COST_ABLATED = {row: {"paper": {"label": f"fairgrad-cost-{row}", "method": "fairgrad", "teleport": "cost",
                                 "teleport_options": options},
                       "ci": {"label": f"fairgrad-cost-weak-{row}", "method": "fairgrad", "teleport": "cost",
                              "teleport_options": {"trigger": "weak", **options}}}
                 for row, options in {"no-lt": {"use_invariance": False}, "no-lg": {"use_sharpness": False},
                                      "no-htr": {"htr": False}, "loha": {"adapter": "loha"}}.items()}
_COST_ABLATION_CI = (f"{_MULTIMNIST_CI_TEXT}; both sides with COST's weak trigger (the dominated one never fires "
                     "here)")
_COST_ABLATION_IF_NOT = ("the ci scale is MultiMNIST with the weak trigger, not CityScapes with the dominated one; "
                         "teleports per run and the telemetry are in the result file (`mtlflow ablate cost` gives "
                         "the whole table)")
# hyper-cleaning at ci scale: 200 UL iterations (10 per epoch), enough for every bi-level method to separate clean
# from corrupted samples (docs/research/thesis.md); 300 images for 4 epochs (12 iterations) stayed near chance
_HYPERCLEANING_CI = {"benchmark": "hypercleaning", "data_options": {"n_train": 1000, "n_val": 200, "n_test": 500},
                     "train": {"epochs": 20}}
_HYPERCLEANING_CI_TEXT = ("two pools of shipped digits, 1,000 noisy images each, 20 epochs (200 UL iterations), T = 8, "
                          "3 seeds")
# COST plugged into another base method (Tables 5, 6): at ci scale with the weak trigger, for the reason above
_COST_PLUGIN_CI = f"{_MULTIMNIST_CI_TEXT}; COST with its weak trigger (the dominated one never fires here)"
_COST_PLUGIN_IF_NOT = ("the ci scale is MultiMNIST with the weak trigger, not the paper's benchmark with the dominated "
                       "one; teleports per run are in the row")
# NORMAL's ablation (thesis Table 5.4): the architecture with one choice changed (mtlflow.models.normal's options)
_NORMAL_ABLATED = {row: {"label": f"ls-normal-{row}", "method": "ls", "architecture": "normal",
                         "architecture_options": options}
                   for row, options in {"fixed": {"learn_positions": False}, "exp": {"position_param": "exp"},
                                        "first-order": {"order": 1}, "shared-layers": {"replace_ode": "shared-layers"},
                                        "task-layers": {"replace_ode": "task-layers"}}.items()}

CLAIMS: dict[str, Claim] = {c.key: c for c in [
    Claim(key="cost-toy-escape", paper="COST", source="Fig. 6",
          statement="LS + COST reaches the Pareto set of the toy problem from every start (LS alone does not)",
          paper_text="5 of 5 starts (figure; LS misses some)", paper_value=5.0,
          metric="starts of 5 reaching the Pareto set (distance ≤ 0.1)", rule="at_least", lower_is_better=False,
          runner=run_toy_escape,
          scales={"paper": Scale("the 5 Nash-MTL starts, Adam 1e-3, 35,000 steps, COST's toy defaults, 3 seeds",
                                 {"steps": 35_000, "threads": 1}),
                  "ci": Scale("the same, 20,000 Adam steps, 1 thread", {"steps": 20_000, "threads": 1})},
          if_not="with fewer steps a start may still be on its way; LS + COST escapes the log-valley only by "
                 "changing L₂ (on a 2-D problem the level sets are points)"),
    _cost_gain("cost-cityscapes", "Table 1 (Δm%)", "CityScapes", "4.30 ± 1.3 vs FairGrad 5.18", -0.88,
               {"benchmark": "cityscapes", "data_options": {}, "train": {}},
               "CityScapes (not shipped): --data-dir DIR"),
    _cost_gain("cost-nyuv2", "Table 2 (Δm%)", "NYUv2", "−5.39 ± 0.5 vs FairGrad −4.66", -0.73,
               {"benchmark": "nyuv2", "data_options": {}, "train": {}}, "NYUv2 (not shipped): --data-dir DIR"),
    _cost_gain("cost-celeba", "Table 3 (Δm%)", "CelebA", "0.93 ± 0.2 vs FairGrad-R 1.15", -0.22,
               {"benchmark": "celeba", "data_options": {}, "train": {}},
               "CelebA (not shipped, 1.4 GB): --data-dir DIR"),
    *[_trained(f"cost-ablation-{row}", "COST", source, statement, paper_text, value, "delta_m", _COST_FULL,
               _COST_ABLATED[row]["paper"], _CITYSCAPES, "CityScapes, the benchmark recipe, FairGrad + COST (dominated "
               f"trigger) with and without {component}, 3 seeds", "CityScapes (not shipped): --data-dir DIR",
               _COST_ABLATION_IF_NOT, ci_description=_COST_ABLATION_CI,
               ci_sides={"method": _COST_WEAK, "baseline": _COST_ABLATED[row]["ci"]})
      for row, component, source, statement, paper_text, value in (
          ("no-lt", "L_t", "Table 4 (CityScapes Δm%; rows reconstructed from Sec. 5.2's text)",
           "full COST (L_t, L_g, HTR) has a lower Δm% than COST without the loss-invariance term L_t",
           "4.30 vs w/o L_t 381.86", -377.56),
          ("no-lg", "L_g", "Table 4 (CityScapes Δm%; rows reconstructed from Sec. 5.2's text)",
           "full COST has a lower Δm% than COST without the gradient-maximisation term L_g", "4.30 vs w/o L_g 7.90",
           -3.60),
          ("no-htr", "HTR", "Table 4 (CityScapes Δm%) / Sec. 5.2",
           "full COST has a lower Δm% than COST without historical trajectory reuse (HTR)", "4.30 vs w/o HTR 4.65",
           -0.35))],
    _trained("cost-trigger-dominated", "COST", "Table 7 (CityScapes Δm%)",
             "COST triggered by dominated conflict (Eq. 3) has a lower Δm% than triggered by weak conflict (Def. 1)",
             "COST-dominated 4.30 vs COST-weak 6.94", -2.64, "delta_m", _COST_FULL, _COST_WEAK, _CITYSCAPES,
             "CityScapes, the benchmark recipe, FairGrad + COST with either trigger, 3 seeds",
             "CityScapes (not shipped): --data-dir DIR",
             "the dominated trigger never fires on MultiMNIST (the dominated side is FairGrad's run); the ci scale "
             "is not CityScapes",
             ci_description=_MULTIMNIST_CI_TEXT),
    _trained("cost-adapter-lora", "COST", "Table 8 (CityScapes Δm%)",
             "COST with a LoRA adapter has a lower Δm% than with LoHa (OFT, the table's third row, is not run: "
             "peft's OFT is wrong on Conv2d layers)",
             "COST-LoRA 4.30 vs COST-LoHa 7.10", -2.80, "delta_m", _COST_FULL, _COST_ABLATED["loha"]["paper"],
             _CITYSCAPES, "CityScapes, the benchmark recipe, FairGrad + COST (dominated trigger) with a LoRA or a "
             "LoHa adapter (rank 5), 3 seeds", "CityScapes (not shipped): --data-dir DIR", _COST_ABLATION_IF_NOT,
             ci_description=_COST_ABLATION_CI,
             ci_sides={"method": _COST_WEAK, "baseline": _COST_ABLATED["loha"]["ci"]}),
    *[_trained(key, "COST", source, statement, paper_text, value, "delta_m",
               {"label": f"{base}-cost", "method": base, "teleport": "cost"}, {"label": base, "method": base},
               common, f"{benchmark}, the benchmark recipe, COST's defaults (dominated trigger), 3 seeds",
               f"{benchmark} (not shipped): --data-dir DIR", _COST_PLUGIN_IF_NOT + shares,
               ci_description=_COST_PLUGIN_CI,
               ci_sides={"method": _cost_weak(base), "baseline": {"label": base, "method": base}})
      for key, base, source, benchmark, common, statement, paper_text, value, shares in (
          ("cost-plugin-cagrad", "cagrad", "Table 5 (CityScapes Δm%)", "CityScapes", _CITYSCAPES,
           "COST plugged into CAGrad lowers CAGrad's Δm% on CityScapes", "CAGrad + COST 8.37 vs CAGrad 11.58", -3.21,
           ""),
          ("cost-plugin-nashmtl", "nashmtl", "Table 5 (CityScapes Δm%)", "CityScapes", _CITYSCAPES,
           "COST plugged into Nash-MTL lowers Nash-MTL's Δm% on CityScapes (the paper's Nash-R: FAMO's "
           "implementation; mtlflow's nashmtl is Navon et al.'s algorithm)", "Nash-R + COST 7.15 vs Nash-R 9.89",
           -2.74, ""),
          ("cost-plugin-cagrad-nyuv2", "cagrad", "Table 6 (NYUv2 Δm%)", "NYUv2", _NYUV2,
           "COST plugged into CAGrad lowers CAGrad's Δm% on NYUv2", "CAGrad + COST −1.61 vs CAGrad 0.29", -1.90,
           " (it shares the runs of cost-plugin-cagrad)"))],
    Claim(key="cost-time-overhead", paper="COST", source="Sec. 5 / Fig. 11 (CelebA)",
          statement="COST costs about 30 % more time per epoch than its base method",
          paper_text="≈ +30 % per epoch (CelebA, figure only)", paper_value=0.30,
          metric="epoch time of FairGrad + COST / FairGrad − 1 (trigger `always`, one teleport per epoch)",
          rule="at_most", lower_is_better=True, runner=run_cost_overhead,
          scales={"paper": Scale("CelebA CNN, 40 tasks, full width, 64×64, batch 256, 636-step epochs, 3 repeats",
                                 {"method": "fairgrad", "tasks": 40, "width": 64, "image_size": 64,
                                  "batch_size": 256, "epoch_steps": 636, "epochs": 1}),
                  "ci": Scale("CelebA CNN, 10 tasks, width 8, 16×16, batch 16, 20-step epochs, 3 repeats, 1 thread",
                              {"method": "fairgrad", "tasks": 10, "width": 8, "image_size": 16, "batch_size": 16,
                               "epoch_steps": 20, "epochs": 1, "threads": 1})},
          if_not="a short epoch makes one teleport a larger share; a shared CPU adds noise"),
    Claim(key="cost-mechanism", paper="COST", source="Sec. 4.2, Eqs. 7–11, Fig. 5(b)",
          statement="at a dominated-conflict trigger (Eq. 3) the teleport keeps every task loss and raises the "
                    "sharpness L_g it maximises",
          paper_text="L_t stays ≈ 0 while L_g rises over the LoRA steps (figure only)", paper_value=1.0,
          metric="share of the trigger events whose teleport (default budget) raises L_g (Eq. 9, fixed ε) by ≥ 10 % "
                 "with every task loss within 2 %",
          rule="at_least", lower_is_better=False, runner=run_cost_mechanism,
          scales={"paper": Scale("CelebA CNN, 40 synthetic attributes, full width, 64×64, batch 256, FairGrad, "
                                 "5 trigger events per seed forked 50 steps, 3 seeds",
                                 {"tasks": 40, "width": 64, "image_size": 64, "samples": 8192, "batch_size": 256,
                                  "events": 5, "max_steps": 2000, "horizon": 50, "threads": None,
                                  "budgets": [[8, 0.005], [32, 0.005], [128, 0.005], [8, 0.02], [32, 0.001]]}),
                  "ci": Scale("CelebA CNN, 40 synthetic attributes, width 8, 16×16, batch 32, FairGrad, 2 trigger "
                              "events per seed forked 8 steps, 3 seeds, 1 thread",
                              {"tasks": 40, "width": 8, "image_size": 16, "samples": 512, "batch_size": 32,
                               "events": 2, "max_steps": 200, "horizon": 8, "threads": 1,
                               "budgets": [[8, 0.005], [32, 0.005], [8, 0.02], [8, 0.002], [32, 0.001]]})},
          if_not="L_g rises at every trigger, but the default adapter lr changes some task loss by slightly more "
                 "than the tolerance; smaller adapter lrs achieve both (the budget sweep in the result file); "
                 "random attributes on a small CNN, not CelebA"),
    _trained("palora-multimnist-accuracy", "PaLoRA", "Table 4 (MultiMNIST)",
             "PaLoRA's mean accuracy on MultiMNIST is higher than LS's",
             "96.55 / 95.39 vs LS 95.47 / 94.45 (mean +1.01 points)", 1.01, "accuracy", _PALORA, _LS,
             _MULTIMNIST_PAPER, "MultiMNIST with the real MNIST digits (10,000 images), the recipe's epochs, r = 1, "
             "3 seeds; PaLoRA's table row = the merged model at λ = 1/T", None,
             "the two tasks hardly conflict, so one front model and LS differ by less than the seed spread"),
    Claim(key="palora-multimnist-hv", paper="PaLoRA", source="Fig. 3a (MultiMNIST HV vs memory)",
          statement="PaLoRA's front has a higher hypervolume than PaMaL's",
          paper_text="higher than PaMaL at 1/50 of its memory (figure only)", paper_value=None,
          metric="hypervolume of the test front (error objectives)", rule="gain", lower_is_better=False,
          runner=run_palora_front,
          scales={"paper": Scale("MultiMNIST, real digits, the recipe, 3 seeds; PaMaL = PaLoRA's `dirichlet` "
                                 "schedule with 5 rays (mtlflow has no PaMaL weight ensembles)",
                                 {**_MULTIMNIST_PAPER, "metric": "hypervolume", "method": _PALORA,
                                  "baseline": _PAMAL}),
                  "ci": Scale("MultiMNIST, 2,000 shipped-digit images, 40 epochs (320 steps), 3 seeds, same baseline",
                              {**_MULTIMNIST_CI, "metric": "hypervolume", "method": _PALORA, "baseline": _PAMAL})},
          if_not="the baseline is PaMaL's sampling on PaLoRA's adapters, not PaMaL's weight ensembles"),
    Claim(key="palora-front-monotone", paper="PaLoRA", source="Figs. 12–13 (Spearman ρ)",
          statement="along the learned front more preference for a task gives it less error (ρ < 0 for every task)",
          paper_text="monotone fronts (figures only)", paper_value=0.0,
          metric="largest over tasks of Spearman ρ(preference, test error) on the front's grid", rule="at_most",
          lower_is_better=True, runner=run_palora_front, strict=True,
          scales={"paper": Scale("MultiMNIST, real digits, the recipe, 3 seeds",
                                 {**_MULTIMNIST_PAPER, "metric": "spearman", "method": _PALORA}),
                  "ci": Scale("MultiMNIST, 2,000 shipped-digit images, 40 epochs (320 steps), 3 seeds",
                              {**_MULTIMNIST_CI, "metric": "spearman", "method": _PALORA})},
          if_not="on 2,000 images the front may not be formed yet (per-task ρ per seed in the result file); "
                 "the one-seed full-scale front of docs/research/palora.md trades the two digits the expected way"),
    _palora_overhead("palora-overhead-cityscapes", "cityscapes", 4.2, "Table 1 / Sec. 5 (CityScapes)"),
    _palora_overhead("palora-overhead-nyuv2", "nyuv2", 6.3, "Table 2 (NYUv2)"),
    _trained("palora-multimnist-accuracy-pamal", "PaLoRA", "Table 4 (MultiMNIST)",
             "PaLoRA's mean accuracy on MultiMNIST is higher than PaMaL's",
             "96.55 / 95.39 vs PaMaL 96.17 / 95.32 (mean +0.225 points)", 0.225, "accuracy", _PALORA, _PAMAL,
             _MULTIMNIST_PAPER, "MultiMNIST with the real MNIST digits (10,000 images), the recipe's epochs, r = 1, "
             "3 seeds; each table row = the merged model at λ = 1/T; PaMaL = PaLoRA's `dirichlet` schedule with 5 "
             "rays (mtlflow has no PaMaL weight ensembles)", None,
             "the baseline is PaMaL's sampling on PaLoRA's adapters, not PaMaL's weight ensembles; the paper's "
             "difference (0.2 points) is below the seed spread at ci scale"),
    Claim(key="ldcmtl-step-time", paper="LDC-MTL", source="Sec. 5.1 (Fig. 1 / Table 1 cost class)",
          statement="an LDC-MTL step costs at most 1.11 × an LS step",
          paper_text="≤ 1.11 × LS", paper_value=1.11, metric="median step time / LS's (same process)",
          rule="at_most", lower_is_better=True, runner=run_step_ratio,
          scales={"paper": Scale("CelebA CNN, 40 tasks, full width, 64×64, batch 256, 10 timed steps, 3 repeats",
                                 {"method": "ldcmtl", "tasks": 40, "width": 64, "image_size": 64,
                                  "batch_size": 256, "steps": 10, "warmup": 3}),
                  "ci": Scale("CelebA CNN, 40 tasks, width 16, 32×32, batch 16, median of 60 timed steps, 3 "
                              "repeats, 1 thread",
                              {"method": "ldcmtl", "tasks": 40, "width": 16, "image_size": 32, "batch_size": 16,
                               "steps": 60, "warmup": 5, "threads": 1})},
          if_not="timing noise of a shared CPU; the router's forward is a larger share of a small model's step"),
    _trained("ldcmtl-celeba", "LDC-MTL", "Table 1 (CelebA Δm%)", "LDC-MTL has a lower Δm% than LS on CelebA",
             "−1.31 vs LS 4.15", -5.46, "delta_m", _LDC, _LS,
             {"benchmark": "celeba", "data_options": {}, "train": {}}, "CelebA, 40 tasks, the recipe, 3 seeds",
             "CelebA (not shipped, 1.4 GB): --data-dir DIR", "the ci scale is MultiMNIST with 2 tasks, not CelebA"),
    _trained("ldcmtl-qm9", "LDC-MTL", "Table 1 (QM9 Δm%)", "LDC-MTL has a lower Δm% than LS on QM9",
             "49.5 vs LS 177.6", -128.1, "delta_m", _LDC, _LS,
             {"benchmark": "qm9", "data_options": {}, "train": {}}, "QM9, 11 targets, the recipe, 3 seeds",
             None, "the ci scale is MultiMNIST with 2 tasks, not QM9"),
    _trained("ldcmtl-cityscapes", "LDC-MTL", "Table 2 (Cityscapes Δm%)", "LDC-MTL has a lower Δm% than LS on "
             "Cityscapes", "−0.57 vs LS 22.60", -23.17, "delta_m", _LDC, _LS, _CITYSCAPES,
             "Cityscapes, SegNet-MTAN, the recipe (200 epochs, batch 8), 3 seeds",
             "CityScapes (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST with 2 tasks, not Cityscapes (it shares the runs of ldcmtl-celeba)"),
    _trained("ldcmtl-nyuv2", "LDC-MTL", "Table 1 / Table 7 (NYU-v2 Δm%)", "LDC-MTL has a lower Δm% than LS on "
             "NYU-v2", "−4.40 ± 0.74 vs LS 5.59", -9.99, "delta_m", _LDC, _LS, _NYUV2,
             "NYU-v2, SegNet-MTAN, the recipe (200 epochs, batch 2), 3 seeds", "NYUv2 (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST with 2 tasks, not NYU-v2 (it shares the runs of ldcmtl-celeba)"),
    _trained("forum-hypercleaning", "Thesis ch. 3 (MOML/FORUM)", "Table 3.2",
             "FORUM cleans better than MOML: higher mean test accuracy on the two hyper-cleaning tasks",
             "FORUM 90.81 / 82.07 vs MOML 88.64 / 80.64 (mean +1.80 points)", 1.80, "accuracy",
             {"label": "forum", "method": "forum"}, {"label": "moml", "method": "moml"},
             {"benchmark": "hypercleaning", "data_options": {"n_train": 5000, "n_val": 1000, "n_test": 1500,
                                                             "mnist_dir": "../shared/realdata/mnist"},
              "train": {"epochs": 24}},
             "two MNIST pools (Fashion-MNIST is not offline; --data-option fashion_dir=DIR), 5,000 noisy images "
             "each, T = 64, 1,200 UL iterations, 3 seeds", None,
             "MOML peaks mid-run and the ledger reports the last epoch (the thesis selects on a second "
             "validation set)",
             ci_common=_HYPERCLEANING_CI, ci_description=_HYPERCLEANING_CI_TEXT,
             ci_sides={"method": {"label": "forum-t8", "method": "forum", "hparams": {"inner_steps": 8}},
                       "baseline": {"label": "moml-t8", "method": "moml", "hparams": {"inner_steps": 8}}}),
    _trained("forum-hypercleaning-moco", "Thesis ch. 3 (MOML/FORUM)", "Table 3.2",
             "FORUM cleans better than MoCo (MOML with MoCo as the MOO solver): higher mean test accuracy on the two "
             "hyper-cleaning tasks",
             "FORUM 90.81 / 82.07 vs MoCo 88.05 / 80.94 (mean +1.945 points)", 1.945, "accuracy",
             {"label": "forum", "method": "forum"},
             {"label": "moml-moco", "method": "moml", "hparams": {"upper_solver": "moco"}},
             {"benchmark": "hypercleaning", "data_options": {"n_train": 5000, "n_val": 1000, "n_test": 1500,
                                                             "mnist_dir": "../shared/realdata/mnist"},
              "train": {"epochs": 24}},
             "two MNIST pools (Fashion-MNIST is not offline; --data-option fashion_dir=DIR), 5,000 noisy images "
             "each, T = 64, 1,200 UL iterations, 3 seeds", None,
             "the ci scale unrolls T = 8 steps on 300 images for 4 epochs; the ledger reports the last epoch (the "
             "thesis selects on a second validation set)",
             ci_common=_HYPERCLEANING_CI, ci_description=_HYPERCLEANING_CI_TEXT,
             ci_sides={"method": {"label": "forum-t8", "method": "forum", "hparams": {"inner_steps": 8}},
                       "baseline": {"label": "moml-moco-t8", "method": "moml",
                                    "hparams": {"inner_steps": 8, "upper_solver": "moco"}}}),
    Claim(key="asmg-synthetic", paper="Thesis ch. 4 (ASMG)", source="Sec. 4.6.1, Figs. 4.1–4.3",
          statement="ASMG reaches ℰ ≤ 1e-4 on all three synthetic problems for N = 10, 50, 100 (d = 100)",
          paper_text="≈ 1e-4 on every problem and N (figures only)", paper_value=1.0,
          metric="share of (problem, N) cells reaching ℰ ≤ 1e-4", rule="at_least", lower_is_better=False,
          runner=run_asmg_table,
          scales={"paper": Scale("d = 100, N ∈ {10, 50, 100}, 8,000 iterations, β = 0.1, 3 seeds",
                                 {"dim": 100, "sample_sizes": [10, 50, 100], "iterations": 8000, "target": 1e-4}),
                  "ci": Scale("d = 20, N ∈ {10, 50, 100}, 3,000 iterations, β = 0.1, 3 seeds, 1 thread",
                              {"dim": 20, "sample_sizes": [10, 50, 100], "iterations": 3000, "target": 1e-4,
                               "threads": 1})},
          if_not="on the ellipsoid–Rastrigin with N = 10 a seed can stay in a Rastrigin local minimum"),
    _trained("normal-office31", "Thesis ch. 5 (NORMAL)", "Table 5.1 (Office-31 average)",
             "NORMAL's average accuracy on Office-31 is higher than EW's (LS)", "94.80 vs EW 93.82", 0.98,
             "accuracy", _NORMAL, _LS, {"benchmark": "office31", "data_options": {}, "train": {}},
             "Office-31, the benchmark's ResNet-18 backbone and recipe, 3 seeds",
             "Office-31 (not shipped): --data-dir DIR", "the ci scale is MultiMNIST, not Office-31"),
    _trained("normal-celeba", "Thesis ch. 5 (NORMAL)", "Table 5.3 (CelebA average)",
             "NORMAL's average accuracy over CelebA's 40 tasks is higher than EW's (LS)", "91.00 vs EW 90.78", 0.22,
             "accuracy", _NORMAL, _LS, {"benchmark": "celeba", "data_options": {}, "train": {}},
             "CelebA, 40 tasks, the recipe, 3 seeds", "CelebA (not shipped, 1.4 GB): --data-dir DIR",
             "the ci scale is MultiMNIST with 2 tasks, not CelebA"),
    _trained("normal-officehome", "Thesis ch. 5 (NORMAL)", "Table 5.1 (Office-Home average)",
             "NORMAL's average accuracy on Office-Home is higher than EW's (LS)", "80.08 vs EW 78.59", 1.49,
             "accuracy", _NORMAL, _LS, {"benchmark": "officehome", "data_options": {}, "train": {}},
             "Office-Home, the benchmark's ResNet-18 backbone and recipe, 3 seeds",
             "Office-Home (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST, not Office-Home (it shares the runs of normal-office31)"),
    _trained("normal-nyuv2", "Thesis ch. 5 (NORMAL)", "Table 5.2 (NYUv2 Δ)",
             "NORMAL improves on EW (LS) on NYUv2's three tasks: a lower Δm% against single-task runs (the thesis' "
             "Δ_p is against EW, higher better: NORMAL − EW in Δm% ≈ −Δ_p)",
             "Δ_p +1.33 % vs EW 0 %", -1.33, "delta_m", _NORMAL, _LS, _NYUV2,
             "NYUv2, the benchmark's SegNet-MTAN and recipe (the thesis uses DeepLabV3+ on a dilated ResNet-18, "
             "which mtlflow lacks), 3 seeds", "NYUv2 (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST, not NYUv2 (it shares the runs of normal-office31)"),
    _trained("normal-ablation-fixed-positions", "Thesis ch. 5 (NORMAL)", "Table 5.4 (Office-31 average)",
             "learned task positions beat a constant position shared by all tasks (p = 1)",
             "NORMAL 94.80 vs constant and identical p_i 93.95", 0.85, "accuracy", _NORMAL,
             _NORMAL_ABLATED["fixed"], _OFFICE31, "Office-31, the benchmark's ResNet-18 backbone and recipe, "
             "NORMAL with learned vs constant p_i = 1, 3 seeds", "Office-31 (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST with 40 epochs, where the positions move little from their start (p = 1)"),
    _trained("normal-ablation-different-positions", "Thesis ch. 5 (NORMAL)", "Table 5.4 (Office-31 average)",
             "learned task positions beat constant but different positions",
             "NORMAL 94.80 vs constant but different p_i 94.04", 0.76, "accuracy", _NORMAL,
             {"label": "ls-normal-fixed-1-1.25-1.5", "method": "ls", "architecture": "normal",
              "architecture_options": {"learn_positions": False, "initial_positions": [1.0, 1.25, 1.5]}},
             _OFFICE31, "Office-31, the recipe, NORMAL with learned p_i vs constant p = (1, 1.25, 1.5) (the thesis "
             "picks the best of the 6 permutations of {1, 1.25, 1.5}; this is one of them), 3 seeds",
             "Office-31 (not shipped): --data-dir DIR",
             "the ci scale is MultiMNIST with 40 epochs and one permutation (1, 1.25), not Office-31",
             ci_sides={"method": _NORMAL,
                       "baseline": {"label": "ls-normal-fixed-1-1.25", "method": "ls", "architecture": "normal",
                                    "architecture_options": {"learn_positions": False,
                                                             "initial_positions": [1.0, 1.25]}}}),
    _trained("normal-ablation-exp-positions", "Thesis ch. 5 (NORMAL)", "Table 5.4 (Office-31 average)",
             "unconstrained task positions beat positive ones (p_i = e^{v_i})",
             "NORMAL 94.80 vs p_i = e^{v_i} 94.00", 0.80, "accuracy", _NORMAL, _NORMAL_ABLATED["exp"], _OFFICE31,
             "Office-31, the recipe, NORMAL with p_i vs p_i = e^{v_i}, 3 seeds",
             "Office-31 (not shipped): --data-dir DIR", "the ci scale is MultiMNIST with 40 epochs, not Office-31"),
    _trained("normal-ablation-first-order", "Thesis ch. 5 (NORMAL)", "Table 5.4 (Office-31 average)",
             "the second-order (heavy-ball) ODE beats a first-order neural ODE",
             "NORMAL 94.80 vs first-order NODE 94.01", 0.79, "accuracy", _NORMAL, _NORMAL_ABLATED["first-order"],
             _OFFICE31, "Office-31, the recipe, NORMAL with the heavy-ball vs a first-order ODE, 3 seeds",
             "Office-31 (not shipped): --data-dir DIR", "the ci scale is MultiMNIST with 40 epochs, not Office-31"),
    *[_trained(f"normal-ablation-{row}", "Thesis ch. 5 (NORMAL)", "Table 5.4 (Office-31 average)",
               f"the ODE beats plain {kind} layers with the same number of parameters in its place",
               f"NORMAL 94.80 vs + {kind} layers (parameter-matched) {value:.2f}", round(94.80 - value, 2), "accuracy",
               _NORMAL, _NORMAL_ABLATED[row], _OFFICE31, f"Office-31, the recipe, NORMAL vs {layout} "
               "(mtlflow.models.normal, replace_ode), 3 seeds", "Office-31 (not shipped): --data-dir DIR",
               "the ci scale is MultiMNIST with 40 epochs, not Office-31; the thesis gives no layout for the layers")
      for row, kind, value, layout in (
          ("shared-layers", "task-shared", 93.28, "the ODE's u and g layers as plain shared layers"),
          ("task-layers", "task-specific", 93.09, "one stack of plain layers per task, together as many parameters "
                                                  "as the ODE"))],
]}


def get(key: str) -> Claim:
    if key not in CLAIMS:
        raise InvalidParameterError(f"unknown claim {key!r}; valid: {', '.join(CLAIMS)}")
    return CLAIMS[key]
