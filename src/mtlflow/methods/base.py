"""The method API shared by every multi-task optimiser in mtlflow.

Three families share one base class, :class:`Method`:

* :class:`LossWeighting` -- O(1) methods that only need the K task losses. They expose
  :meth:`LossWeighting.weights` (the weights applied to the losses, for logging and tests) and
  :meth:`LossWeighting.objective` (the scalar the trainer back-propagates).
* :class:`GradientMethod` -- O(K) methods that combine per-task gradients. Their core is the pure
  function :meth:`GradientMethod.combine` ``(grads [K, P], losses [K]) -> [P]``: the update direction
  for the shared parameters before learning rate, global rescaling or clipping (the trainer applies
  those once, identically for every method).
* :class:`GramianWeighting` -- gradient methods whose direction is ``w @ grads`` with ``w`` a function
  of the Gramian ``G Gᵀ`` only; the engine may then compute just the Gramian.

Stateful methods use explicit trainer hooks: :meth:`Method.before_backward` (losses known, nothing
differentiated yet) and :meth:`Method.after_optimizer_step` (parameters updated; ``ctx`` can
re-evaluate the losses on the same batch). Their state goes through ``state_dict``/``load_state_dict``
so checkpoints resume exactly.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam, one_of
from mtlflow.core.numerics import gramian_float64
from mtlflow.methods._support import MethodGenerator, loss_bounds


class GradInput(enum.Enum):
    """What a method needs the gradient engine to compute."""

    LOSSES = "losses"                  # nothing beyond the losses (loss weighting)
    JACOBIAN = "jacobian"              # per-task gradients w.r.t. the shared parameters, [K, P]
    GRAMIAN = "gramian"                # only G Gᵀ, [K, K]
    REPRESENTATION = "representation"  # per-task gradients w.r.t. the shared features


#: Accepted by every method (not stored in ``hp``): which scale convention the trainer applies to its
#: update (see :attr:`Method.natural_scale` and :attr:`Method.reference_scale`).
SCALE_CONVENTION = HParam("sum", "scale of the update: 'sum' (the rule: on the scale of Σ L_i, x K for convex "
                          "combinations) or 'reference' (the convention of the method's reference code)",
                          one_of("sum", "reference"))


#: Declare this hyper-parameter (``hparams = {"update_weights_every": UPDATE_WEIGHTS_EVERY, ...}``) in a
#: :class:`GramianWeighting` method to let the trainer amortise its solver: the weights are solved every
#: N steps and reused in between, and on a reuse step the trainer computes no per-task gradient at all
#: (one backward pass of Σ w_i L_i, an O(1) step). Warm starts across solves are the method's business.
UPDATE_WEIGHTS_EVERY = HParam(1, "solve the task weights every N steps and reuse them in between (the trainer "
                              "then skips the per-task gradients: O(1) steps)", lambda v: v >= 1,
                              "an integer >= 1", kind=int)


@dataclass
class StepContext:
    """What the trainer tells a method hook about the current step."""

    step: int
    epoch: int
    losses: Tensor
    recompute_losses: Callable[[], Tensor]
    extra: dict[str, Any] = field(default_factory=dict)


class Method:
    """Base class of every registered method. Subclasses set the class attributes below."""

    name: ClassVar[str]
    family: ClassVar[str]
    cost: ClassVar[str]
    paper: ClassVar[str]
    equations: ClassVar[str] = ""
    hparams: ClassVar[dict[str, HParam]] = {}
    requires: ClassVar[GradInput] = GradInput.LOSSES
    #: The scale convention, one rule for every method: the update is on the scale of Σ_i L_i (linear
    #: scalarisation). A method whose loss weights or gradient weights sum to 1 (a convex combination:
    #: RLW, FAMO, MGDA, IMTL-G, UPGrad, ...) declares "mean" and the trainer multiplies its update by
    #: K (``RunConfig.rescale``, on by default); "sum" methods are used as they are.
    natural_scale: ClassVar[str] = "sum"
    #: The convention of the code the method is checked against (its official code, or LibMTL/TorchJD
    #: when the method's results were produced with those), used instead of ``natural_scale`` with
    #: ``--hp scale_convention=reference``; e.g. RLW, FAMO, IMTL-G and MoCo are "sum" there (plain
    #: softmax / simplex weights, no ×K). None: the reference uses the rule's scale.
    reference_scale: ClassVar[str | None] = None
    #: True for methods that own the whole training step (bilevel, Pareto-front learning):
    #: the trainer then calls :meth:`training_step` instead of its standard step.
    custom_step: ClassVar[bool] = False
    #: Why the method cannot run in library mode (:mod:`mtlflow.engine.library`: the user's own training
    #: loop hands over the losses, nothing else), or None when the losses and the gradients suffice.
    needs_trainer: ClassVar[str | None] = None
    #: True for methods that draw random numbers (RLW's weights, PCGrad's visiting orders, ...): they get
    #: ``self.rng``, a generator of their own, seeded by :func:`mtlflow.methods.build` from (run seed, method
    #: name) and checkpointed,
    #: so a resumed run draws what the uninterrupted one would have and the global RNG streams are untouched.
    stochastic: ClassVar[bool] = False
    #: The method's learnable per-task vectors, by attribute name, with their initial value (UW's
    #: log-variances start at 0): each is a leaf tensor of K entries; :meth:`parameters` hands them to the
    #: trainer's optimizer, :meth:`to` moves them, the state keeps them.
    learned: ClassVar[dict[str, float]] = {}

    def __init__(self, n_tasks: int, **hparams: Any):
        if not isinstance(n_tasks, int) or n_tasks < 1:
            raise InvalidParameterError(f"{self.name}: n_tasks must be a positive integer, got {n_tasks!r}")
        unknown = sorted(set(hparams) - set(self.hparams) - {"scale_convention"})
        if unknown:
            valid = ", ".join(sorted(self.hparams)) or "none"
            raise InvalidParameterError(f"{self.name}: unknown hyper-parameter(s) {', '.join(unknown)}; valid: "
                                        f"{valid} (and scale_convention, for every method)")
        self.n_tasks = n_tasks
        self.hp: dict[str, Any] = {}
        for key, spec in self.hparams.items():
            self.hp[key] = spec.coerce(self.name, key, hparams.get(key, spec.default))
        #: "sum" (default): the rule of ``natural_scale``; "reference": the reference code's convention
        self.scale_convention = SCALE_CONVENTION.coerce(self.name, "scale_convention",
                                                        hparams.get("scale_convention", "sum"))
        if self.scale_convention == "reference" and self.reference_scale is not None:
            self.natural_scale = self.reference_scale
        #: weights applied in the last step (for logging), if the method has any
        self.last_weights: Tensor | None = None
        self.rng = MethodGenerator(self.name) if self.stochastic else None
        for name, initial in self.learned.items():
            setattr(self, name, torch.full((n_tasks,), float(initial), requires_grad=True))
        #: lower bounds L^min of methods on shifted losses (those declaring ``min_losses``; see ``shifted_losses``)
        self.min_losses = loss_bounds(self.name, n_tasks, self.hp["min_losses"]) if "min_losses" in self.hp else None

    # -- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView) -> None:
        """Called once after the model is built and before the optimizer is created; a method may
        modify ``trainer.model`` here (e.g. inject adapters)."""

    def training_step(self, trainer: TrainerView, batch: Any, epoch: int) -> dict[str, Any]:
        """The whole step for ``custom_step`` methods; returns telemetry with at least ``losses``."""
        raise NotImplementedError(f"{self.name} does not define its own training step")

    def parameters(self) -> list[Tensor]:
        """Learnable parameters of the method that the trainer's optimizer updates (e.g. UW)."""
        return [getattr(self, name) for name in self.learned]

    def before_backward(self, ctx: StepContext) -> None:
        """Called once per step after the forward pass (and, for gradient methods, after the per-task
        gradients), before the method's update is applied."""

    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Called once per step after ``optimizer.step()``."""

    def on_epoch_end(self, epoch: int) -> None:
        """Called after every training epoch."""

    def shared_grad_max_norm(self) -> float | None:
        """A norm to which the trainer clips the shared parameters' gradient only (after its own global
        clipping), for methods whose official code clips there (Nash-MTL's ``max_norm``); None: none."""
        return None

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The learned tensors and the generator; methods with more state extend it."""
        state: dict[str, Any] = {name: getattr(self, name).detach().clone() for name in self.learned}
        if self.rng is not None:
            state["generator"] = self.rng.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.learned and self.rng is None:
            if state:
                raise ValueError(f"{self.name} has no state but received {sorted(state)}")
            return
        with torch.no_grad():
            for name in self.learned:
                getattr(self, name).copy_(state[name])
        if self.rng is not None:
            self.rng.load_state_dict(state["generator"])

    def to(self, device: torch.device | str) -> Method:
        # new leaves on the device; called before the trainer builds its optimizer
        for name in self.learned:
            setattr(self, name, getattr(self, name).detach().to(device).requires_grad_(True))
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hp.items())
        return f"{type(self).__name__}(n_tasks={self.n_tasks}{', ' if args else ''}{args})"


class LossWeighting(Method):
    """A method that reweights the losses; the gradient is that of :meth:`objective`."""

    requires = GradInput.LOSSES
    family = "loss-weighting"
    cost = "O(1)"

    def weights(self, losses: Tensor) -> Tensor:
        """The weights (detached, ``[K]``) the method applies to the losses at this step."""
        raise NotImplementedError

    def objective(self, losses: Tensor) -> Tensor:
        """The scalar the trainer back-propagates; by default Σ_i w_i L_i."""
        w = self.weights(losses.detach())
        self.last_weights = w
        return (w * losses).sum()


class GradientMethod(Method):
    """A method that maps the per-task gradients to one update direction."""

    requires = GradInput.JACOBIAN
    family = "gradient-manipulation"
    cost = "O(K)"

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        """Update direction ``[P]`` from per-task gradients ``[K, P]`` and losses ``[K]``."""
        raise NotImplementedError


class GramianWeighting(GradientMethod):
    """A gradient method whose direction is ``w @ grads`` with ``w = f(G Gᵀ, losses)``."""

    requires = GradInput.GRAMIAN

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        raise NotImplementedError

    def update_weights_every(self) -> int:
        """N of the ``update_weights_every`` hyper-parameter when the method declares it, else 1."""
        return int(self.hp.get("update_weights_every", 1))

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        # K x K problems are solved in float64 (mtlflow.core.numerics); the combination Σ w_i g_i
        # is accumulated in at least float32 so that bf16 gradients keep the weights' precision
        w = self.weights_from_gramian(gramian_float64(grads), losses)
        self.last_weights = w.detach()
        accumulate = torch.promote_types(grads.dtype, torch.float32)
        return (w.to(device=grads.device, dtype=accumulate) @ grads.to(accumulate)).to(grads.dtype)


def needs_full_jacobian(method: type[Method], grad_wrt: str = "parameters") -> bool:
    """True when ``method`` combines the full Jacobian w.r.t. the shared parameters (not just its Gramian)."""
    return (issubclass(method, GradientMethod) and not issubclass(method, GramianWeighting)
            and not method.custom_step and method.requires is not GradInput.REPRESENTATION
            and grad_wrt == "parameters")
