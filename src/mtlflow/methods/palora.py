"""PaLoRA: Pareto-front learning with task-specific low-rank adapters.

Paper: Dimitriadis, Frossard & Fleuret, "Pareto Low-Rank Adapters: Efficient Multi-Task Learning with
Preferences" (``shared/seeds/palora-pareto-low-rank-adapters.txt``). One model represents a whole
Pareto front: for a preference λ ∈ Δ_T every adapted layer uses W + (α/r) Σ_t λ_t A_t B_t (Eq. 2,
:mod:`mtlflow.pareto.adapters`), and the same λ weights the losses.

Training step (Algorithm 1), owned by this method (``custom_step``): the M rays of the step move
from the simplex centre c to Eq. 3's end point, λ_m(τ) = (1 − τ)·c + τ·g_{1,Q}(λ̃_m)
(:mod:`mtlflow.pareto.simplex`), for the training progress τ = step / (total steps − 1), the horizon
fixed at the run's start and kept in its checkpoint. Deviation: Eq. 3 taken literally, λ_m(τ) =
g_{τ,Q}(λ̃_m), has 0^{τ/Q} = 0, so every ray with a zero component sits on its end point from the first
step (3 tasks, M = 10: 7 distinct rays), unlike the gradual motion of the paper's Fig. 11; it remains
as ``schedule=annealed-eq3``. For every ray the network is formed with that λ and its loss is
λ_mᵀ L(f(x; θ(λ_m)), y); the step minimises L_total = Σ_m λ_mᵀ L_m, updating the base weights W, the
adapters A, B and the heads jointly (one optimizer step; the M backward passes are accumulated, which
gives the gradient of the sum without holding M graphs). ``schedule`` selects the ablation variants of
Sec. 6.1 / App. D (``deterministic`` = g_{1,Q}, ``dirichlet`` with M = 1 (PHN) or M > 1 (PaMaL),
``dirichlet-annealed`` = Dirichlet(p(1 − τ)·𝟏)).

Evaluation (Sec. 5, Sec. 6.1, App. B.2): after every ``front_every`` epochs and at the end, the model
is evaluated at every point of an even simplex grid (11 points for two tasks) on the val and test
splits; the points' metrics, the hypervolume against the benchmark's fixed reference point and the
number of non-dominated points go into the epoch record (``preference_front``), the selected front
into ``metrics.json`` and ``pareto_front.png`` of the run (:mod:`mtlflow.pareto.front`).

Pareto expansion (Sec. 5.4, App. B.3): ``init_from=PATH/model.pt`` starts from a trained single-point
model (the paper: the first seed of linear scalarisation) and fine-tunes only the adapters (base
weights, heads and normalisation statistics stay frozen); the paper uses 4 epochs on MultiMNIST at the
final learning rate of the original run (``--epochs 4 --lr ...``).

Where the paper is silent, and what mtlflow does:

* layers: every Conv2d and Linear layer of the shared trunk (``layers=trunk``), heads without adapters;
  initialisation as LoRA (A_t = 0, B_t Kaiming-uniform); biases without adapters (the paper omits them);
  convolutions as n × c·k² matrices (``factorization=matrix``, the Sec. 4.1 formula). The paper's reported
  overheads (12.5 % MultiMNIST, 4.2 % CityScapes, 6.3 % NYUv2) are reproduced exactly by
  ``layers=all factorization=kernel`` (heads adapted too, LoRA's nk × rk · rk × ck convolution layout),
  which is therefore offered as the variant closest to the authors' runs;
* single-point metrics: the trainer's per-epoch val/test metrics, ``final``, ``mtlflow evaluate``'s
  metrics and the aggregate's table row are those of the simplex centre λ = (1/T, ..., 1/T) (the paper
  does not say how its grid is reduced to one table row); ``model.pt`` holds that merged plain network
  and, under ``palora``, the adapters that rebuild any other preference;
* α and Q: the paper grid-searches α ∈ {1, 2, 5, 10} and Q ∈ {1, 2, 5} without naming the chosen
  values; the defaults here are α = 5 (docs/research/palora.md reports the α grid on MultiMNIST) and Q = 1, for
  which the annealed rays end exactly on the grid;
* scene understanding: the paper combines PaLoRA with a gradient-balancing scheme "similar to GradNorm"
  (App. B.2) whose form it does not give; mtlflow trains with the plain Σ_m λ_mᵀ L_m of Algorithm 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback, StepState, TrainerView
from mtlflow.core.errors import DataError, InvalidParameterError, NonFiniteLossError
from mtlflow.core.hparams import HParam, SearchRange, non_negative, one_of, positive
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods.base import Method
from mtlflow.metrics.selection import parse_selection
from mtlflow.pareto.adapters import FACTORIZATIONS, PreferenceAdapters
from mtlflow.pareto.front import evaluate_front, front_plot, front_record, select_front, task_info
from mtlflow.pareto.simplex import SCHEDULES, PreferenceSchedule, default_eval_subdivisions, default_rays, simplex_grid


def _positive_int(v: Any) -> bool:
    return v >= 1


class PaLoRA(Method):
    name = "palora"
    family = "pareto-front"
    cost = "O(M)"
    paper = ("Dimitriadis, Frossard & Fleuret, Pareto Low-Rank Adapters: Efficient Multi-Task Learning with "
             "Preferences (PaLoRA)")
    equations = ("Eq. 2 (W + (α/r) Σ_t λ_t A_t B_t), Eq. 3 (annealed rays: centre → g_{1,Q}, Fig. 11), "
                 "Algorithm 1 (Σ_m λ_mᵀ L_m per batch), Sec. 6.1/App. D schedules, App. B.3 Pareto expansion")
    custom_step = True
    needs_trainer = "Pareto-front learning: it injects adapters into the model and trains over preference rays"
    hparams = {
        "rank": HParam(1, "rank r of every task's adapter (paper: 1 on MultiMNIST, 4 on scene understanding)",
                       _positive_int, "an integer >= 1", kind=int),
        "alpha": HParam(5.0, "scaling α of Eq. 2 (paper grid 1, 2, 5, 10)", positive,
                        search=SearchRange("categorical", choices=(1.0, 2.0, 5.0, 10.0),
                                           source="PaLoRA App. D: α grid {1, 2, 5, 10}")),
        "rays": HParam(0, "M rays (forward passes) per batch; 0 = 5 for 2 tasks, 10 for 3, else the "
                       "vertices+edge-midpoints grid; deterministic schedules need an even-grid size",
                       non_negative, "an integer >= 0", kind=int),
        "temperature": HParam(1.0, "annealing temperature Q of Eq. 3 (paper grid 1, 2, 5; 1 ends on the grid)",
                              positive, search=SearchRange("categorical", choices=(1.0, 2.0, 5.0),
                                                           source="PaLoRA App. D: Q grid {1, 2, 5}")),
        "schedule": HParam("annealed", "preference schedule: annealed (rays move linearly from the centre to "
                           "Eq. 3's end point g_{1,Q}, Fig. 11), annealed-eq3 (Eq. 3 literally; rays with a zero "
                           "component jump at the first step), deterministic (g_{1,Q}, no "
                           "annealing), dirichlet (Dirichlet(p·1)), dirichlet-annealed (Dirichlet(p(1-τ)·1))",
                           one_of(*SCHEDULES), kind=str),
        "concentration": HParam(1.0, "Dirichlet concentration p of the random schedules (paper grid 1, 2, 5)",
                                positive),
        "layers": HParam("trunk", "layers with adapters: trunk (every Conv2d/Linear of the shared trunk), all "
                         "(heads too, as the paper's parameter counts imply), or comma-separated module names",
                         lambda v: bool(v.strip()), "trunk, all or module names", kind=str),
        "factorization": HParam("matrix", "Conv2d adapters: matrix (n x c·k², Sec. 4.1's mn + T·r(m+n)) or kernel "
                                "(nk x rk · rk x ck, the layout that reproduces the paper's reported overheads)",
                                one_of(*FACTORIZATIONS), kind=str),
        "init_from": HParam(None, "Pareto expansion: a single-point run's model.pt (LS in the paper); only the "
                            "adapters are trained", lambda v: v is None or bool(v.strip()), "a model.pt path",
                            kind=str),
        "eval_subdivisions": HParam(0, "evaluation grid: subdivisions per simplex edge; 0 = 10 for 2 tasks (11 "
                                    "points), else the finest grid with <= 30 points", non_negative,
                                    "an integer >= 0", kind=int),
        "front_every": HParam(1, "evaluate the front every N epochs (always at the selected final epochs); 0 = "
                              "only at the end", non_negative, "an integer >= 0", kind=int),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        if n_tasks < 2:
            raise InvalidParameterError("palora learns a Pareto front over at least 2 tasks; train single-task "
                                        "references with --method ls")
        hp = self.hp
        self.n_rays = hp["rays"] or default_rays(n_tasks)
        self.schedule = self._make_schedule(seed=0)  # validates the ray count; reseeded in setup
        self.eval_preferences = simplex_grid(n_tasks, hp["eval_subdivisions"] or default_eval_subdivisions(n_tasks))
        self.adapters: PreferenceAdapters | None = None
        self.frozen_base = False
        self.total_steps = 1

    def _make_schedule(self, seed: int) -> PreferenceSchedule:
        hp = self.hp
        return PreferenceSchedule(hp["schedule"], self.n_tasks, self.n_rays, hp["temperature"], hp["concentration"],
                                  seed)

    # -- setup -----------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView) -> None:
        if self.hp["init_from"]:
            self._load_initial_model(trainer, Path(self.hp["init_from"]))
        self.adapters = PreferenceAdapters.inject(trainer.model, self.n_tasks, self.hp["rank"], self.hp["alpha"],
                                                  self.hp["layers"], self.hp["factorization"])
        # random schedules draw from the run's seed; a resumed run restores the generator afterwards
        self.schedule = self._make_schedule(seed=trainer.config.seed)
        self.total_steps = max(trainer.config.epochs * trainer.steps_per_epoch(), 1)
        trainer.callbacks.append(PreferenceFrontCallback(self))

    def _load_initial_model(self, trainer: TrainerView, path: Path) -> None:
        """Pareto expansion: load a trained single-point model and freeze it (only adapters will train)."""
        if not path.is_file():
            raise DataError(f"init_from: {path} not found; give the model.pt of a trained run (e.g. runs/ls/model.pt)")
        try:
            blob = torch.load(path, map_location=trainer.device, weights_only=False)
        except Exception as exc:
            raise DataError(f"init_from: {path} is corrupt ({type(exc).__name__}); retrain that run") from None
        tasks = [t.name for t in trainer.tasks]
        if "palora" in blob:
            raise InvalidParameterError(f"init_from: {path} is a PaLoRA model; expansion starts from a single-point "
                                        "model such as an LS run's model.pt")
        if blob.get("benchmark") != trainer.bench.name or blob.get("tasks") != tasks:
            raise InvalidParameterError(f"init_from: {path} is a {blob.get('benchmark')} model of tasks "
                                        f"{blob.get('tasks')}; expansion needs a {trainer.bench.name} model of {tasks}")
        if blob.get("data_hash") != trainer.data.content_hash:
            raise DataError(f"init_from: {path} was trained on data {str(blob.get('data_hash'))[:12]}, this run uses "
                            f"{trainer.data.content_hash[:12]}; expand on the data the model was trained on")
        try:
            trainer.model.load_state_dict(blob["state_dict"])
        except RuntimeError:
            raise InvalidParameterError(f"init_from: {path} does not fit this model (different benchmark options?); "
                                        "use the benchmark configuration it was trained with") from None
        for p in trainer.model.parameters():
            p.requires_grad_(False)
        self.frozen_base = True

    # -- the step (Algorithm 1) -----------------------------------------------------------------
    def progress(self, step: int) -> float:
        """τ ∈ [0, 1]: 0 at the first step, 1 at the last step of the run."""
        return min(step / max(self.total_steps - 1, 1), 1.0)

    def training_step(self, trainer: TrainerView, batch: Any, epoch: int) -> dict[str, Any]:
        if self.adapters is None:
            raise RuntimeError("palora: setup(trainer) must run before training_step")
        if self.frozen_base:  # expansion trains the adapters only: normalisation statistics stay as loaded
            for module in trainer.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        trainer.optimizer.zero_grad(set_to_none=True)
        rays = self.schedule.rays(self.progress(trainer.global_step))
        loss_sum = None
        for lam in rays:
            with self.adapters.preference(lam):
                losses, _ = trainer.forward_losses(batch)
                self._check_finite(losses, lam, trainer, epoch)
                # λ builds the weights (Eq. 2) and weights the losses: λᵀ L; gradients accumulate over rays
                (lam.to(losses) * losses).sum().backward()
            loss_sum = losses.detach() if loss_sum is None else loss_sum + losses.detach()
        mean_losses = loss_sum / len(rays)
        state = StepState(epoch=epoch, step=trainer.global_step, batch=batch, losses=mean_losses)
        trainer.optimizer_step(state)
        self.last_weights = cpu_float64(rays.mean(dim=0))
        return {"losses": mean_losses, "weights": self.last_weights, **state.info}

    def _check_finite(self, losses: Tensor, lam: Tensor, trainer: TrainerView, epoch: int) -> None:
        if not bool(torch.isfinite(losses).all()):
            raise NonFiniteLossError(f"palora: non-finite loss {losses.detach().tolist()} for preference "
                                     f"{[round(float(v), 4) for v in lam]} at epoch {epoch}, "
                                     f"step {trainer.global_step}; "
                                     "lower --lr or alpha, or set --clip-grad-norm")

    # -- the front -------------------------------------------------------------------------------
    def front_due(self, epoch: int, epochs: int, select: str) -> bool:
        """Whether the front is evaluated after ``epoch``: every ``front_every`` epochs and in every epoch
        the selection rule averages (so the final front always exists)."""
        _, window = parse_selection(select)
        every = self.hp["front_every"]
        return epoch > epochs - window or (every > 0 and epoch % every == 0)

    def evaluate_front(self, trainer: TrainerView) -> dict[str, Any]:
        """The front record of the current model on the val and test splits."""
        by_split = {split: evaluate_front(trainer.model, self.adapters, trainer.bench, trainer.data.splits[split],
                                          trainer.tasks, trainer.task_index, self.eval_preferences,
                                          trainer.config.eval_batch_size, trainer.device)
                    for split in ("val", "test")}
        return front_record(self.eval_preferences, by_split, *task_info(trainer.tasks))

    def model_blob_extra(self) -> dict[str, Any]:
        """What ``model.pt`` carries besides the merged centre network: the adapters and the grid."""
        state = {k: v.detach().to("cpu") for k, v in self.adapters.model.state_dict().items()}
        return {"spec": self.adapters.spec.to_dict(), "state_dict": state,
                "merged_preference": self.adapters.centre.tolist(),
                "eval_preferences": self.eval_preferences.tolist(), "hparams": dict(self.hp)}

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # the schedule's horizon travels with the checkpoint: a run resumed with more epochs keeps the
        # annealing it started with instead of recomputing τ from the new epoch count
        return {"schedule": self.schedule.state_dict(), "total_steps": self.total_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.total_steps = int(state.get("total_steps", self.total_steps))


class PreferenceFrontCallback(Callback):
    """Evaluates the preference grid after the due epochs and writes the run's front outputs at the end."""

    name = "palora-front"

    def __init__(self, method: PaLoRA):
        self.method = method

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        if self.method.front_due(record["epoch"], trainer.config.epochs, trainer.config.selection):
            record["preference_front"] = self.method.evaluate_front(trainer)

    def on_train_end(self, trainer: TrainerView, result: dict[str, Any]) -> None:
        """``metrics.json`` gets the selected front, ``model.pt`` the merged centre network plus the
        adapters, and ``pareto_front.png`` the plot."""
        names, primary, specs, _ = task_info(trainer.tasks)
        front = select_front(trainer.history, trainer.config.selection, names, primary, specs)
        metrics_path = trainer.out_dir / "metrics.json"
        payload = atomic.read_json(metrics_path, "run metrics")
        payload["preference_front"] = front
        atomic.write_json(metrics_path, payload)
        model_path = trainer.out_dir / "model.pt"
        blob = torch.load(model_path, map_location="cpu", weights_only=False)
        blob["state_dict"] = self.method.adapters.merged_state_dict(self.method.adapters.centre)
        blob["palora"] = self.method.model_blob_extra()
        atomic.torch_save(blob, model_path)
        if front is not None:
            title = f"PaLoRA front: {trainer.bench.name}, seed {trainer.config.seed}"
            atomic.write_bytes(trainer.out_dir / "pareto_front.png", front_plot(front, names, primary, title))
        result["preference_front"] = front
