"""FairGrad: fair resource allocation in multi-task learning.

Ban & Ji, "Fair Resource Allocation in Multi-Task Learning", ICML 2024. The update maximises the
α-fair utility Σ_i (g_iᵀd)^(1-α)/(1-α) over a ball; with d = G w its optimality condition is

    GᵀG w = w^(-1/α)    (element-wise power),  w > 0,

solved with scipy's least_squares (trust-region reflective, bounds (0, ∞), w₀ = 1/K) as in the
official code. α = 1 (the paper's default, proportional fairness) gives w_i (GᵀG w)_i = 1, the
Nash-MTL fixed point; the COST release uses α = 2 in every script -- pass ``alpha=2.0`` for that.
The official code multiplies the direction by K before clipping; the trainer's global rescaling
does the same here (``natural_scale = "mean"``).

Inputs without a solution are handled before the solve, as in Nash-MTL: at Pareto-stationary
gradients (0 in their convex hull: a zero task gradient, an anti-parallel pair; min-norm point below
``FAIRGRAD_STATIONARITY_TOL`` in correlation units) the weights are the min-norm (MGDA) weights, a
zero update at an exactly stationary point, counted in ``stationary_steps``; all-zero gradients give
d = 0 as every other method. Every solve is residual-checked (``FAIRGRAD_RESIDUAL_TOL``) and raises
:class:`~mtlflow.core.errors.SolverError` otherwise; the official code accepts whatever scipy returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, positive
from mtlflow.methods._numerics import gramian_array
from mtlflow.methods.base import GramianWeighting
from mtlflow.methods.solvers import (
    FAIRGRAD_STATIONARITY_TOL,
    fairgrad_weights,
    min_norm_weights_qp,
    stationarity_margin,
)


class FairGrad(GramianWeighting):
    name = "fairgrad"
    paper = "Ban & Ji, Fair Resource Allocation in Multi-Task Learning, ICML 2024"
    equations = "α-fair direction: GᵀG w = w^(-1/α), d = G w"
    natural_scale = "mean"
    hparams = {"alpha": HParam(1.0, "fairness exponent α (1 = proportional fairness)", positive)}

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        #: max relative residual of GᵀG w = w^(-1/α) in the last solve (None: no solve), for logging
        self.last_residual: float | None = None
        #: steps at which the gradients were Pareto-stationary (min-norm weights were used)
        self.stationary_steps = 0

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        m = gramian_array(gramian, self.name)
        self.last_residual = None
        if not np.any(np.diag(m) > 0):
            return torch.zeros(self.n_tasks, dtype=torch.float64)   # every gradient is zero: d = 0
        if stationarity_margin(m) <= FAIRGRAD_STATIONARITY_TOL:
            self.stationary_steps += 1
            return min_norm_weights_qp(torch.from_numpy(m))
        w, self.last_residual = fairgrad_weights(m, self.hp["alpha"])
        return w

    def state_dict(self) -> dict[str, Any]:
        return {"stationary_steps": self.stationary_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stationary_steps = int(state.get("stationary_steps", 0))
