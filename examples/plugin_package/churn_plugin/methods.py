"""Unit-gradient sum: every task's gradient scaled to unit norm, then summed.

d = Σ_i g_i / ‖g_i‖, i.e. the weights w_i = 1 / √G_ii of the Gramian G = J Jᵀ. It is the simplest remedy
for tasks whose gradients differ in scale (no task dominates by magnitude alone); it does nothing about
conflicting directions. Not from a paper: an example of a method written as one class. As a
:class:`~mtlflow.methods.base.GramianWeighting` it runs on every gradient backend (the Gramian-only ones
included), under COST, DDP and ``mtlflow bench``, like the built-in methods.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, positive
from mtlflow.methods.base import GramianWeighting


class UnitGradientSum(GramianWeighting):
    name = "unitsum"
    paper = "none: each task gradient normalised to unit length, then summed (an example plug-in)"
    equations = "d = Σ_i g_i / max(‖g_i‖, eps)"
    hparams = {"eps": HParam(1e-12, "norms below eps count as eps (a zero gradient gets weight 1/eps)", positive)}

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        return 1.0 / torch.diagonal(gramian).clamp_min(0).sqrt().clamp_min(self.hp["eps"])
