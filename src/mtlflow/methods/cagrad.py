"""CAGrad: conflict-averse gradient descent.

Liu, Liu, Jin, Stone & Liu, "Conflict-Averse Gradient Descent for Multi-task Learning", NeurIPS 2021
(Algorithm 1). The update maximises the worst task improvement in a ball around the average
gradient g_0 = (1/K) Σ_i g_i:

    max_d min_i ⟨g_i, d⟩   s.t.  ‖d − g_0‖ ≤ r = c ‖g_0‖,    c ∈ [0, 1)  (c = 0.4 by default).

Its dual over the simplex, with A = GᵀG (the Gramian), b = 1/K and g_w = Σ_i w_i g_i,

    w* = argmin_{w ∈ Δ_K}  F(w) = wᵀA b + r √(wᵀA w)        (= g_wᵀg_0 + r ‖g_w‖),

gives the primal optimum d = g_0 + (r / ‖g_w*‖) g_w*, i.e. task weights b + (r/‖g_w*‖) w*.
c = 0 is gradient descent on the mean loss.

Solver. K ≥ 3: scipy's SLSQP as in the official code, with the analytic gradient, a tight tolerance
and the Gramian divided by its mean diagonal (the weights are scale-invariant; scipy's absolute
tolerances are not). K = 2: the dual is one-dimensional and its minimiser has a closed form (the
official toy script uses a scalar minimiser). Every solve is certified by weak duality: for any
w ∈ Δ and feasible d, min_i ⟨g_i, d⟩ ≤ ⟨g_w, d⟩ ≤ F(w), so F(w) − min_i ⟨g_i, d(w)⟩ ≥ 0 bounds the
suboptimality of both; when it exceeds ``gap_tol`` (relative to max_i ‖g_i‖²) the step raises
:class:`~mtlflow.core.errors.SolverError` instead of using an inaccurate solve silently.

Degenerate case: when g_w* = 0 (0 lies in the convex hull of the gradients, e.g. anti-parallel
gradients on a Pareto front) the formula is 0/0 and the primal optimum is not unique: every d in the
ball with min_i ⟨g_i, d⟩ = 0 is optimal. This implementation returns the one closest to g_0, the
projection of g_0 onto the dual cone {d : ⟨g_i, d⟩ ≥ 0 ∀i} (a QP on the Gramian, as in UPGrad). (The
official code's ``+1e-8`` returns g_0 itself there, which is not optimal when some ⟨g_i, g_0⟩ < 0.)

``rescale`` follows the official code: 0 returns d (Algorithm 1, the default here), 1 returns
d / (1 + c²) (the official multi-task default, also LibMTL's), 2 returns d / (1 + c) (the official toy
script, with c = 0.5). The direction is on the scale of the mean gradient: the trainer multiplies it
by K (the official FAMO/FairGrad copies do the same); with Adam, the default optimizer, a constant
factor only interacts with Adam's ε.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.core.hparams import HParam, one_of, positive
from mtlflow.methods._numerics import gramian_array
from mtlflow.methods.base import GramianWeighting
from mtlflow.methods.upgrad import dual_cone_weights

#: ‖g_w*‖² below this times max_i ‖g_i‖² counts as g_w* = 0 (0 in the convex hull of the gradients).
DEGENERATE_TOL = 1e-12


def _gramian_array(gramian: Tensor) -> np.ndarray:
    return gramian_array(gramian, "cagrad")


def two_task_dual(a: np.ndarray, radius: float) -> np.ndarray:
    """Exact minimiser over w = (t, 1 − t), t ∈ [0, 1], of F(w) = ⟨g_w, g_0⟩ + r ‖g_w‖ for K = 2.

    With u = g_1 − g_2 and g_w = g_2 + t u: ‖g_w‖² = s²/α + δ where s = αt + β, α = ‖u‖²,
    β = ⟨g_2, u⟩, δ = ‖g_2‖² − β²/α, and F'(t) = p + r s / √(s²/α + δ) with p = ⟨u, g_0⟩. F is convex,
    so the minimiser is the root of F' clipped to [0, 1], or an end point when F' has one sign.
    """
    alpha = a[0, 0] - 2.0 * a[0, 1] + a[1, 1]
    if not alpha > 1e-15 * max(a[0, 0], a[1, 1]):     # g_1 = g_2: F is constant
        return np.array([0.5, 0.5])
    beta = a[0, 1] - a[1, 1]
    delta = max(a[1, 1] - beta * beta / alpha, 0.0)
    p = float(a[0].mean() - a[1].mean())               # ⟨g_1, g_0⟩ − ⟨g_2, g_0⟩
    if p * p >= radius * radius * alpha:               # |F'| never vanishes: F' has the sign of p
        t = 0.0 if p > 0 else 1.0
    else:
        s = -np.sign(p) * np.sqrt(p * p * delta / (radius * radius - p * p / alpha))
        t = float(np.clip((s - beta) / alpha, 0.0, 1.0))
    return np.array([t, 1.0 - t])


def slsqp_dual(a: np.ndarray, radius: float) -> np.ndarray:
    """argmin over the simplex of F(w) = wᵀA b + r √(wᵀAw) with scipy's SLSQP (as the official code)."""
    from scipy.optimize import minimize

    k = a.shape[0]
    ab = a.mean(axis=1)

    def objective(w: np.ndarray) -> float:
        return float(w @ ab + radius * np.sqrt(max(w @ a @ w, 0.0)))

    def gradient(w: np.ndarray) -> np.ndarray:
        aw = a @ w
        norm = np.sqrt(max(w @ aw, 0.0))
        return ab + (radius / norm) * aw if norm > 0 else ab

    result = minimize(objective, np.full(k, 1.0 / k), jac=gradient, method="SLSQP", bounds=[(0.0, 1.0)] * k,
                      constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(k)}],
                      options={"ftol": 1e-15, "maxiter": 500})
    w = np.clip(np.asarray(result.x, dtype=np.float64), 0.0, None)
    if not (np.all(np.isfinite(w)) and w.sum() > 0):
        raise SolverError(f"cagrad: SLSQP returned invalid weights ({result.message})")
    return w / w.sum()


def cagrad_weights(a: np.ndarray, c: float, gap_tol: float) -> tuple[np.ndarray, float]:
    """Task weights of the CAGrad direction for the Gramian ``a`` and the certified relative duality gap."""
    k = a.shape[0]
    b = np.full(k, 1.0 / k)
    ab = a @ b
    scale = float(np.max(np.diag(a)))
    g0_sq = float(b @ ab)
    if k == 1 or c == 0 or not scale > 0 or not g0_sq > DEGENERATE_TOL * scale:
        return b, 0.0                      # d = g_0 (also when g_0 = 0: nothing to balance)
    a = a / scale                          # SLSQP's tolerances are absolute
    ab, g0_sq = ab / scale, g0_sq / scale
    radius = c * np.sqrt(g0_sq)
    w = two_task_dual(a, radius) if k == 2 else slsqp_dual(a, radius)
    gw_sq = float(w @ a @ w)
    if gw_sq > DEGENERATE_TOL:
        weights = b + (radius / np.sqrt(gw_sq)) * w
    else:                                  # 0 in the hull: project g_0 onto the dual cone
        weights = dual_cone_weights(a + DEGENERATE_TOL * np.eye(k), b)
    dual_value = float(w @ ab + radius * np.sqrt(max(gw_sq, 0.0)))
    gap = dual_value - float((a @ weights).min())
    if not gap <= gap_tol:
        raise SolverError(f"cagrad: the dual solve is {gap:.2g} (relative duality gap) away from the optimum; "
                          "the task gradients may be degenerate")
    return weights, gap


class CAGrad(GramianWeighting):
    name = "cagrad"
    paper = "Liu et al., Conflict-Averse Gradient Descent for Multi-task Learning, NeurIPS 2021"
    equations = ("Alg. 1: max_d min_i <g_i,d> s.t. ||d-g_0|| <= c||g_0||; dual over the simplex, "
                 "d = g_0 + c||g_0||/||g_w|| g_w")
    natural_scale = "mean"
    hparams = {
        "c": HParam(0.4, "radius of the ball around g_0, in units of ‖g_0‖ (0 = mean-gradient descent)",
                    lambda v: 0 <= v < 1, "in [0, 1)"),
        "rescale": HParam(0, "0: d (Algorithm 1); 1: d/(1+c²) (official multi-task code); 2: d/(1+c) (toy)",
                          one_of(0, 1, 2)),
        "gap_tol": HParam(1e-6, "largest accepted duality gap of the dual solve, relative to max ‖g_i‖²",
                          positive),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        #: certified relative duality gap of the last solve, for logging
        self.last_gap: float | None = None

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        c = self.hp["c"]
        weights, self.last_gap = cagrad_weights(_gramian_array(gramian), c, self.hp["gap_tol"])
        divisor = {0: 1.0, 1: 1.0 + c ** 2, 2: 1.0 + c}[self.hp["rescale"]]
        return torch.from_numpy(weights / divisor)
