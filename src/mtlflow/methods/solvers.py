"""Small numerical solvers shared by gradient methods (all on K x K matrices).

* :func:`min_norm_weights` -- the min-norm point of the convex hull of the task gradients,
  min_w ||Σ w_i g_i||² over the simplex, from the Gramian (Sener & Koltun 2018, Eq. 3), either exactly
  with the ``quadprog`` active-set QP solver or with the paper's Frank–Wolfe procedure (Alg. 2).
* :func:`fairgrad_weights` -- the positive root of GᵀG w = w^(-1/α) (Ban & Ji 2024) with
  ``scipy.optimize.least_squares``.

A missing solver raises :class:`~mtlflow.errors.SolverError`; a failed solve is never swallowed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.errors import SolverError


def _as_numpy(gramian: Tensor) -> np.ndarray:
    m = gramian.detach().to("cpu", torch.float64).numpy()
    if not np.all(np.isfinite(m)):
        raise SolverError("task-gradient Gramian contains NaN or Inf; check the losses and the learning rate")
    return 0.5 * (m + m.T)


def two_task_min_norm(m11: float, m12: float, m22: float) -> float:
    """Weight γ on g_1 minimising ||γ g_1 + (1 - γ) g_2||² over [0, 1] (Sener & Koltun, Alg. 1)."""
    denom = m11 + m22 - 2.0 * m12
    if denom <= 0:
        return 0.5
    return float(np.clip((m22 - m12) / denom, 0.0, 1.0))


def min_norm_weights_frank_wolfe(gramian: Tensor, max_iter: int = 250, tol: float = 1e-5) -> Tensor:
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


def fairgrad_weights(gramian: Tensor, alpha: float, x0: np.ndarray | None = None) -> tuple[Tensor, float]:
    """Solve GᵀG w = w^(-1/α) for w > 0 (Ban & Ji 2024, the α-fair optimality condition).

    Uses ``scipy.optimize.least_squares`` (trust-region reflective, bounds (0, ∞), w₀ = 1/K), as the
    official implementation does. Returns the weights and the max relative residual
    |(GᵀG w)_i - w_i^(-1/α)| / w_i^(-1/α).
    """
    from scipy.optimize import least_squares

    m = _as_numpy(gramian)
    k = m.shape[0]
    # The equation is solved on the normalised Gramian Ã = A/s² (s² = mean diagonal) and mapped
    # back: if Ã u = u^(-1/α) then w = t·u with t = s^(-2α/(α+1)) solves A w = w^(-1/α). Without
    # this, scipy's absolute tolerances stop early for small gradients (late in training).
    scale = float(np.mean(np.diag(m)))
    if not scale > 0:
        raise SolverError("FairGrad needs non-zero task gradients; all gradients are zero")
    m_unit = m / scale
    start = np.full(k, 1.0 / k) if x0 is None else np.asarray(x0, dtype=np.float64)

    def residual(u: np.ndarray) -> np.ndarray:
        return m_unit @ u - np.power(u, -1.0 / alpha)

    def jac(u: np.ndarray) -> np.ndarray:
        return m_unit + np.diag(np.power(u, -1.0 / alpha - 1.0) / alpha)

    result = least_squares(residual, start, jac=jac, bounds=(0, np.inf), method="trf")
    u = result.x
    if not np.all(np.isfinite(u)):
        raise SolverError("FairGrad's least-squares solve returned non-finite weights; "
                          "the task gradients may be zero or NaN")
    w = u * scale ** (-alpha / (alpha + 1.0))
    relative = np.abs(m @ w - np.power(w, -1.0 / alpha)) / np.power(w, -1.0 / alpha)
    return torch.from_numpy(w), float(np.max(relative))
