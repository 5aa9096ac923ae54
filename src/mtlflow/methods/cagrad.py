"""CAGrad: conflict-averse gradient descent.

Liu, Liu, Jin, Stone & Liu, "Conflict-Averse Gradient Descent for Multi-task Learning", NeurIPS 2021
(Algorithm 1). The update maximises the worst task improvement in a ball around the average
gradient g_0 = (1/K) Σ_i g_i:

    max_d min_i ⟨g_i, d⟩   s.t.  ‖d − g_0‖ ≤ r = c ‖g_0‖,    c ∈ [0, 1)  (c = 0.4 by default).

Its dual over the simplex, with A = GᵀG (the Gramian), b = 1/K and g_w = Σ_i w_i g_i,

    w* = argmin_{w ∈ Δ_K}  F(w) = wᵀA b + r √(wᵀA w)        (= g_wᵀg_0 + r ‖g_w‖),

gives the primal optimum d = g_0 + (r / ‖g_w*‖) g_w*, i.e. task weights b + (r/‖g_w*‖) w*.
c = 0 is gradient descent on the mean loss.

Solver. The Gramian is divided by its largest diagonal entry (the weights are scale-invariant; the
solvers' tolerances are absolute). K ≥ 3: with √x = min_{t>0} (x/t + t)/2,

    min_w F(w) = min_{t>0} φ(t),   φ(t) = min_{w ∈ Δ} wᵀA b + (r/2)(wᵀAw/t + t),

a jointly convex problem: for fixed t the inner problem is a QP over the simplex (``quadprog``, the
ridge 1e-10·I of MGDA's QP), and by the envelope theorem φ'(t) = (r/2)(1 − ‖g_w(t)‖²/t²), so t* is
the root of t − ‖g_w(t)‖ in (0, max_i ‖g_i‖], found by Brent's method (about ten QPs). This replaced
the official code's SLSQP on F, which took 0.5–2 s a step at K = 40 (CAGrad's update was 40–50 % of the
training step, issue 29); SLSQP remains the fallback when a QP fails. K = 2: the dual is
one-dimensional and its minimiser has a closed form (the official toy script uses a scalar
minimiser). Every solve is certified by weak duality: for any
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
from mtlflow.core.hparams import HParam, SearchRange, one_of, positive
from mtlflow.core.numerics import gramian_array
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


def parametric_qp_dual(a: np.ndarray, radius: float) -> np.ndarray:
    """argmin over the simplex of F(w) = wᵀA b + r √(wᵀAw) for ``a`` with largest diagonal entry 1: the QP
    min_w t wᵀA b + (r/2) wᵀAw at the root t* of t = ‖g_w(t)‖ (see the module docstring). When ‖g_w‖ stays
    below √DEGENERATE_TOL (0 in the hull of the gradients) the QP's weights at that t are returned."""
    import quadprog
    from scipy.optimize import brentq

    k = a.shape[0]
    ab = a.mean(axis=1)
    quadratic = radius * (a + 1e-10 * np.eye(k))   # quadprog needs a positive-definite matrix
    constraints = np.concatenate([np.ones((k, 1)), np.eye(k)], axis=1)
    bounds = np.concatenate([[1.0], np.zeros(k)])

    def weights_at(t: float) -> np.ndarray:
        w = np.clip(quadprog.solve_qp(quadratic, -t * ab, constraints, bounds, meq=1)[0], 0.0, None)
        return w / w.sum()

    def excess(t: float) -> float:   # t − ‖g_w(t)‖: the sign of φ'(t)
        w = weights_at(t)
        return t - float(np.sqrt(max(w @ a @ w, 0.0)))

    smallest = float(np.sqrt(DEGENERATE_TOL))
    if excess(smallest) >= 0:
        return weights_at(smallest)
    # at t = 1 = max_i ‖g_i‖ ≥ ‖g_w‖ the excess is ≥ 0: the root is bracketed
    return weights_at(brentq(excess, smallest, 1.0, xtol=1e-15, rtol=1e-14))


def dual_weights(a: np.ndarray, radius: float) -> np.ndarray:
    """The dual minimiser for K ≥ 3: the parametric QP, or SLSQP (the official code's solver) where a QP
    fails (both are certified by the duality gap afterwards)."""
    try:
        return parametric_qp_dual(a, radius)
    except ValueError:   # quadprog: "constraints are inconsistent" / "matrix G is not positive definite"
        return slsqp_dual(a, radius)


def cagrad_weights(a: np.ndarray, c: float, gap_tol: float) -> tuple[np.ndarray, float]:
    """Task weights of the CAGrad direction for the Gramian ``a`` and the certified relative duality gap."""
    k = a.shape[0]
    b = np.full(k, 1.0 / k)
    ab = a @ b
    scale = float(np.max(np.diag(a)))
    g0_sq = float(b @ ab)
    if k == 1 or c == 0 or not scale > 0 or not g0_sq > DEGENERATE_TOL * scale:
        return b, 0.0                      # d = g_0 (also when g_0 = 0: nothing to balance)
    a = a / scale                          # the solvers' tolerances are absolute
    ab, g0_sq = ab / scale, g0_sq / scale
    radius = c * np.sqrt(g0_sq)
    w = two_task_dual(a, radius) if k == 2 else dual_weights(a, radius)
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
                    lambda v: 0 <= v < 1, "in [0, 1)",
                    search=SearchRange("categorical", choices=(0.2, 0.4, 0.5, 0.8),
                                       source="Gama & Grassi 2025 grid {0.2, 0.5, 0.8} and the paper's 0.4")),
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
