"""FairGrad: fair resource allocation in multi-task learning.

Ban & Ji, "Fair Resource Allocation in Multi-Task Learning", ICML 2024. The update maximises the
α-fair utility Σ_i (g_iᵀd)^(1-α)/(1-α) over a ball; with d = G w its optimality condition is

    GᵀG w = w^(-1/α)    (element-wise power),  w > 0,

solved with scipy's least_squares (trust-region reflective, bounds (0, ∞), w₀ = 1/K) as in the
official code. α = 1 (the paper's default, proportional fairness) gives w_i (GᵀG w)_i = 1, the
Nash-MTL fixed point; the COST release uses α = 2 in every script -- pass ``alpha=2.0`` for that.
The official code multiplies the direction by K before clipping; the trainer's global rescaling
does the same here (``natural_scale = "mean"``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from mtlflow.methods.base import GramianWeighting, HParam, positive
from mtlflow.methods.solvers import fairgrad_weights


class FairGrad(GramianWeighting):
    name = "fairgrad"
    paper = "Ban & Ji, Fair Resource Allocation in Multi-Task Learning, ICML 2024"
    equations = "α-fair direction: GᵀG w = w^(-1/α), d = G w"
    natural_scale = "mean"
    hparams = {
        "alpha": HParam(1.0, "fairness exponent α (1 = proportional fairness)", positive, "> 0"),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        #: max relative residual of GᵀG w = w^(-1/α) in the last solve, for logging
        self.last_residual: float | None = None

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        w, self.last_residual = fairgrad_weights(gramian, self.hp["alpha"])
        return w
