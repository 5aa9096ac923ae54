"""The rules every optimisation step follows, written once.

After a method has written its update into the parameters' ``.grad``, every step -- the trainer's own,
the steps of methods that own theirs (MOML/FORUM's ω step, PaLoRA's step over the preference rays)
and the toy runner's -- goes through the same sequence:

1. the update is on the scale of Σ_i L_i: :func:`update_scale` is the factor (K for a method whose
   weights sum to 1, ``Method.natural_scale == "mean"``, when the run rescales; 1 otherwise);
2. :func:`clip_gradients`: all parameters to ``clip_grad_norm`` (when set), then the shared parameters
   to the method's own ``shared_grad_max_norm`` (Nash-MTL's official clipping);
3. every callback's ``before_optimizer_step``, ``optimizer.step()``, the method's
   ``after_optimizer_step`` hook, every callback's ``after_optimizer_step`` (:func:`optimizer_step`).

Methods reach these rules through :class:`~mtlflow.core.callbacks.TrainerView` (``update_scale``,
``optimizer_step``), which the trainer implements with this module; they never import the engine.
Library mode (:mod:`mtlflow.engine.library`, the user's own loop and optimizer) applies the same scale,
finite-update check, amortisation rule (:func:`reuses_weights`) and clipping.

:class:`GradientMode` names what the engine computes for a step.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mtlflow.core.errors import NonFiniteLossError

if TYPE_CHECKING:
    from mtlflow.core.callbacks import StepState, TrainerView
    from mtlflow.methods.base import Method, StepContext


class GradientMode(StrEnum):
    """What the engine computes for a step: the trainer plans one mode per run (checked before training
    starts); a single step's mode is ``REUSE`` on the amortised steps. A ``StrEnum``: a member is its
    value in JSON (``bench.json``), tables and comparisons with the names these files hold."""

    CUSTOM = "custom"                  # the method owns its step (``custom_step``)
    LOSSES = "losses"                  # loss weighting: one backward pass of the objective
    JACOBIAN = "jacobian"              # per-task gradients w.r.t. the shared parameters (a Jacobian backend)
    GRAMIAN = "gramian"                # their Gramian only (autogram; Gramian-weighting methods)
    REPRESENTATION = "representation"  # per-task gradients w.r.t. the shared features
    REUSE = "reuse"                    # an amortised step: the last solved weights, no per-task gradient

    @property
    def computes_task_gradients(self) -> bool:
        """A mode that computes per-task gradient information, which an amortised step skips."""
        return self in _TASK_GRADIENT_MODES


_TASK_GRADIENT_MODES = frozenset({GradientMode.JACOBIAN, GradientMode.GRAMIAN, GradientMode.REPRESENTATION})


def update_scale(natural_scale: str, n_tasks: int, rescale: bool = True) -> float:
    """The factor of a method's update: K for "mean" methods (a convex combination) when ``rescale``
    is on, so that every method's step is on the scale of linear scalarisation Σ_i L_i; else 1."""
    return float(n_tasks) if rescale and natural_scale == "mean" else 1.0


def reuses_weights(update_weights_every: int, step: int, has_weights: bool) -> bool:
    """An amortised step of a Gramian-weighting method: its ``update_weights_every`` N > 1, weights were
    solved before and ``step`` is not a multiple of N; the step reuses the weights and computes no
    per-task gradient."""
    return update_weights_every > 1 and has_weights and step % update_weights_every != 0


def check_finite_update(method_name: str, update: Tensor, step: int) -> None:
    """Stop with a one-line error when a method's update holds NaN or Inf (the run diverged)."""
    if not torch.isfinite(update).all():
        raise NonFiniteLossError(f"{method_name} produced a non-finite update at step {step}; check the losses "
                                 "or lower --lr")


def clip_gradients(parameters: Iterable[Tensor], shared: Iterable[Tensor], clip_grad_norm: float | None,
                   method: Method) -> None:
    """Global clipping of ``parameters`` (``RunConfig.clip_grad_norm``), then the method's clipping of
    the shared parameters only, if it has one."""
    if clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(list(parameters), clip_grad_norm)
    shared_max_norm = method.shared_grad_max_norm()
    if shared_max_norm is not None:
        torch.nn.utils.clip_grad_norm_(list(shared), shared_max_norm)


def optimizer_step(trainer: TrainerView, state: StepState, ctx: StepContext | None = None) -> None:
    """Clip, then the optimizer step between the callbacks' hooks; ``ctx`` (when given) goes to the
    method's ``after_optimizer_step``."""
    clip_gradients(trainer.model.parameters(), trainer.shared, trainer.config.clip_grad_norm, trainer.method)
    for cb in trainer.callbacks:
        cb.before_optimizer_step(trainer, state)
    trainer.optimizer.step()
    if ctx is not None:
        trainer.method.after_optimizer_step(ctx)
    for cb in trainer.callbacks:
        cb.after_optimizer_step(trainer, state)
