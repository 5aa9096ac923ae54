"""CAGrad's dual for K ≥ 3 (Liu et al. 2021, Alg. 1: w* = argmin_{w ∈ Δ} g_wᵀg_0 + c‖g_0‖ ‖g_w‖) is solved as a
parametric QP (issue 29: the official code's SLSQP took 0.5-2 s a step at K = 40). Checked against an
independent conic solve of the same dual (cvxpy/Clarabel), full-rank, rank-deficient (K > P) and with 0 in the
hull of the gradients, and without falling back to SLSQP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_helpers import jacobian

from mtlflow.methods import cagrad


def dual_objective(a: np.ndarray, radius: float, w: np.ndarray) -> float:
    return float(w @ a.mean(axis=1) + radius * np.sqrt(max(w @ a @ w, 0.0)))


def conic_dual(j: np.ndarray, radius: float) -> np.ndarray:
    """argmin over the simplex of wᵀ J g_0 + r ‖Jᵀw‖ (J scaled like the Gramian), as a second-order cone program."""
    import cvxpy as cp

    w = cp.Variable(j.shape[0])
    problem = cp.Problem(cp.Minimize(w @ (j @ j.mean(axis=0)) + radius * cp.norm(j.T @ w)), [w >= 0, cp.sum(w) == 1])
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return np.asarray(w.value)


@pytest.mark.parametrize("k,p", [(3, 7), (10, 50), (40, 300), (40, 12)])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("c", [0.2, 0.8])
def test_cagrad_parametric_qp_dual_reaches_the_conic_optimum_without_slsqp(k, p, seed, c, monkeypatch) -> None:
    def no_slsqp(a, radius):
        raise AssertionError("the parametric QP fell back to SLSQP")

    monkeypatch.setattr(cagrad, "slsqp_dual", no_slsqp)
    shared = jacobian(seed, 1, p)
    j = (shared + 0.7 * jacobian(50 + seed, k, p) * torch.linspace(0.3, 2.0, k, dtype=torch.float64)[:, None]).numpy()
    j = j / np.sqrt((j * j).sum(axis=1).max())           # largest diagonal of the Gramian: 1
    a = j @ j.T
    radius = c * np.sqrt(a.mean())
    w = cagrad.parametric_qp_dual(a, radius)
    assert w.min() >= 0 and w.sum() == pytest.approx(1.0, abs=1e-12)
    reference = conic_dual(j, radius)
    assert dual_objective(a, radius, w) <= dual_objective(a, radius, np.clip(reference, 0, None)) + 1e-9
    weights, gap = cagrad.cagrad_weights(a, c, 1e-6)
    assert abs(gap) <= 1e-8   # ≥ 0 up to rounding (weak duality)


def test_cagrad_parametric_qp_dual_at_a_zero_combination_returns_it() -> None:
    """g_1 + g_2 = 0 with g_3 such that F(w) = ⟨g_w, g_0⟩ + r‖g_w‖ ≥ 0 on the simplex (the Pareto-stationary case
    of the primal tests): the minimum F = 0 is at g_w = 0, the kink, where t* = 0."""
    g = np.array([[1.0, 2.0], [-1.0, -2.0], [3.0, -1.0]])
    a = g @ g.T / (g @ g.T).diagonal().max()
    radius = 0.4 * np.sqrt(a.mean())
    w = cagrad.parametric_qp_dual(a, radius)
    assert w @ a @ w <= cagrad.DEGENERATE_TOL
    # the solve stops at t = √DEGENERATE_TOL (t* = 0): F is within r·√DEGENERATE_TOL of the optimum, and the
    # method's weights then come from the dual-cone projection, not from w
    optimum = dual_objective(a, radius, conic_dual(g / np.sqrt(10.0), radius))
    assert dual_objective(a, radius, w) <= optimum + radius * np.sqrt(cagrad.DEGENERATE_TOL)
