"""The seed papers' headline claims, each with the configuration that measures it and the rule that judges it.

One :class:`Claim` per headline result of COST (Zhou et al., NeurIPS 2025), PaLoRA (Dimitriadis et al., ICLR
2025), LDC-MTL (2025) and Ye's thesis (MOML/FORUM ch. 3, ASMG ch. 4, NORMAL ch. 5): the paper's number with its
table or figure, the configuration at ``paper`` scale and at ``ci`` scale (data, model, epochs, seeds, method
settings) and the function that measures it. Every runner calls an existing experiment or job
(:mod:`mtlflow.experiments.trajectories`, :mod:`~mtlflow.experiments.asmg_synthetic`, :mod:`~mtlflow.experiments.bench`,
:func:`mtlflow.jobs.train`, :func:`mtlflow.jobs.evaluate`, :func:`mtlflow.jobs.palora.overhead_table`): nothing here
trains by itself. :func:`reproduce` runs one claim and writes its result file (every seed's value, the mean and
95 % interval of :mod:`mtlflow.metrics.intervals`, the verdict, scale, date, hardware, command). A runner is a
:class:`SeedwiseRunner`: :func:`measure_seed` runs one seed and :func:`combine_seeds` turns the seeds into the
result, which is what :func:`reproduce` does one seed after the other and the ``reproduce`` pipeline does with a
task per seed (``pipelines/reproduce.py``, :mod:`mtlflow.experiments.claim_pipeline`), so both write the same
file. :func:`ledger_markdown` renders ``docs/research/claims.md`` from the stored result files only.

**Verdicts** (:func:`judge`), by the claim's rule:

* ``at_most`` / ``at_least`` a bound (a cost ratio, a count): *reproduced* when the whole 95 % interval of the
  mean is on the paper's side of the bound, *not reproduced* when the whole of it is on the other side,
  *within interval* when the bound lies inside it (with one value and no interval: the mean decides);
* ``equals`` a number (up to the paper's rounding, ``tolerance``): *reproduced* when the mean is within the
  tolerance, *within interval* when the paper's number is inside the 95 % interval, else *not reproduced*;
* ``gain`` over a baseline trained with the same seeds: *reproduced* when the interval of the difference
  (method − baseline, stratified bootstrap) excludes 0 on the paper's side, *within interval* when it holds 0
  and the paper's difference, else *not reproduced*.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.intervals import compare, format_estimate, mean_interval

SCALES = ("paper", "ci")
REPRODUCED, WITHIN, NOT_REPRODUCED = "reproduced", "within interval", "not reproduced"
RULES = ("at_most", "at_least", "equals", "gain")
#: where `mtlflow reproduce` stores result files and writes the ledger (relative to the repository root)
RESULTS_DIR = Path("docs/research/claims")
LEDGER_PATH = Path("docs/research/claims.md")
#: where the runs a claim trains are kept (finished ones are reused by a re-run)
WORK_DIR = Path("runs/claims")
RESULT_SCHEMA = 1


@dataclass(frozen=True)
class Scale:
    """One scale of a claim: what it runs, in words, and the runner's configuration."""

    description: str
    config: Mapping[str, Any]
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class Claim:
    """One headline claim: the paper's number and where it is printed, the rule that judges a measurement
    against it, the runner that measures it and its configuration at each scale."""

    key: str
    paper: str
    source: str            # table / figure / section of the paper
    statement: str
    paper_text: str        # the paper's number as printed
    paper_value: float | None  # the bound, the number, or the claimed difference (gain); None: qualitative
    metric: str            # what one seed's value is
    rule: str
    lower_is_better: bool
    runner: Callable[[Mapping[str, Any], Sequence[int], "RunContext"], dict[str, Any]]
    scales: Mapping[str, Scale]
    data: str | None = None  # data the project cannot ship: what it is and the option that points at it
    tolerance: float = 0.0
    if_not: str = ""       # the likely reason when the verdict is not "reproduced"
    no_seeds: str = ""     # why a claim has one value (a deterministic count), if it has
    strict: bool = False   # at_most / at_least: the bound itself is on the wrong side (ρ < 0, not ρ ≤ 0)

    def command(self, scale: str) -> str:
        return f"mtlflow reproduce {self.key} --scale {scale}"


@dataclass
class RunContext:
    """Where a runner may write intermediate runs, its device and whether it prints progress."""

    work_dir: Path
    device: str = "cpu"
    progress: bool = True
    data_options: Mapping[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        if self.progress:
            print(f"reproduce: {text}", flush=True)


# --------------------------------------------------------------------------------------------- runners


@dataclass(frozen=True)
class SeedwiseRunner:
    """A runner in two steps, so that each seed can run as a task of its own (the ``reproduce`` pipeline's loop):
    ``measure(config, seed, ctx)`` runs one seed and returns its part (JSON: a task's output artifact), and
    ``combine(config, parts, ctx)`` turns the parts of every seed, in seed order, into ``{values, baseline?,
    details}``. A seed's value never depends on another seed's runs except where ``combine`` says so (Δm%'s
    references are the mean over every seed's single-task runs), so the seeds can run anywhere. Called with all
    seeds it runs them one after the other: what `mtlflow reproduce` does."""

    measure: Callable[[Mapping[str, Any], int, "RunContext"], dict[str, Any]]
    combine: Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], "RunContext"], dict[str, Any]]

    def __call__(self, config: Mapping[str, Any], seeds: Sequence[int], ctx: "RunContext") -> dict[str, Any]:
        return self.combine(config, [self.measure(config, seed, ctx) for seed in seeds], ctx)


def _toy_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.trajectories import run_method_with_cost

    method = config.get("method", "ls")
    with _torch_threads(config.get("threads")):
        result, teleports = run_method_with_cost(method, int(config["steps"]), seed=seed,
                                                 options=config.get("teleport_options"))
    ctx.say(f"{method}+cost seed {seed}: {result.reached}/{len(result.distances)} ({len(teleports)} teleports)")
    return {"value": float(result.reached), "detail": {"seed": seed, "reached": result.reached,
                                                       "teleports": len(teleports), "distances": result.distances,
                                                       "seconds": result.seconds}}


def _toy_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.trajectories import run_method

    method = config.get("method", "ls")
    with _torch_threads(config.get("threads")):
        base = run_method(method, steps=int(config["steps"]))
    ctx.say(f"{method}: {base.reached}/{len(base.distances)} starts reach the Pareto set ({base.seconds:.1f} s)")
    return {"values": [p["value"] for p in parts],
            "details": {"base_reached": base.reached, "base_distances": base.distances,
                        "per_seed": [p["detail"] for p in parts]}}


#: COST Fig. 6: starts (of 5) from which LS + COST reaches the Pareto set, one value per seed (COST's teleports
#: are seeded; LS alone is deterministic and run once, when the seeds are combined, as the baseline)
run_toy_escape = SeedwiseRunner(_toy_seed, _toy_combine)


def _asmg_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's share of (problem, N) cells whose ℰ reaches the target, and the cells."""
    from mtlflow.benchmarks.asmg_synthetic import PROBLEMS
    from mtlflow.experiments.asmg_synthetic import METHODS, _reached, run_one

    problems = list(config.get("problems", PROBLEMS))
    target = float(config["target"])
    reached, cells = 0, []
    with _torch_threads(config.get("threads")):
        for problem in problems:
            for n in config["sample_sizes"]:
                run = run_one(problem, int(n), seed, int(config["dim"]), int(config["iterations"]),
                              float(config.get("beta", 0.1)), config.get("update", "normalized"),
                              METHODS[config.get("method", "asmg")], 25, float(config.get("stop_at", 1e-6)))
                at = _reached(run["curve"], target)
                reached += at is not None
                cells.append({"seed": seed, "problem": problem, "n_samples": n, "final": run["final"],
                              "iterations_to_target": at, "seconds": run["seconds"]})
                ctx.say(f"asmg {problem} N={n} seed {seed}: ℰ = {run['final']:.2e}")
    return {"value": reached / (len(problems) * len(config["sample_sizes"])), "cells": cells}


def _asmg_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    return {"values": [p["value"] for p in parts], "details": {"cells": [c for p in parts for c in p["cells"]]}}


#: Thesis Sec. 4.6.1: per seed, the share of (problem, N) cells whose ℰ reaches the target
run_asmg_table = SeedwiseRunner(_asmg_seed, _asmg_combine)


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's CPU threads set to ``threads`` for the block (None: unchanged); small problems run faster on one."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _repeats(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    """The timing runners' combination: one value and one row per repeat (seed)."""
    return {"values": [p["value"] for p in parts], "details": {"repeats": [p["repeat"] for p in parts]}}


def _step_ratio_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    import torch

    from mtlflow.experiments.bench import run_bench

    method = config["method"]
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        summary = run_bench(tmp, [method], [int(config["tasks"])], steps=int(config["steps"]),
                            warmup=int(config["warmup"]), batch_size=int(config["batch_size"]),
                            width=int(config["width"]), image_size=int(config["image_size"]),
                            device=ctx.device, engine_rows=[], threads=config.get("threads"), progress=False)
    row = next(r for r in summary["methods"] if r["method"] == method)
    ls = next(r for r in summary["methods"] if r["method"] == "ls")
    if row["ratio_to_ls"] is None:
        raise InvalidParameterError(f"{method} could not be timed: {row['status']}")
    ctx.say(f"{method} repeat {seed}: {row['ratio_to_ls']:.3f} x LS")
    return {"value": float(row["ratio_to_ls"]),
            "repeat": {"seed": seed, "step_seconds": row["step_seconds_median"],
                       "ls_step_seconds": ls["step_seconds_median"], "ratio_to_ls": row["ratio_to_ls"]}}


#: median step time of ``method`` over LS's (`mtlflow bench`), one repeat per seed
run_step_ratio = SeedwiseRunner(_step_ratio_seed, _repeats)


def _cost_overhead_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    import torch

    from mtlflow.experiments.bench import run_bench

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        summary = run_bench(tmp, [config["method"]], [int(config["tasks"])], steps=1, warmup=0,
                            batch_size=int(config["batch_size"]), width=int(config["width"]),
                            image_size=int(config["image_size"]), device=ctx.device, engine_rows=[],
                            threads=config.get("threads"), progress=False, teleport="cost",
                            teleport_options=dict(config.get("teleport_options", {})),
                            cost_epoch_steps=int(config["epoch_steps"]), cost_epochs=int(config["epochs"]))
    row = next(r for r in summary["cost_overhead"] if r["method"] == config["method"])
    if "error" in row:
        raise InvalidParameterError(f"COST's overhead could not be measured: {row['error']}")
    ctx.say(f"cost overhead repeat {seed}: {100 * row['overhead']:+.1f} %")
    return {"value": float(row["overhead"]),
            "repeat": {k: row[k] for k in ("base_epoch_seconds", "cost_epoch_seconds", "overhead",
                                           "accounted_overhead", "teleports_per_epoch", "teleport_seconds")}}


#: COST's overhead per epoch over its base method (`mtlflow bench --teleport cost`), one repeat per seed
run_cost_overhead = SeedwiseRunner(_cost_overhead_seed, _repeats)


def _cost_mechanism_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.cost_mechanism import claim_seed

    return claim_seed(config, seed, ctx)


def _cost_mechanism_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                            ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.cost_mechanism import claim_combine

    return claim_combine(config, parts, ctx)


#: COST's teleport at its trigger steps, forked against no teleport (:mod:`mtlflow.experiments.cost_mechanism`)
run_cost_mechanism = SeedwiseRunner(_cost_mechanism_seed, _cost_mechanism_combine)


def _palora_overhead_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow import benchmarks
    from mtlflow.jobs.palora import overhead_table

    bench = benchmarks.build(config["benchmark"], **dict(config.get("data_options", {})))
    report = overhead_table(bench, None, int(config["rank"]), config["layers"], config["factorization"])
    ctx.say(f"palora overhead on {config['benchmark']}: {report['overhead_percent']:.3f} %")
    return {"value": float(report["overhead_percent"]),
            "details": {k: report[k] for k in ("adapter_parameters", "model_parameters", "rank", "factorization")}}


def _palora_overhead_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                             ctx: RunContext) -> dict[str, Any]:
    return {"values": [p["value"] for p in parts], "details": parts[0]["details"]}


#: PaLoRA's adapter parameters as a percentage of the plain model's (a count: no training, one seed)
run_palora_overhead = SeedwiseRunner(_palora_overhead_seed, _palora_overhead_combine)


def _train(ctx: RunContext, config: Mapping[str, Any], spec: Mapping[str, Any], seed: int,
           **extra: Any) -> tuple[Path, dict[str, Any]]:
    """One run of ``spec`` (``label``, ``method``, optional ``hparams`` and any other training option, e.g.
    ``teleport``, ``architecture``) through :func:`mtlflow.jobs.train` under ``work_dir/runs``; a finished run
    is reused, an interrupted one resumed."""
    from mtlflow import jobs

    run = ctx.work_dir / "runs" / f"{spec['label']}-s{seed}"
    done = (run / "run.json").is_file() and atomic.read_json(run / "run.json").get("status") == "completed"
    if not done:
        ctx.say(f"training {run.name}")
        options = {k: v for k, v in spec.items() if k not in ("label", "method", "hparams")}
        jobs.train(None, run, method=spec["method"], seed=seed, hparams=spec.get("hparams"), resume=run.exists(),
                   progress=False, benchmark=config["benchmark"],
                   data_options={**dict(config.get("data_options", {})), **dict(ctx.data_options)},
                   device=ctx.device, **dict(config.get("train", {})), **options, **extra)
    return run, jobs.read_run(run)


def _score(record: Mapping[str, Any], metric: str, refs: Mapping[str, Any] | None) -> float:
    from mtlflow.metrics.scoring import delta_m

    final = record["metrics"]["final"]["test"]
    if metric == "delta_m":
        return float(delta_m(final, refs, record["metrics"]["metric_specs"]))
    primary = record["metrics"]["primary_metrics"]
    return 100.0 * statistics.fmean(final[t][primary[t]] for t in primary)


def _trained_gain_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's runs: the single-task LS references (for Δm%), ``method``'s and ``baseline``'s, as records."""
    from mtlflow import benchmarks

    references = []
    if config["metric"] == "delta_m":
        tasks = benchmarks.build(config["benchmark"], **{**dict(config.get("data_options", {})),
                                                         **dict(ctx.data_options)}).task_names
        references = [_train(ctx, config, {"label": f"stl-{task}", "method": "ls"}, seed, tasks=[task])[1]
                      for task in tasks]
    return {"references": references, "method": _train(ctx, config, config["method"], seed)[1],
            "baseline": _train(ctx, config, config["baseline"], seed)[1]}


def _trained_gain_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                          ctx: RunContext) -> dict[str, Any]:
    """Δm% against the references of every seed (the mean per task over seeds), or the mean test accuracy."""
    from mtlflow import jobs

    metric = config["metric"]
    refs, records = None, []
    if metric == "delta_m":
        records = [part["references"][t] for t in range(len(parts[0]["references"])) for part in parts]
        refs = jobs.build_references(records)["metrics"]
    sides: dict[str, list[float]] = {"method": [], "baseline": []}
    teleports: dict[str, list[int]] = {"method": [], "baseline": []}
    for side in sides:
        for part in parts:
            record = part[side]
            records.append(record)
            sides[side].append(_score(record, metric, refs))
            # COST's teleports per run (0 when its trigger never fired: the run is its base method's)
            teleports[side].append(sum((e.get("cost") or {}).get("teleports", 0) for e in record["metrics"]["epochs"]))
    return {"values": sides["method"], "baseline": sides["baseline"],
            "details": {"metric": metric, "teleports_per_run": teleports, "train_seconds": _train_seconds(records)}}


#: ``method`` against ``baseline`` (each ``{method, hparams, teleport, teleport_options}``) trained with the same
#: seeds; the metric is Δm% against single-task LS runs (same seeds) or the mean test accuracy (%)
run_trained_gain = SeedwiseRunner(_trained_gain_seed, _trained_gain_combine)


def _train_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    """The epochs' wall time of every run a claim used (what training them cost, also when they were reused)."""
    return round(sum(e["epoch_seconds"] for r in records for e in r["metrics"]["epochs"]), 1)


def _palora_front_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's front on the test split (`mtlflow evaluate`): its value (the hypervolume, or the largest over
    tasks Spearman ρ between a task's preference and its error), the front and the run's record; with
    ``baseline``, the baseline's too."""
    from mtlflow import jobs
    from mtlflow.jobs.cache import cached_data_dir

    data = cached_data_dir(config["benchmark"], {**dict(config.get("data_options", {})), **dict(ctx.data_options)})

    def front_value(spec: Mapping[str, Any]) -> dict[str, Any]:
        run, record = _train(ctx, config, spec, seed)
        front = jobs.evaluate(run, data)["preference_front"]["splits"]["test"]
        summary = {"run": spec["label"], "seed": seed, "hypervolume": front["hypervolume"],
                   "spearman": front["spearman"], "non_dominated": front["non_dominated"]}
        if config["metric"] == "hypervolume":
            value = float(front["hypervolume"])
        else:
            # ρ is undefined (None) where a task's error is the same at every grid point: a flat front, no
            # correlation, so it counts as ρ = 0 (not monotone)
            value = max(0.0 if v is None else float(v) for v in front["spearman"].values())
        return {"value": value, "front": summary, "record": record}

    sides = ["method", "baseline"] if "baseline" in config else ["method"]
    return {side: front_value(config[side]) for side in sides}


def _palora_front_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                          ctx: RunContext) -> dict[str, Any]:
    sides = ["method", "baseline"] if "baseline" in config else ["method"]
    out: dict[str, Any] = {"values": [p["method"]["value"] for p in parts], "details": {"metric": config["metric"]}}
    if "baseline" in config:
        out["baseline"] = [p["baseline"]["value"] for p in parts]
    out["details"].update(train_seconds=_train_seconds([p[side]["record"] for side in sides for p in parts]),
                          fronts=[p[side]["front"] for side in sides for p in parts])
    return out


#: PaLoRA's front on the test split: its hypervolume or monotonicity per seed; with ``baseline``, the baseline's
run_palora_front = SeedwiseRunner(_palora_front_seed, _palora_front_combine)


# ---------------------------------------------------------------------------------------------- claims

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


# -------------------------------------------------------------------------------------------- verdicts


def judge(claim: Claim, values: Sequence[float], baseline: Sequence[float] | None = None) -> dict[str, Any]:
    """The measured estimate (and, for a gain, the difference to the baseline) and the verdict under the
    claim's rule (module docstring)."""
    estimate = mean_interval(values)
    out: dict[str, Any] = {"estimate": estimate.as_dict()}
    target = claim.paper_value
    if claim.rule == "gain":
        if baseline is None:
            raise InvalidParameterError(f"claim {claim.key}: a gain needs the baseline's values")
        comparison = compare(values, baseline, claim.lower_is_better)
        out["baseline"] = mean_interval(baseline).as_dict()
        out["difference"] = comparison.as_dict()
        low, high = comparison.low, comparison.high
        if comparison.verdict == "better":
            out["verdict"] = REPRODUCED
        elif comparison.verdict == "indistinguishable at 95 %" and (
                target is None or (low is not None and low <= target <= high)):
            out["verdict"] = WITHIN
        else:
            out["verdict"] = NOT_REPRODUCED
        return out
    assert target is not None, f"claim {claim.key}: rule {claim.rule} needs the paper's value"
    mean, low, high = estimate.mean, estimate.low, estimate.high
    if low is None or high is None:
        low = high = mean
    if claim.rule == "equals":
        if abs(mean - target) <= claim.tolerance:
            out["verdict"] = REPRODUCED
        else:
            out["verdict"] = WITHIN if low <= target <= high else NOT_REPRODUCED
        return out
    if claim.rule == "at_most":
        on_side = (lambda v: v < target) if claim.strict else (lambda v: v <= target)
    else:
        on_side = (lambda v: v > target) if claim.strict else (lambda v: v >= target)
    if on_side(low) and on_side(high):
        out["verdict"] = REPRODUCED
    elif not on_side(low) and not on_side(high):
        out["verdict"] = NOT_REPRODUCED
    else:
        out["verdict"] = WITHIN
    return out


# ------------------------------------------------------------------------------------------ reproduce


def hardware(device: str) -> dict[str, Any]:
    import torch

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def runs_digest(config: Mapping[str, Any], data_options: Mapping[str, Any] | None = None) -> str:
    """The name of the folder holding a configuration's runs: the hash of what the runs depend on (benchmark,
    data options, training options; the whole configuration for the other runners). A run inside is named
    by its method's label, and a label means one method setting in every claim, so claims on the same data
    and recipe share their runs (the LS and single-task runs are trained once)."""
    keys = ("benchmark", "data_options", "train")
    basis = {k: config[k] for k in keys if k in config} if "benchmark" in config and "train" in config else config
    text = json.dumps({**basis, "user_data_options": dict(data_options or {})}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def result_path(results_dir: str | Path, key: str, scale: str) -> Path:
    """``<claim>.json`` for the ledger's scale (ci), ``<claim>.<scale>.json`` for any other."""
    return Path(results_dir) / (f"{key}.json" if scale == "ci" else f"{key}.{scale}.json")


def resolve(key: str, scale: str = "ci", seeds: Sequence[int] | None = None,
            config_override: Mapping[str, Any] | None = None) -> tuple[Claim, dict[str, Any], list[int]]:
    """The claim ``key``, its configuration at ``scale`` (``config_override`` merged over it) and its seeds (the
    scale's, or ``seeds``; only the first for a claim without seeds); bad input is one line."""
    claim = get(key)
    if scale not in SCALES:
        raise InvalidParameterError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    chosen = claim.scales[scale]
    seed_list = [int(s) for s in (chosen.seeds if seeds is None else seeds)]
    if not seed_list:
        raise InvalidParameterError("--seeds is empty; give at least one seed")
    if claim.no_seeds:  # a deterministic count: one value, whatever the seeds
        seed_list = seed_list[:1]
    unknown = sorted(set(config_override or {}) - set(chosen.config))
    if unknown:
        raise InvalidParameterError(f"--set {', '.join(unknown)}: not a setting of {key} at scale {scale}; valid: "
                                    f"{', '.join(chosen.config)}")
    return claim, {**dict(chosen.config), **dict(config_override or {})}, seed_list


def seedwise(claim: Claim) -> SeedwiseRunner:
    """The claim's runner split by seed; a runner that measures its seeds together is refused (one line)."""
    if not isinstance(claim.runner, SeedwiseRunner):
        raise InvalidParameterError(f"claim {claim.key} measures its seeds together (its runner is not a "
                                    f"SeedwiseRunner), so it has no per-seed pipeline; run `{claim.command('ci')}` "
                                    "without --pipeline")
    return claim.runner


def _context(config: Mapping[str, Any], scale: str, device: str, work_dir: str | Path | None,
             work_root: str | Path, progress: bool, data_options: Mapping[str, Any] | None) -> RunContext:
    # trained runs and bench scratch go to runs/ (git-ignored), never next to the result files
    work = Path(work_dir) if work_dir else Path(work_root) / f"{scale}-{runs_digest(config, data_options)}"
    return RunContext(work, device=device, progress=progress, data_options=dict(data_options or {}))


def measure_seed(key: str, scale: str, seed: int, device: str = "cpu", work_dir: str | Path | None = None,
                 work_root: str | Path = WORK_DIR, progress: bool = True,
                 config_override: Mapping[str, Any] | None = None,
                 data_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One seed of claim ``key`` at ``scale`` (a task of the ``reproduce`` pipeline's loop): the runner's part
    for that seed with the wall and CPU seconds it took and the hardware it ran on. Runs go to ``work_dir``, by
    default ``<work_root>/<scale>-<runs_digest>``, where a finished run is reused."""
    claim, config, _ = resolve(key, scale, [seed], config_override)
    runner = seedwise(claim)
    ctx = _context(config, scale, device, work_dir, work_root, progress, data_options)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    part = runner.measure(config, int(seed), ctx)
    return {"claim": key, "scale": scale, "seed": int(seed), "part": part,
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "hardware": hardware(device)}


def combine_seeds(key: str, scale: str, measured: Sequence[Mapping[str, Any]], device: str = "cpu",
                  work_dir: str | Path | None = None, work_root: str | Path = WORK_DIR, progress: bool = True,
                  config_override: Mapping[str, Any] | None = None, data_options: Mapping[str, Any] | None = None,
                  command: str | None = None) -> dict[str, Any]:
    """The result record of claim ``key`` (what :func:`reproduce` writes) from its seeds' :func:`measure_seed`
    outputs, in seed order; its seconds are the seeds' and the combination's together."""
    if not measured:
        raise InvalidParameterError(f"claim {key}: no seed was measured; give at least one seed")
    for item in measured:
        if item["claim"] != key or item["scale"] != scale:
            raise InvalidParameterError(f"a measured seed of {item['claim']} at scale {item['scale']} was given to "
                                        f"{key} at scale {scale}")
    claim, config, seed_list = resolve(key, scale, [m["seed"] for m in measured], config_override)
    ctx = _context(config, scale, device, work_dir, work_root, progress, data_options)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = seedwise(claim).combine(config, [m["part"] for m in measured], ctx)
    seconds = sum(m["seconds"] for m in measured) + time.perf_counter() - started
    cpu_seconds = sum(m["cpu_seconds"] for m in measured) + time.process_time() - cpu_started
    return _record(claim, scale, config, seed_list, result, seconds, cpu_seconds, measured[0]["hardware"], command)


def _record(claim: Claim, scale: str, config: Mapping[str, Any], seed_list: Sequence[int],
            measured: Mapping[str, Any], seconds: float, cpu_seconds: float, hardware_info: Mapping[str, Any],
            command: str | None) -> dict[str, Any]:
    verdict = judge(claim, measured["values"], measured.get("baseline"))
    return {
        "schema": RESULT_SCHEMA, "claim": claim.key, "paper": claim.paper, "source": claim.source,
        "statement": claim.statement, "paper_text": claim.paper_text, "paper_value": claim.paper_value,
        "rule": claim.rule, "metric": claim.metric, "scale": scale,
        "scale_description": claim.scales[scale].description,
        "config": dict(config), "seeds": list(seed_list) if not claim.no_seeds else [],
        "values": [float(v) for v in measured["values"]],
        "baseline_values": [float(v) for v in measured.get("baseline", [])] or None,
        **verdict, "details": measured.get("details", {}),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # wall clock and this process's CPU time: on a shared machine the wall clock also counts the others
        "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
        "load_average": list(os.getloadavg()), "hardware": dict(hardware_info),
        "command": command or claim.command(scale),
    }


def reproduce(key: str, scale: str = "ci", results_dir: str | Path = RESULTS_DIR, device: str = "cpu",
              work_dir: str | Path | None = None, overwrite: bool = False, progress: bool = True,
              seeds: Sequence[int] | None = None, config_override: Mapping[str, Any] | None = None,
              data_options: Mapping[str, Any] | None = None, command: str | None = None) -> dict[str, Any]:
    """Run ``key`` at ``scale`` and write its result file (atomic); an existing one needs ``overwrite``.
    ``seeds`` and ``config_override`` (merged over the scale's configuration) shrink a run for a test. A
    :class:`SeedwiseRunner` runs as :func:`measure_seed` per seed then :func:`combine_seeds`: the steps of the
    ``reproduce`` pipeline, so both write the same result."""
    claim, config, seed_list = resolve(key, scale, seeds, config_override)
    target = result_path(results_dir, key, scale)
    if target.exists() and not overwrite:
        raise InvalidParameterError(f"{target} exists; pass --overwrite to replace it")
    if isinstance(claim.runner, SeedwiseRunner):
        options = {"device": device, "work_dir": work_dir, "progress": progress, "config_override": config_override,
                   "data_options": data_options}
        measured = [measure_seed(key, scale, seed, **options) for seed in seed_list]
        record = combine_seeds(key, scale, measured, command=command, **options)
    else:
        ctx = _context(config, scale, device, work_dir, WORK_DIR, progress, data_options)
        ctx.work_dir.mkdir(parents=True, exist_ok=True)
        started, cpu_started = time.perf_counter(), time.process_time()
        measured_all = claim.runner(config, seed_list, ctx)
        record = _record(claim, scale, config, seed_list, measured_all, time.perf_counter() - started,
                         time.process_time() - cpu_started, hardware(device), command)
    atomic.write_json(target, record)
    return record


# ---------------------------------------------------------------------------------------------- ledger


def _fmt_estimate(estimate: Mapping[str, Any] | None) -> str:
    return format_estimate(estimate, digits=3)


def ledger_row(claim: Claim, record: Mapping[str, Any] | None) -> list[str]:
    """One row of the ledger: claim, paper (source), paper's number, mtlflow's (mean [95 % interval], n),
    the difference to the baseline for a gain, scale, verdict, seconds, command."""
    head = [f"`{claim.key}`", f"{claim.paper}, {claim.source}: {claim.statement}", claim.paper_text]
    if record is None:
        paper = f"; the paper scale needs {claim.data}: `{claim.command('paper')}`" if claim.data else ""
        return head + ["–", "–", "–", f"not yet run here (`{claim.command('ci')}`{paper})", "–"]
    if claim.no_seeds:
        measured = f"{record['estimate']['mean']:.3f} ({claim.no_seeds})"
    else:
        measured = f"{_fmt_estimate(record['estimate'])}, n = {record['estimate']['n']}"
    diff = "–"
    if record.get("difference"):
        d = record["difference"]
        diff = (f"{_fmt_estimate({'mean': d['difference'], 'low': d['low'], 'high': d['high'], 'n': min(d['n'])})}"
                f" (baseline {_fmt_estimate(record['baseline'])}; P(better) {d['probability_of_improvement']:.2f})")
        if record["config"].get("method", {}).get("teleport"):  # whether COST acted at all
            diff += f"; COST teleports per run: {record['details']['teleports_per_run']['method']}"
    verdict = record["verdict"] + ("" if record["verdict"] == REPRODUCED else f": {claim.if_not}")
    took = f"{record['seconds']:.0f} s wall, {record['cpu_seconds']:.0f} s CPU"
    if "train_seconds" in record["details"]:  # trained runs may have been reused from an earlier invocation
        took += f"; its runs' epochs {record['details']['train_seconds']:.0f} s"
    return head + [measured, diff, f"{record['scale']}: {record['scale_description']}", verdict,
                   f"{took} ({record['date'][:10]})"]


LEDGER_HEADER = ["claim", "paper: statement", "paper's number", "mtlflow: mean [95 % interval]",
                 "difference to baseline [95 %]", "scale here", "verdict", "time of `--scale ci` (date)"]


def read_results(results_dir: str | Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """The stored ci-scale result files by claim (files of unknown claims are refused)."""
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        if path.name.count(".") > 1:  # <claim>.<scale>.json: not the ledger's scale
            continue
        record = atomic.read_json(path, "claim result")
        if record.get("claim") not in CLAIMS or record.get("scale") != "ci":
            raise InvalidParameterError(f"{path} is not a ci-scale result of a registered claim; remove it")
        out[record["claim"]] = record
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def ledger_markdown(results_dir: str | Path = RESULTS_DIR) -> str:
    """``docs/research/claims.md``: one row per registered claim, numbers only from the result files."""
    records = read_results(results_dir)
    lines = ["# Claims ledger", "",
             "<!-- generated by `mtlflow reproduce --ledger` (make claims-ledger) from docs/research/claims/*.json;"
             " do not edit -->", "",
             "Each seed paper's headline claims, measured here at `--scale ci` (the largest this 2-core CPU "
             "machine allows in minutes) with the mean and 95 % percentile-bootstrap interval over seeds "
             "(`mtlflow.metrics.intervals`). `mtlflow reproduce CLAIM --scale paper` runs the paper's "
             "configuration. The verdict rules are in `mtlflow.experiments.claims` "
             "(reproduced / within interval / not reproduced); a result file holds every seed's value, the "
             "configuration, date, hardware and command. A claim of one method over another (a *gain*) is judged "
             "on the direction of the difference and its 95 % interval, not on the paper's absolute numbers: at "
             "ci scale those are far from the paper's (a smaller data set, a few epochs), and the scale column "
             "says how.", "",
             "```bash",
             "mtlflow reproduce --list                       # the registered claims",
             "mtlflow reproduce asmg-synthetic --scale ci    # writes docs/research/claims/asmg-synthetic.json",
             "mtlflow reproduce cost-nyuv2 --scale paper --device cuda --data-dir /data/nyuv2 --out results/",
             "mtlflow reproduce asmg-synthetic --pipeline --local   # the same runs as a pipeline (kfp.local)",
             "make claims-ledger                             # this page, from the stored result files",
             "```", "",
             "The time column is the measured time of `--scale ci` on this machine (wall clock and the process's "
             "CPU time; the machine is shared, so the wall clock is the larger). Trained runs are kept under "
             "`runs/claims/` and reused by a re-run of the same configuration; an existing result file is replaced "
             "only with `--overwrite`. `--set KEY=VALUE` changes one setting of the scale (a quick check). The same "
             "runs as a Kubeflow pipeline, one task per seed: `mtlflow reproduce CLAIM --pipeline --local` (kfp.local, "
             "the same result file, value for value), `--compile FILE` or `--host URL` (with `--device cuda` every "
             "seed task asks for a GPU; see [the Kubeflow guide](../guides/kubeflow.md)).", "",
             "| " + " | ".join(LEDGER_HEADER) + " |", "|" + "---|" * len(LEDGER_HEADER)]
    for claim in CLAIMS.values():
        lines.append("| " + " | ".join(_cell(c) for c in ledger_row(claim, records.get(claim.key))) + " |")
    lines += ["", "## Configurations", "",
              "| claim | paper scale | ci scale | data we cannot ship |", "|---|---|---|---|"]
    for claim in CLAIMS.values():
        lines.append(f"| `{claim.key}` | {_cell(claim.scales['paper'].description)} (`{claim.command('paper')}`) | "
                     f"{_cell(claim.scales['ci'].description)} | {_cell(claim.data or '–')} |")
    return "\n".join(lines) + "\n"


def write_ledger(results_dir: str | Path = RESULTS_DIR, path: str | Path = LEDGER_PATH) -> Path:
    atomic.write_text(path, ledger_markdown(results_dir))
    return Path(path)
