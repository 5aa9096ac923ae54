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

No Gramian and no [K, P] temporary: per coordinate only the sums of the positive and of the negative
entries matter (Σ_i g_i = S⁺ + S⁻, Σ_i |g_i| = S⁺ - S⁻, and the kept sign passes S⁺ or S⁻ whole), so J
is read block by block through one small buffer (fresh [K, P] temporaries made GradDrop's update a third
of the training step at K = 40, issue 29).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, unit_interval
from mtlflow.methods.base import GradientMethod

#: entries of J clamped at once by :func:`sign_sums` (its work buffer)
BLOCK = 1 << 20


def sign_sums(grads: Tensor) -> tuple[Tensor, Tensor]:
    """(S⁺, S⁻) per coordinate: Σ_i max(g_i, 0) and Σ_i min(g_i, 0), in ``grads``' dtype."""
    k, p = grads.shape
    positive = grads.new_empty(p)
    negative = grads.new_empty(p)
    ones = grads.new_ones(k)
    columns = max(1, min(p, BLOCK // max(k, 1)))
    buffer = grads.new_empty(k, columns)
    for start in range(0, p, columns):
        rows = grads[:, start:start + columns]
        part = buffer[:, :rows.shape[1]]
        torch.mv(torch.clamp(rows, min=0, out=part).T, ones, out=positive[start:start + columns])
        torch.mv(torch.clamp(rows, max=0, out=part).T, ones, out=negative[start:start + columns])
    return positive, negative


def purity_of(positive: Tensor, negative: Tensor) -> Tensor:
    """P = ½(1 + Σ_i g_i / Σ_i |g_i|) from the sign sums (½ where every g_i is 0)."""
    total, magnitude = positive + negative, positive - negative
    ratio = torch.where(magnitude > 0, total / torch.where(magnitude > 0, magnitude, 1.0), 0.0)
    return 0.5 * (1.0 + ratio)


def sign_purity(grads: Tensor) -> Tensor:
    """P = ½(1 + Σ_i g_i / Σ_i |g_i|) per coordinate (½ where every g_i is 0)."""
    return purity_of(*sign_sums(grads))


def graddrop_direction(grads: Tensor, uniform: Tensor, leak: float = 0.0) -> Tensor:
    """Σ_i (ℓ + (1 - ℓ) M_i) g_i for the thresholds ``uniform`` (one per coordinate): the kept sign's sum
    plus ℓ times the dropped ones' (both signs are dropped where P = U)."""
    positive, negative = sign_sums(grads)
    purity = purity_of(positive, negative)
    keep_positive, keep_negative = purity > uniform, purity < uniform
    kept = torch.where(keep_positive, positive, 0.0) + torch.where(keep_negative, negative, 0.0)
    dropped = torch.where(keep_positive, 0.0, positive) + torch.where(keep_negative, 0.0, negative)
    return kept + leak * dropped


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
