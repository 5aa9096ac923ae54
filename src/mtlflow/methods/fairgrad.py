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
d = 0 as every other method. Every solve is residual-checked (``FAIRGRAD_RESIDUAL_TOL``); the official
code accepts whatever scipy returns. Near the front the solve can stop short even above that tolerance
(the weights grow without bound as the gradients approach stationarity, faster when their norms differ
by orders of magnitude): a solve that fails its residual check at gradients *nearly* stationary (margin at
most ``FAIRGRAD_NEAR_STATIONARITY_TOL``) also takes the min-norm weights, counted in ``stationary_steps``
and in ``near_stationary_steps`` and logged per epoch; one that fails farther from stationarity raises
:class:`~mtlflow.core.errors.SolverError`, naming the margin.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, SearchRange, positive
from mtlflow.core.numerics import gramian_array, one_blas_thread
from mtlflow.methods.base import GramianWeighting
from mtlflow.methods.solvers import (
    FAIRGRAD_NEAR_STATIONARITY_TOL,
    FAIRGRAD_STATIONARITY_TOL,
    FairGradResidualError,
    fairgrad_weights,
    min_norm_weights_qp,
    stationarity_margin,
)

log = logging.getLogger(__name__)


class FairGrad(GramianWeighting):
    name = "fairgrad"
    paper = "Ban & Ji, Fair Resource Allocation in Multi-Task Learning, ICML 2024"
    equations = "α-fair direction: GᵀG w = w^(-1/α), d = G w"
    natural_scale = "mean"
    hparams = {"alpha": HParam(1.0, "fairness exponent α (1 = proportional fairness)", positive,
                               search=SearchRange("log", 0.5, 5.0,
                                                  source="around the paper's α = 1 and the COST release's α = 2"))}

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        #: max relative residual of GᵀG w = w^(-1/α) in the last solve (None: no solve), for logging
        self.last_residual: float | None = None
        #: steps at which the gradients were Pareto-stationary (min-norm weights were used)
        self.stationary_steps = 0
        #: of those, the steps whose α-fair solve failed its residual check at nearly stationary gradients
        self.near_stationary_steps = 0
        #: (count, largest margin) of this epoch's near-stationary steps, for the epoch's log line
        self._epoch_near: tuple[int, float] = (0, 0.0)

    @one_blas_thread
    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        m = gramian_array(gramian, self.name)
        self.last_residual = None
        if not np.any(np.diag(m) > 0):
            return torch.zeros(self.n_tasks, dtype=torch.float64)   # every gradient is zero: d = 0
        margin = stationarity_margin(m)
        if margin <= FAIRGRAD_STATIONARITY_TOL:
            self.stationary_steps += 1
            return min_norm_weights_qp(torch.from_numpy(m))
        try:
            w, self.last_residual = fairgrad_weights(m, self.hp["alpha"])
        except FairGradResidualError as exc:
            if margin > FAIRGRAD_NEAR_STATIONARITY_TOL:
                raise FairGradResidualError(f"{exc}; the task gradients are not near Pareto-stationary "
                                            f"(stationarity margin {margin:.3g} > {FAIRGRAD_NEAR_STATIONARITY_TOL:g})",
                                            exc.residual) from None
            self.stationary_steps += 1
            self.near_stationary_steps += 1
            count, largest = self._epoch_near
            self._epoch_near = (count + 1, max(largest, margin))
            return min_norm_weights_qp(torch.from_numpy(m))
        return w

    def on_epoch_end(self, epoch: int) -> None:
        count, largest = self._epoch_near
        if count:
            log.info("fairgrad: %d step(s) of epoch %d took the min-norm weights: the α-fair solve did not converge "
                     "at nearly Pareto-stationary gradients (stationarity margin up to %.3g)", count, epoch, largest)
        self._epoch_near = (0, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"stationary_steps": self.stationary_steps, "near_stationary_steps": self.near_stationary_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stationary_steps = int(state.get("stationary_steps", 0))
        self.near_stationary_steps = int(state.get("near_stationary_steps", 0))
