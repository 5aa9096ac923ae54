"""GradDrop: gradient sign dropout.

Chen, Ngiam, Huang, Luong, Kretzschmar, Chai & Anguelov, "Just Pick a Sign: Optimizing Deep Multitask
Models with Gradient Sign Dropout", NeurIPS 2020 (Alg. 1). Per coordinate, the gradient positive sign
purity

    P = ½ (1 + Σ_i g_i / Σ_i |g_i|)  ∈ [0, 1]

is compared with U ~ Uniform(0, 1): the positive sign is kept where P > U, the negative one where
P < U, and only the task gradients with the kept sign pass (the others are dropped):

    M_i = 1[P > U] 1[g_i > 0] + 1[P < U] 1[g_i < 0],     d = Σ_i (ℓ + (1 - ℓ) M_i) g_i,

with leak ℓ = 0 (the paper allows a leak per task; one leak for all tasks here).

The paper (and LibMTL, which refuses parameter gradients) applies GradDrop to gradients w.r.t. the
activations of a shared layer, summing sign-corrected gradients over the batch to compute P. Here it
acts on the rows of the per-task gradient matrix w.r.t. the shared parameters (the trainer's default
engine), like TorchJD's GradDrop aggregator, which the tests compare against. Coordinates where every
task gradient is zero get P = ½ (their output is 0 either way). U comes from a generator owned by
the method, seeded from the run seed and checkpointed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, unit_interval
from mtlflow.methods.base import GradientMethod


def sign_purity(grads: Tensor) -> Tensor:
    """P = ½(1 + Σ_i g_i / Σ_i |g_i|) per coordinate (½ where every g_i is 0)."""
    total = grads.sum(dim=0)
    magnitude = grads.abs().sum(dim=0)
    ratio = torch.where(magnitude > 0, total / torch.where(magnitude > 0, magnitude, 1.0), 0.0)
    return 0.5 * (1.0 + ratio)


def graddrop_direction(grads: Tensor, uniform: Tensor, leak: float = 0.0) -> Tensor:
    """Σ_i (ℓ + (1 - ℓ) M_i) g_i for the thresholds ``uniform`` (one per coordinate)."""
    purity = sign_purity(grads)
    keep = ((purity > uniform) & (grads > 0)) | ((purity < uniform) & (grads < 0))
    return ((leak + (1.0 - leak) * keep.to(grads.dtype)) * grads).sum(dim=0)


class GradDrop(GradientMethod):
    name = "graddrop"
    paper = ("Chen et al., Just Pick a Sign: Optimizing Deep Multitask Models with Gradient Sign Dropout, "
             "NeurIPS 2020")
    stochastic = True
    equations = "Alg. 1: P = ½(1 + Σg/Σ|g|), keep sign + where P > U, - where P < U; d = Σ (ℓ + (1-ℓ)M_i) g_i"
    hparams = {"leak": HParam(0.0, "leak ℓ: fraction of a dropped gradient that still passes", unit_interval,
                              "in [0, 1]")}

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        uniform = torch.rand(grads.shape[1], generator=self.rng.generator, dtype=torch.float64)
        return graddrop_direction(grads, uniform.to(grads), self.hp["leak"])
