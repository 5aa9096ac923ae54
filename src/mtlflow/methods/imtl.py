"""IMTL: impartial multi-task learning, loss part (IMTL-L) + gradient part (IMTL-G).

Liu et al., "Towards Impartial Multi-task Learning", ICLR 2021 (the hybrid IMTL). IMTL-L learns one
scale s_i per task (s = 0 at start) and trains on the scaled losses

    e^{s_i} L_i - s_i,      ∂/∂s_i = e^{s_i} L_i - 1   (so e^{s_i} L_i → 1),

the shared parameters follow IMTL-G (:mod:`mtlflow.methods.imtlg`) applied to the gradients of the
scaled losses e^{s_i} g_i, i.e. d = Σ_i α_i e^{s_i} g_i with equal projections of d onto every unit
task gradient, and head i follows ∇ e^{s_i} L_i.

Hooks: s is a method parameter (the trainer's optimizer, ``method_lr``); ``before_backward`` writes
its gradient e^{s} L - 1 from the step's losses; ``combine`` rescales head i's ``.grad`` (the plain
∇L_i from the trainer's Jacobian pass) by e^{s_i}. ``last_weights`` logs α_i e^{s_i}, the weights on
the raw task gradients. ``min_losses`` shifts losses that can be negative (e^s L - s has no minimum
in s when L ≤ 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.numerics import gramian_float64
from mtlflow.methods._support import (
    gramian_numpy,
    head_parameters,
    min_losses_hparam,
    scale_head_gradients,
    shifted_losses,
)
from mtlflow.methods.base import GradientMethod, StepContext
from mtlflow.methods.imtlg import imtlg_weights


class IMTL(GradientMethod):
    name = "imtl"
    paper = "Liu et al., Towards Impartial Multi-task Learning, ICLR 2021 (IMTL-L + IMTL-G)"
    equations = "IMTL-L: e^{s_i} L_i - s_i; IMTL-G on e^{s_i} g_i: d = Σ α_i e^{s_i} g_i"
    natural_scale = "mean"
    hparams = {"min_losses": min_losses_hparam()}
    learned = {"log_scales": 0.0}
    log_scales: Tensor

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.heads: Sequence[Sequence[Tensor]] | None = None

    def setup(self, trainer: TrainerView) -> None:
        self.heads = head_parameters(trainer)

    def scale_gradient(self, losses: Tensor) -> Tensor:
        """∂/∂s Σ_i (e^{s_i} L_i - s_i) = e^{s} L - 1."""
        shifted = shifted_losses(self.name, losses.detach(), self.min_losses)
        return torch.exp(self.log_scales.detach().to(shifted)) * shifted - 1.0

    def before_backward(self, ctx: StepContext) -> None:
        self.log_scales.grad = self.scale_gradient(ctx.losses).to(self.log_scales)

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        scales = torch.exp(self.log_scales.detach().to(grads))
        # the Gramian of the scaled rows e^{s_i} g_i (no scaled copy of the Jacobian)
        alpha = torch.from_numpy(imtlg_weights(gramian_numpy(gramian_float64(grads, scales), self.name))).to(grads)
        self.last_weights = (alpha * scales).detach()
        scale_head_gradients(self.heads, scales)
        return (alpha * scales) @ grads   # Σ_i α_i (e^{s_i} g_i)
