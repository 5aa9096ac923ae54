"""Small numerical solvers shared by gradient methods (all on K x K matrices).

* :func:`min_norm_weights` -- the min-norm point of the convex hull of the task gradients,
  min_w ||Σ w_i g_i||² over the simplex, from the Gramian (Sener & Koltun 2018, Eq. 3), either exactly
  with the ``quadprog`` active-set QP solver or with the paper's Frank–Wolfe procedure (Alg. 2).
* :func:`fairgrad_weights` -- the positive root of GᵀG w = w^(-1/α) (Ban & Ji 2024) with
  ``scipy.optimize.least_squares``, residual-checked; :func:`stationarity_margin` tells beforehand
  whether the gradients are Pareto-stationary (then no root exists).

Every Gramian goes through :func:`mtlflow.core.numerics.gramian_array` (float64, finite, PSD).

A missing solver raises :class:`~mtlflow.core.errors.SolverError`; a failed solve is never swallowed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.core.numerics import gramian_array


def _as_numpy(gramian: Tensor) -> np.ndarray:
    return gramian_array(gramian, "min-norm solver")


def two_task_min_norm(m11: float, m12: float, m22: float) -> float:
    """Weight γ on g_1 minimising ||γ g_1 + (1 - γ) g_2||² over [0, 1] (Sener & Koltun, Alg. 1)."""
    denom = m11 + m22 - 2.0 * m12
    if denom <= 0:
        return 0.5
    return float(np.clip((m22 - m12) / denom, 0.0, 1.0))


def min_norm_weights_frank_wolfe(gramian: Tensor, max_iter: int, tol: float) -> Tensor:
    """Frank–Wolfe solver of the min-norm problem as in Sener & Koltun (2018), Alg. 2.

    Starts from the best pair (closed form of Alg. 1), then repeatedly moves towards the vertex
    with the smallest (M w)_i with an exact line search, until the weights change by less than ``tol``.
    """
    m = _as_numpy(gramian)
    k = m.shape[0]
    if k == 1:
        return torch.ones(1, dtype=torch.float64)
    best, w = np.inf, np.full(k, 1.0 / k)
    for i in range(k):
        for j in range(i + 1, k):
            gamma = two_task_min_norm(m[i, i], m[i, j], m[j, j])
            cand = np.zeros(k)
            cand[i], cand[j] = gamma, 1.0 - gamma
            value = cand @ m @ cand
            if value < best:
                best, w = value, cand
    for _ in range(max_iter):
        mw = m @ w
        t = int(np.argmin(mw))
        # line search on the segment between v = Σ w g and g_t
        vv, vt, tt = float(w @ mw), float(mw[t]), float(m[t, t])
        gamma = two_task_min_norm(vv, vt, tt)  # weight kept on the current point v
        new_w = gamma * w
        new_w[t] += 1.0 - gamma
        if np.abs(new_w - w).sum() < tol:
            w = new_w
            break
        w = new_w
    return torch.from_numpy(w)


def min_norm_weights_qp(gramian: Tensor) -> Tensor:
    """Exact min-norm weights with the ``quadprog`` dual active-set QP solver."""
    try:
        import quadprog
    except ImportError:
        raise SolverError("MGDA's exact solver needs quadprog: pip install 'torchjd[quadprog-projector]' "
                          "or use solver='frank-wolfe'") from None
    m = _as_numpy(gramian)
    k = m.shape[0]
    if k == 1:
        return torch.ones(1, dtype=torch.float64)
    scale = float(np.max(np.diag(m)))
    if scale <= 0:
        return torch.full((k,), 1.0 / k, dtype=torch.float64)
    # quadprog needs a positive-definite matrix; a ridge far below the solver tolerance keeps the
    # optimum unchanged to ~1e-9 while allowing rank-deficient Gramians (K > rank).
    p = m / scale + 1e-10 * np.eye(k)
    constraints = np.concatenate([np.ones((k, 1)), np.eye(k)], axis=1)
    bounds = np.concatenate([[1.0], np.zeros(k)])
    try:
        w = quadprog.solve_qp(p, np.zeros(k), constraints, bounds, meq=1)[0]
    except ValueError as exc:
        raise SolverError(f"min-norm QP failed ({exc}); retry with solver='frank-wolfe'") from None
    w = np.clip(w, 0.0, None)
    return torch.from_numpy(w / w.sum())


#: Gradients whose min-norm point has squared norm at most this, in units of their correlation matrix,
#: count as Pareto-stationary for the α-fair solve: its weights grow like that norm^(-α/(α+1)), and
#: below it the least-squares solve no longer converges (measured: α = 0.5 fails from 5e-8 down).
FAIRGRAD_STATIONARITY_TOL = 1e-7
#: largest max_i |(GᵀG w)_i − w_i^(-1/α)| / w_i^(-1/α) accepted from the α-fair solve
FAIRGRAD_RESIDUAL_TOL = 1e-4
#: Gradients whose stationarity margin is at most this count as *nearly* Pareto-stationary when the α-fair
#: solve fails its residual check (FairGrad then takes the min-norm weights). The margin at which the solve
#: stops converging grows with the spread of the gradients' norms, which the correlation units of the margin
#: do not see: two gradients at an angle π − ε (margin sin²(ε/2)) with norms 1 and r fail, α = 0.5 or 1,
#: from margin 2e-10 down at r = 1, 3e-6 at r = 10³ (the 1e-7 pre-check passes them: a regression loss in
#: grams next to a classification loss), 8e-3 at r = 10⁴. Failures above it (measured from r = 10⁵ on, at
#: margins 0.02-0.4) are far from stationary and still raise.
FAIRGRAD_NEAR_STATIONARITY_TOL = 1e-2


class FairGradResidualError(SolverError):
    """The α-fair solve stopped without meeting :data:`FAIRGRAD_RESIDUAL_TOL`; ``residual`` is what it reached."""

    def __init__(self, message: str, residual: float):
        super().__init__(message)
        self.residual = residual


def stationarity_margin(gramian: np.ndarray) -> float:
    """min_i (C w)_i with C the correlation matrix of the gradients and w its min-norm weights: ‖Σ w_i u_i‖²
    (u_i the unit gradients), 0 exactly when 0 is in the convex hull of the gradients (Pareto-stationary);
    0 when a gradient is zero."""
    norms = np.sqrt(np.clip(np.diag(gramian), 0.0, None))
    if not np.all(norms > 0):
        return 0.0
    c = gramian / np.outer(norms, norms)
    w = min_norm_weights_qp(torch.from_numpy(c)).numpy()
    return max(float((c @ w).min()), 0.0)


def fairgrad_weights(gramian: Tensor | np.ndarray, alpha: float) -> tuple[Tensor, float]:
    """Solve GᵀG w = w^(-1/α) for w > 0 (Ban & Ji 2024, the α-fair optimality condition).

    ``scipy.optimize.least_squares`` (trust-region reflective, bounds (0, ∞), w₀ = 1/K) as in the
    official code, with Jacobian-scaled variables and tolerances 1e-15 (the official scipy defaults,
    1e-8, stop with residuals up to 1e-5 on ordinary inputs and ~1 close to the Pareto front).
    Returns the weights and the max relative residual |(GᵀG w)_i - w_i^(-1/α)| / w_i^(-1/α);
    raises :class:`FairGradResidualError` when that residual exceeds :data:`FAIRGRAD_RESIDUAL_TOL` (no
    solution exists at Pareto-stationary gradients, and near them the solve stops short: callers check
    :func:`stationarity_margin` against :data:`FAIRGRAD_STATIONARITY_TOL` first and against
    :data:`FAIRGRAD_NEAR_STATIONARITY_TOL` when it raises).
    """
    from scipy.optimize import least_squares

    m = gramian_array(gramian, "fairgrad")
    k = m.shape[0]
    # The equation is solved on the normalised Gramian Ã = A/s² (s² = mean diagonal) and mapped
    # back: if Ã u = u^(-1/α) then w = t·u with t = s^(-2α/(α+1)) solves A w = w^(-1/α). Without
    # this, scipy's absolute tolerances stop early for small gradients (late in training).
    scale = float(np.mean(np.diag(m)))
    if not scale > 0:
        raise SolverError("fairgrad: every task gradient is zero; the α-fair weights do not exist")
    m_unit = m / scale
    start = np.full(k, 1.0 / k)

    def residual(u: np.ndarray) -> np.ndarray:
        return m_unit @ u - np.power(u, -1.0 / alpha)

    def jac(u: np.ndarray) -> np.ndarray:
        return m_unit + np.diag(np.power(u, -1.0 / alpha - 1.0) / alpha)

    result = least_squares(residual, start, jac=jac, bounds=(0, np.inf), method="trf", x_scale="jac",
                           ftol=1e-15, xtol=1e-15, gtol=1e-15, max_nfev=1000 * k)
    u = result.x
    if not np.all(np.isfinite(u)) or not np.all(u > 0):
        raise SolverError("fairgrad: the least-squares solve returned non-positive or non-finite weights; "
                          "the task gradients may be degenerate")
    w = u * scale ** (-alpha / (alpha + 1.0))
    relative = float(np.max(np.abs(m @ w - np.power(w, -1.0 / alpha)) / np.power(w, -1.0 / alpha)))
    if not relative <= FAIRGRAD_RESIDUAL_TOL:
        raise FairGradResidualError(f"fairgrad: the α-fair solve stopped with relative residual {relative:.3g} "
                                    f"(> {FAIRGRAD_RESIDUAL_TOL:g})", relative)
    return torch.from_numpy(w), relative
