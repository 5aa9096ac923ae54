"""Shared machinery of the multi-objective bi-level (MOBLO) methods MOML and FORUM (not a method module).

Feiyang Ye, *Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization*, PhD
thesis, UTS 2024, Chapter 3. The MOBLO problem (Eq. 3.3/3.4) is

    min_{α ∈ A, ω} (F_1(ω, α), …, F_m(ω, α))   s.t.   ω ∈ argmin_ω f(ω, α),

with the model weights ω as the lower level (LL) and α as the upper level (UL). Two instances are
implemented (:class:`UpperLevel`):

* ``task-weights`` (Eq. 3.2, the MTL instance): α ∈ Δ^{K-1} weighs the training losses,
  f(ω, α) = Σ_i α_i L_i^tr(ω), and F_i(ω) = L_i^val(ω) are the per-task losses on the validation
  split. The thesis does not say how α stays on the simplex: ``simplex="projection"`` (default) takes
  a step on α and projects it back onto Δ (Euclidean projection); ``simplex="softmax"`` is the
  authors' code (FORUM repository), α = softmax(logits) with the step on the logits.
* ``sample-weights`` (Section 3.7.1, multi-objective data hyper-cleaning): one logit α_{i,j} per
  training sample, f(ω, α) = Σ_i (1/|B_i|) Σ_j σ(α_{i,j}) ℓ(ω; x_{i,j}, y_{i,j}), and F_i(ω) the clean
  validation loss of dataset i. It needs a benchmark with per-sample losses and sample ids (duck
  typed: ``bench.per_sample_losses(preds, targets, task_index)`` and
  ``bench.sample_ids(targets, task_index)``; :mod:`mtlflow.benchmarks.hypercleaning` has them).

The methods draw their upper-level (validation) batches, and with ``inner_batches="fresh"`` the
batches of the inner lower-level steps, from :class:`SplitSampler` -- a sampler owned by the method,
seeded from the run seed and checkpointed, so a resumed run sees the same batches and the trainer's
data order is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from mtlflow.core.callbacks import StepState, TrainerView
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.core.hparams import HParam, SearchRange, one_of, positive
from mtlflow.methods._support import MethodGenerator
from mtlflow.methods.moco import project_to_simplex

UPPER_LEVELS = ("task-weights", "sample-weights")
SIMPLEX_PARAMETRISATIONS = ("projection", "softmax")
OUTER_OPTIMIZERS = ("adam", "sgd")
INNER_BATCHES = ("step", "fresh")
UPPER_SPLITS = ("val", "train")


def common_hparams(inner_steps: int, inner_lr: float) -> dict[str, HParam]:
    """Hyper-parameters shared by MOML and FORUM (defaults differ per method)."""
    return {
        "upper": HParam("task-weights", "upper-level variable: 'task-weights' α ∈ Δ (MTL, Eq. 3.2) or "
                        "'sample-weights' σ(α_ij) per training sample (hyper-cleaning; benchmark must support it)",
                        one_of(*UPPER_LEVELS)),
        "simplex": HParam("projection", "how task weights stay on the simplex: 'projection' after each step or "
                          "'softmax' of logits (the authors' code)", one_of(*SIMPLEX_PARAMETRISATIONS)),
        "inner_steps": HParam(inner_steps, "T: lower-level SGD steps per upper-level iteration", lambda v: v >= 1,
                              "an integer >= 1", kind=int),
        "inner_lr": HParam(inner_lr, "η: step size of the inner lower-level SGD steps", positive,
                           search=SearchRange("categorical", choices=(0.05, 0.1, 0.5),
                                              source="Ye's thesis, MTL experiments: LL step η grid {0.05, 0.1, 0.5}")),
        "inner_batches": HParam("step", "data of the inner steps: 'step' (the trainer's batch for all T, as the "
                                "authors' code) or 'fresh' (a new training batch per inner step)",
                                one_of(*INNER_BATCHES)),
        "outer_optimizer": HParam("adam", "optimizer of the upper-level variable: 'adam' (thesis MTL runs) or 'sgd' "
                                  "(plain, hyper-cleaning)", one_of(*OUTER_OPTIMIZERS)),
        "outer_lr": HParam(1e-3, "step size of the upper-level variable (thesis MTL: 1e-3 with Adam)", positive),
        "upper_split": HParam("val", "split of the upper-level losses F_i: 'val' (the thesis, Eq. 3.2) or 'train' "
                              "(the authors' MTL code draws a second training batch)",
                              one_of(*UPPER_SPLITS)),
    }


# -- data ----------------------------------------------------------------------------------------

class SplitSampler:
    """Random batches of one split, epoch after epoch of fresh permutations, from a private generator."""

    def __init__(self, name: str):
        self.rng = MethodGenerator(name)
        self.order: Tensor | None = None
        self.position = 0

    def reseed(self, seed: int) -> None:
        self.rng.reseed(seed)
        self.order, self.position = None, 0

    def next_indices(self, size: int, batch_size: int) -> Tensor:
        batch_size = min(batch_size, size)
        if self.order is None or len(self.order) != size or self.position + batch_size > size:
            self.order = torch.randperm(size, generator=self.rng.generator)
            self.position = 0
        chosen = self.order[self.position:self.position + batch_size]
        self.position += batch_size
        return chosen

    def batch(self, bench: Any, dataset: Dataset, batch_size: int) -> Any:
        """The next batch of ``dataset``, collated by the benchmark's own loader (graph data included)."""
        indices = self.next_indices(len(dataset), batch_size).tolist()
        loader = bench.make_loader(Subset(dataset, indices), batch_size=len(indices), shuffle=False)
        return next(iter(loader))

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.rng.state_dict(), "order": None if self.order is None else self.order.clone(),
                "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.load_state_dict(state["generator"])
        self.order = None if state["order"] is None else state["order"].clone()
        self.position = int(state["position"])


# -- the model as a function of its parameters ----------------------------------------------------

class FunctionalModel:
    """The trainer's model evaluated at substituted parameters (``torch.func.functional_call``).

    ``names`` are the trainable parameters (shared trunk and heads). Virtual passes (unrolled or inner
    steps) get copies of the buffers, so BatchNorm statistics of the real model only change in the
    real step.
    """

    def __init__(self, trainer: TrainerView):
        self.trainer = trainer
        self.model = trainer.model
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    def current(self) -> dict[str, Tensor]:
        """The live parameters (autograd reaches the model's own tensors)."""
        params = dict(self.model.named_parameters())
        return {n: params[n] for n in self.names}

    def detached_copy(self) -> dict[str, Tensor]:
        """Leaf copies of the parameters that require grad (ω_0 of an inner or unrolled run)."""
        return {n: p.detach().clone().requires_grad_(True) for n, p in self.current().items()}

    def inputs_targets(self, batch: Any) -> tuple[Any, list[Tensor]]:
        inputs, targets = self.trainer.bench.unpack(batch)
        device = self.trainer.device
        inputs = inputs.to(device) if hasattr(inputs, "to") else inputs
        return inputs, [t.to(device) if hasattr(t, "to") else t for t in targets]

    def predictions(self, params: dict[str, Tensor] | None, inputs: Any) -> list[Tensor]:
        if params is None:
            return self.model(inputs)
        buffers = {n: b.clone() for n, b in self.model.named_buffers()}
        return torch.func.functional_call(self.model, {**buffers, **params}, (inputs,))

    def task_losses(self, preds: Sequence[Tensor], targets: Sequence[Tensor]) -> Tensor:
        """The K batch-mean task losses as one tensor."""
        tr = self.trainer
        return torch.stack([task.loss(pred, targets[idx]) for task, pred, idx in zip(tr.tasks, preds, tr.task_index, strict=True)])


def check_finite(losses: Tensor, method: str, trainer: TrainerView, what: str) -> None:
    if not bool(torch.isfinite(losses).all()):
        raise NonFiniteLossError(f"{method}: non-finite {what} ({losses.detach().tolist()}) at step "
                                 f"{trainer.global_step}; lower --lr or the method's inner_lr/outer_lr")


# -- upper-level variables ---------------------------------------------------------------------

class UpperLevel:
    """The upper-level variable α of a MOBLO method: a tensor ``variable`` and the LL objective f(ω, α).

    α is kept in float64: the hypergradients of nearly parallel tasks give a nearly singular Gramian,
    which the min-norm solver needs to be positive semi-definite to machine precision.
    """

    #: "mean" when f is a convex combination of the K task losses (the trainer's ×K convention applies)
    natural_scale = "sum"

    def __init__(self, variable: Tensor):
        self.variable = variable

    def lower_objective(self, variable: Tensor, model: FunctionalModel, preds: Sequence[Tensor],
                        targets: Sequence[Tensor]) -> Tensor:
        raise NotImplementedError

    def after_step(self) -> None:
        """Called after each optimizer step on ``variable`` (projection)."""

    def weights_summary(self) -> Tensor:
        """K numbers for the run's ``method_weights_mean`` (task weights or mean sample weights)."""
        raise NotImplementedError


class TaskWeights(UpperLevel):
    """α ∈ Δ^{K-1}; f(ω, α) = Σ_i α_i L_i^tr(ω) (Eq. 3.2)."""

    natural_scale = "mean"

    def __init__(self, n_tasks: int, simplex: str, device: torch.device):
        self.simplex = simplex
        start = torch.full((n_tasks,), 1.0 / n_tasks) if simplex == "projection" else torch.zeros(n_tasks)
        super().__init__(start.to(device, torch.float64))

    def alpha(self, variable: Tensor) -> Tensor:
        return variable if self.simplex == "projection" else torch.softmax(variable, dim=0)

    def lower_objective(self, variable, model, preds, targets):
        losses = model.task_losses(preds, targets)
        return (self.alpha(variable).to(losses.dtype) * losses).sum()

    def after_step(self) -> None:
        if self.simplex == "projection":
            with torch.no_grad():
                self.variable.copy_(project_to_simplex(self.variable))

    def weights_summary(self) -> Tensor:
        return self.alpha(self.variable.detach())


class SampleWeights(UpperLevel):
    """One logit per training sample of every task; f(ω, α) = Σ_i mean_j σ(α_ij) ℓ_ij (Section 3.7.1)."""

    def __init__(self, trainer: TrainerView):
        bench = trainer.bench
        if not (callable(getattr(bench, "per_sample_losses", None)) and callable(getattr(bench, "sample_ids", None))):
            raise InvalidParameterError(f"upper=sample-weights needs a benchmark with per-sample training losses and "
                                        f"sample ids (e.g. hypercleaning); {bench.name!r} has none, use "
                                        "upper=task-weights")
        self.bench, self.task_index = bench, list(trainer.task_index)
        n_samples = len(trainer.data.splits["train"])
        # logits start at 0: every sample weighs σ(0) = 1/2 (the thesis initialises z_0 randomly, unstated how)
        super().__init__(torch.zeros(len(self.task_index), n_samples, dtype=torch.float64, device=trainer.device))

    def lower_objective(self, variable, model, preds, targets):
        per_sample = self.bench.per_sample_losses(preds, targets, self.task_index)
        ids = self.bench.sample_ids(targets, self.task_index)
        terms = [(torch.sigmoid(variable[i, idx]).to(loss.dtype) * loss).mean()
                 for i, (loss, idx) in enumerate(zip(per_sample, ids, strict=True))]
        return torch.stack(terms).sum()

    def weights_summary(self) -> Tensor:
        return torch.sigmoid(self.variable.detach()).mean(dim=1)


def build_upper_level(hp: dict[str, Any], trainer: TrainerView) -> UpperLevel:
    if hp["upper"] == "task-weights":
        return TaskWeights(len(trainer.tasks), hp["simplex"], trainer.device)
    return SampleWeights(trainer)


def build_outer_optimizer(hp: dict[str, Any], variable: Tensor) -> torch.optim.Optimizer:
    """Adam or plain SGD on the upper-level variable (the thesis' UL optimizers)."""
    if hp["outer_optimizer"] == "adam":
        return torch.optim.Adam([variable], lr=hp["outer_lr"])
    return torch.optim.SGD([variable], lr=hp["outer_lr"])


# -- shared step pieces ----------------------------------------------------------------------------

class BilevelState:
    """What MOML and FORUM keep between steps: the UL variable, its optimizer and the data samplers."""

    def __init__(self, method: str):
        self.method = method
        self.upper: UpperLevel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.upper_sampler = SplitSampler(f"{method}/upper")
        self.inner_sampler = SplitSampler(f"{method}/inner")
        self.model: FunctionalModel | None = None

    def setup(self, hp: dict[str, Any], trainer: TrainerView) -> None:
        split = hp["upper_split"]
        if len(trainer.data.splits[split]) == 0:
            raise InvalidParameterError(f"{self.method} needs a non-empty {split!r} split for its upper level")
        self.upper = build_upper_level(hp, trainer)
        self.optimizer = build_outer_optimizer(hp, self.upper.variable)
        self.upper_sampler.reseed(trainer.config.seed)
        self.inner_sampler.reseed(trainer.config.seed + 1)
        self.model = FunctionalModel(trainer)

    def upper_batch(self, hp: dict[str, Any], trainer: TrainerView) -> Any:
        split = trainer.data.splits[hp["upper_split"]]
        return self.upper_sampler.batch(trainer.bench, split, trainer.config.batch_size)

    def inner_batch_source(self, hp: dict[str, Any], trainer: TrainerView, batch: Any) -> Callable[[int], Any]:
        """``t -> batch`` of inner step t: the step's batch, or a fresh training batch each time."""
        if hp["inner_batches"] == "step":
            return lambda t: batch
        train = trainer.data.splits["train"]
        return lambda t: self.inner_sampler.batch(trainer.bench, train, trainer.config.batch_size)

    def step_upper(self, gradient: Tensor) -> None:
        """One optimizer step of the UL variable along ``gradient`` (then the projection, if any)."""
        if not bool(torch.isfinite(gradient).all()):
            raise NonFiniteLossError(f"{self.method}: non-finite upper-level gradient; lower outer_lr or inner_lr")
        variable = self.upper.variable
        variable.grad = gradient.to(variable)
        self.optimizer.step()
        variable.grad = None
        self.upper.after_step()

    def lower_scale(self, trainer: TrainerView) -> float:
        """×K for task weights under the trainer's rescaling convention (α = 1/K then equals LS)."""
        return trainer.update_scale(self.upper.natural_scale)

    def state_dict(self) -> dict[str, Any]:
        return {"variable": self.upper.variable.detach().clone(), "optimizer": self.optimizer.state_dict(),
                "upper_sampler": self.upper_sampler.state_dict(), "inner_sampler": self.inner_sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.upper.variable.copy_(state["variable"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.upper_sampler.load_state_dict(state["upper_sampler"])
        self.inner_sampler.load_state_dict(state["inner_sampler"])


def step_model(trainer: TrainerView, state: StepState, grads: dict[str, Tensor] | None = None,
               objective: Tensor | None = None) -> None:
    """The step's one update of ω, from explicit gradients or by back-propagating ``objective``, through the
    trainer's step rules (clipping, callbacks)."""
    trainer.optimizer.zero_grad(set_to_none=True)
    if objective is not None:
        objective.backward()
    else:
        params = dict(trainer.model.named_parameters())
        for name, grad in grads.items():
            params[name].grad = grad.detach().to(params[name].dtype)
    trainer.optimizer_step(state)

