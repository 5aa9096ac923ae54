"""Defining properties of CAGrad, Nash-MTL, MoCo, Aligned-MTL, UPGrad and ExcessMTL.

Each method is checked against an independent solve or a closed form (CAGrad: the primal SOCP with
cvxpy/Clarabel and dense sampling of the ball; Nash-MTL: the bargaining fixed point, FairGrad's
least-squares solver, the two-task closed form; Aligned-MTL: singular values of the aligned
Jacobian; UPGrad: the non-conflict and linearity properties; MoCo: convergence to the MGDA weights;
ExcessMTL: hand-computed updates), against TorchJD's aggregators where they exist, and for a
missing solver, invalid hyper-parameters and exact state round trips.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mtlflow import jobs, methods
from mtlflow.core.errors import InvalidParameterError, SolverError
from mtlflow.methods._cvx import solve_checked
from mtlflow.methods.alignedmtl import balance_transform
from mtlflow.methods.moco import project_to_simplex
from mtlflow.methods.solvers import fairgrad_weights, min_norm_weights_qp

MINE = ["cagrad", "nashmtl", "moco", "alignedmtl", "upgrad", "excessmtl"]


def jacobian(seed: int, k: int, p: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(k, p, generator=gen, dtype=torch.float64) * scale


def direction(name: str, grads: torch.Tensor, **hparams: Any) -> tuple[np.ndarray, methods.Method]:
    method = methods.build(name, grads.shape[0], **hparams)
    d = method.combine(grads, torch.ones(grads.shape[0], dtype=grads.dtype))
    return d.numpy(), method


# Full-rank (K ≤ P) and rank-deficient (K > P) Jacobians.
FULL_RANK = [(0, 2, 3), (1, 2, 40), (2, 3, 10), (3, 4, 4), (4, 5, 30), (5, 8, 20)]
DEFICIENT = [(6, 5, 3), (7, 8, 2), (8, 3, 2)]


# -- CAGrad --------------------------------------------------------------------------------------

def cagrad_primal(j: np.ndarray, c: float) -> np.ndarray:
    """argmax_d min_i ⟨g_i, d⟩ s.t. ‖d − g_0‖ ≤ c‖g_0‖, solved directly in ℝ^P with cvxpy/Clarabel."""
    import cvxpy as cp

    g0 = j.mean(axis=0)
    d, t = cp.Variable(j.shape[1]), cp.Variable()
    problem = cp.Problem(cp.Maximize(t), [j @ d >= t, cp.norm(d - g0) <= c * np.linalg.norm(g0)])
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert problem.status in ("optimal", "optimal_inaccurate")
    return np.asarray(d.value)


@pytest.mark.parametrize("c", [0.2, 0.4, 0.8])
@pytest.mark.parametrize("seed,k,p", FULL_RANK + DEFICIENT)
def test_cagrad_direction_is_the_primal_optimum(seed: int, k: int, p: int, c: float) -> None:
    j = jacobian(seed, k, p)
    j = j / j.mean(dim=0).norm()              # ‖g_0‖ = 1: tolerances in units of ‖g_0‖
    d, method = direction("cagrad", j, c=c)
    reference = cagrad_primal(j.numpy(), c)
    g0 = j.numpy().mean(axis=0)
    # d lies on the sphere of radius c‖g_0‖ and is as good as the independent solve
    assert np.linalg.norm(d - g0) == pytest.approx(c, abs=1e-9)
    assert (j.numpy() @ d).min() >= (j.numpy() @ reference).min() - 1e-6
    np.testing.assert_allclose(d, reference, atol=2e-5)
    # the logged weights give the direction, and the dual solve was certified
    np.testing.assert_allclose(method.last_weights.numpy() @ j.numpy(), d, atol=1e-12)
    assert method.last_gap is not None and method.last_gap <= 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_cagrad_two_tasks_matches_dense_sampling_of_the_ball(seed: int) -> None:
    j = jacobian(100 + seed, 2, 2)
    d, _ = direction("cagrad", j, c=0.5)
    g = j.numpy()
    g0 = g.mean(axis=0)
    radius = 0.5 * np.linalg.norm(g0)
    # the optimum is on the circle (a linear-min objective has no interior maximum)
    angles = np.linspace(0.0, 2 * np.pi, 400_001)
    points = g0[None, :] + radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    values = (points @ g.T).min(axis=1)
    best = points[np.argmax(values)]
    assert (g @ d).min() >= values.max() - 1e-9
    np.testing.assert_allclose(d, best, atol=1e-4 * np.linalg.norm(g0))


def test_cagrad_rescale_options_and_c_zero() -> None:
    j = jacobian(11, 3, 7)
    d0, _ = direction("cagrad", j, c=0.4, rescale=0)
    d1, _ = direction("cagrad", j, c=0.4, rescale=1)
    d2, _ = direction("cagrad", j, c=0.4, rescale=2)
    np.testing.assert_allclose(d1, d0 / 1.16, rtol=1e-12)
    np.testing.assert_allclose(d2, d0 / 1.4, rtol=1e-12)
    dc0, _ = direction("cagrad", j, c=0.0)
    np.testing.assert_allclose(dc0, j.numpy().mean(axis=0), rtol=1e-12)


def test_cagrad_weights_are_scale_invariant() -> None:
    j = jacobian(12, 4, 9)
    _, small = direction("cagrad", j * 1e-4)
    _, large = direction("cagrad", j * 1e4)
    np.testing.assert_allclose(small.last_weights.numpy(), large.last_weights.numpy(), rtol=1e-6)


@pytest.mark.parametrize("grads", [
    [[1.0, 2.0], [-1.0, -2.0], [3.0, -1.0]],     # g_1 + g_2 = 0
    [[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.5, -1.0, 1.0]],
])
def test_cagrad_pareto_stationary_returns_the_optimum_closest_to_g0(grads: list) -> None:
    import cvxpy as cp

    j = torch.tensor(grads, dtype=torch.float64)
    d, _ = direction("cagrad", j)
    g = j.numpy()
    g0 = g.mean(axis=0)
    # g_w* = 0: the optimal value is 0 and every d in the ball with min_i ⟨g_i, d⟩ = 0 is optimal;
    # the returned one is the projection of g_0 onto the dual cone {d : Gd ≥ 0}
    x = cp.Variable(g.shape[1])
    cp.Problem(cp.Minimize(cp.sum_squares(x - g0)), [g @ x >= 0]).solve(solver="CLARABEL")
    np.testing.assert_allclose(d, x.value, atol=1e-6)
    assert (g @ d).min() >= -1e-9 and np.linalg.norm(d - g0) <= 0.4 * np.linalg.norm(g0)


@pytest.mark.parametrize("seed", range(8))
def test_cagrad_two_task_closed_form_dual_matches_slsqp(seed: int) -> None:
    from mtlflow.methods.cagrad import slsqp_dual, two_task_dual

    j = jacobian(400 + seed, 2, 1 + seed)
    a = (j @ j.T).numpy()
    a = a / a.diagonal().max()
    radius = 0.4 * np.sqrt(a.mean())

    def dual(w: np.ndarray) -> float:
        return float(w @ a.mean(axis=1) + radius * np.sqrt(w @ a @ w))

    assert dual(two_task_dual(a, radius)) <= dual(slsqp_dual(a, radius)) + 1e-12


def test_cagrad_uncertified_solve_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import mtlflow.methods.cagrad as cagrad

    # a dual solver that stops at the start point: the duality-gap certificate must catch it
    monkeypatch.setattr(cagrad, "slsqp_dual", lambda a, radius: np.full(a.shape[0], 1.0 / a.shape[0]))
    with pytest.raises(SolverError, match="duality gap"):
        direction("cagrad", jacobian(13, 3, 2) * torch.tensor([[1.0], [-1.0], [0.2]], dtype=torch.float64))


def test_cagrad_matches_torchjd() -> None:
    from torchjd.aggregation import CAGrad as TorchJDCAGrad

    worst = 0.0
    for seed, k, p in FULL_RANK:
        j = jacobian(seed, k, p)
        j = j / j.mean(dim=0).norm()
        d, _ = direction("cagrad", j, c=0.4)
        # TorchJD solves the same dual with cvxpy/Clarabel at default tolerances on the
        # trace-normalised Gramian; its weights are 1/K + (c‖g_0‖/‖g_w‖) w as here (rescale 0)
        reference = TorchJDCAGrad(c=0.4, norm_eps=0.0)(j).numpy()
        worst = max(worst, float(np.linalg.norm(d - reference)))
    assert worst <= 1e-3, worst


# -- Nash-MTL ------------------------------------------------------------------------------------

def nash(grads: torch.Tensor, **hparams: Any) -> tuple[np.ndarray, np.ndarray, methods.Method]:
    d, method = direction("nashmtl", grads, **hparams)
    return method.last_weights.numpy(), d, method


@pytest.mark.parametrize("seed,k,p", FULL_RANK + [(9, 6, 6), (10, 10, 50)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_nashmtl_solves_the_bargaining_fixed_point(seed: int, k: int, p: int, scale: float) -> None:
    grads = jacobian(seed, k, p, scale)
    alpha, d, method = nash(grads, two_task_closed_form=False)   # the CCCP for every K
    m = (grads @ grads.T).numpy()
    assert np.all(alpha > 0)
    np.testing.assert_allclose(alpha * (m @ alpha), np.ones(k), atol=1e-5)
    # consequences: every task improves, g_iᵀd = 1/α_i, and ‖d‖² = K
    np.testing.assert_allclose(grads.numpy() @ d, 1.0 / alpha, rtol=1e-5)
    assert d @ d == pytest.approx(k, rel=1e-5)
    assert 1 <= method.last_iterations <= 20 and method.last_residual <= 1e-5


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_nashmtl_agrees_with_fairgrad_least_squares(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    alpha, _, _ = nash(grads, two_task_closed_form=False)
    # FairGrad with α = 1 solves the same equation with scipy's least_squares: an independent solver
    reference, _ = fairgrad_weights(grads @ grads.T, 1.0)
    np.testing.assert_allclose(alpha, reference.numpy(), rtol=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_nashmtl_two_task_closed_form_equals_cccp(seed: int) -> None:
    grads = jacobian(200 + seed, 2, 5, scale=10.0 ** (seed - 3))
    closed, _, method = nash(grads)
    assert method.last_iterations == 0
    cccp, _, _ = nash(grads, two_task_closed_form=False)
    np.testing.assert_allclose(closed, cccp, rtol=1e-6)
    g1, g2 = grads.numpy()
    cos = g1 @ g2 / (np.linalg.norm(g1) * np.linalg.norm(g2))
    np.testing.assert_allclose(closed, 1 / (np.linalg.norm(grads.numpy(), axis=1) * np.sqrt(1 + cos)), rtol=1e-12)


def test_nashmtl_warm_start_keeps_solving_the_fixed_point() -> None:
    method = methods.build("nashmtl", 4)
    grads = jacobian(20, 4, 12)
    gen = torch.Generator().manual_seed(21)
    for _ in range(6):  # a slowly moving Jacobian, as in training
        grads = grads + 0.05 * torch.randn(grads.shape, generator=gen, dtype=torch.float64)
        method.combine(grads, torch.ones(4, dtype=torch.float64))
        alpha = method.last_weights.numpy()
        np.testing.assert_allclose(alpha * ((grads @ grads.T).numpy() @ alpha), np.ones(4), atol=1e-5)


def test_nashmtl_pareto_stationary_gradients_use_min_norm_weights() -> None:
    # 0 = g_1 + g_2 + g_3 is in the convex hull: no bargaining solution exists
    g = jacobian(30, 2, 6)
    grads = torch.cat([g, -g.sum(dim=0, keepdim=True)])
    method = methods.build("nashmtl", 3)
    d = method.combine(grads, torch.ones(3, dtype=torch.float64))
    assert method.stationary_steps == 1
    assert float(d.norm()) <= 1e-6 * float(grads.norm())
    np.testing.assert_allclose(method.last_weights.numpy(), min_norm_weights_qp(grads @ grads.T).numpy())
    # two exactly anti-parallel gradients (the toy's Pareto front), and a zero gradient
    for grads in (torch.tensor([[1.0, 2.0], [-3.0, -6.0]], dtype=torch.float64),
                  torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)):
        method = methods.build("nashmtl", 2)
        d = method.combine(grads, torch.ones(2, dtype=torch.float64))
        assert method.stationary_steps == 1 and float(d.norm()) <= 1e-8


def test_nashmtl_missing_solver_raises() -> None:
    import cvxpy

    if "ECOS" in cvxpy.installed_solvers():
        pytest.skip("ECOS is installed here; the missing-solver case needs a machine without it")
    with pytest.raises(SolverError) as exc:
        methods.build("nashmtl", 3, solver="ECOS")
    message = str(exc.value)
    assert "ECOS is not installed" in message and "pip install ecos" in message
    assert "solver=CLARABEL" in message and "\n" not in message and exc.value.exit_code == 5


def test_nashmtl_missing_default_solver_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import cvxpy

    monkeypatch.setattr(cvxpy, "installed_solvers", lambda: ["OSQP"])
    with pytest.raises(SolverError, match="CLARABEL is not installed"):
        methods.build("nashmtl", 2)


def test_nashmtl_rejects_solvers_without_exponential_cones() -> None:
    with pytest.raises(InvalidParameterError, match="solver"):
        methods.build("nashmtl", 2, solver="OSQP")


def test_a_non_optimal_status_raises() -> None:
    import cvxpy as cp

    x = cp.Variable()
    infeasible = cp.Problem(cp.Minimize(x), [x >= 1, x <= 0])
    with pytest.raises(SolverError, match="status 'infeasible'"):
        solve_checked(infeasible, "CLARABEL", "nashmtl")


def test_nashmtl_against_torchjd_when_ecos_is_available() -> None:
    from torchjd.aggregation import NashMTL as TorchJDNashMTL

    try:
        aggregator = TorchJDNashMTL(n_tasks=3, max_norm=0.0)
    except ImportError as exc:
        pytest.skip(f"TorchJD's NashMTL needs cvxpy + ECOS (pip install 'torchjd[nash_mtl]'), and ECOS is not "
                    f"installed here: {exc}")
    grads = jacobian(40, 3, 10)
    _, d, _ = nash(grads)
    # TorchJD copies the official solve (ECOS, α in unnormalised units, stop at ‖G_n α − 1/α‖ < 1e-3),
    # so it reaches the same fixed point only approximately
    np.testing.assert_allclose(aggregator(grads).numpy(), d, rtol=1e-2, atol=1e-2)


# -- Aligned-MTL ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scale_mode", ["min", "median", "rmse"])
@pytest.mark.parametrize("seed,k,p", FULL_RANK + DEFICIENT)
def test_alignedmtl_aligned_jacobian_has_equal_singular_values(seed: int, k: int, p: int, scale_mode: str) -> None:
    j = jacobian(seed, k, p) * torch.logspace(-2, 2, k, dtype=torch.float64)[:, None]  # ill-conditioned
    gramian = j @ j.T
    b = balance_transform(gramian, scale_mode)
    aligned = (b @ j).numpy()
    singular = np.linalg.svd(j.numpy(), compute_uv=False)
    rank = int(np.sum(singular > singular[0] * max(k, p) * 1e-12))
    aligned_singular = np.linalg.svd(aligned, compute_uv=False)
    # condition number 1 on the row space, zeros elsewhere
    np.testing.assert_allclose(aligned_singular[:rank], aligned_singular[0], rtol=1e-8)
    assert np.all(aligned_singular[rank:] <= 1e-8 * aligned_singular[0])
    sigma_sq = {"min": singular[rank - 1] ** 2, "median": np.median(singular[:rank] ** 2),
                "rmse": np.mean(singular[:rank] ** 2)}[scale_mode]
    if scale_mode != "median" or rank % 2 == 1:  # torch's median is the lower one for even counts
        assert aligned_singular[0] == pytest.approx(math.sqrt(sigma_sq), rel=1e-8)
    # the update is the aligned Jacobian applied to the preference 1/K
    d, _ = direction("alignedmtl", j, scale_mode=scale_mode)
    np.testing.assert_allclose(d, aligned.T @ np.full(k, 1.0 / k), atol=1e-10 * np.abs(aligned).max())


@pytest.mark.parametrize("scale_mode", ["min", "median", "rmse"])
def test_alignedmtl_matches_torchjd(scale_mode: str) -> None:
    from torchjd.aggregation import AlignedMTLWeighting

    for seed, k, p in FULL_RANK + DEFICIENT:
        j = jacobian(seed, k, p)
        _, method = direction("alignedmtl", j, scale_mode=scale_mode)
        reference = AlignedMTLWeighting(scale_mode=scale_mode)(j @ j.T)
        np.testing.assert_allclose(method.last_weights.numpy(), reference.numpy(), rtol=1e-9, atol=1e-12)


# -- UPGrad --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,k,p", FULL_RANK + DEFICIENT)
def test_upgrad_matches_torchjd(seed: int, k: int, p: int) -> None:
    from torchjd._linalg import QuadprogProjector
    from torchjd.aggregation import UPGrad as TorchJDUPGrad

    j = jacobian(seed, k, p)
    d, _ = direction("upgrad", j, solver="quadprog")
    # TorchJD's defaults except norm_eps = 0 (TorchJD zeroes Gramians with trace < 1e-4)
    reference = TorchJDUPGrad(projector=QuadprogProjector(norm_eps=0.0, reg_eps=1e-4))(j).numpy()
    np.testing.assert_allclose(d, reference, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_upgrad_is_non_conflicting(seed: int, k: int, p: int) -> None:
    j = jacobian(seed, k, p) - 0.5 * jacobian(seed + 1, 1, p)   # shared component: some conflicts
    g = j.numpy()
    exact, _ = direction("upgrad", j)
    assert (g @ exact).min() >= -1e-10 * np.abs(g).max() ** 2
    unridged, _ = direction("upgrad", j, solver="quadprog", reg_eps=0.0)
    np.testing.assert_allclose(exact, unridged, rtol=1e-7, atol=1e-10)
    # with TorchJD's ridge the violation is bounded by reg_eps · w_i · trace(G)
    d, method = direction("upgrad", j, solver="quadprog")
    bound = 1e-4 * method.last_weights.numpy() * float(np.trace(g @ g.T))
    assert np.all(g @ d >= -bound - 1e-12)


def test_upgrad_is_linear_under_scaling_and_the_mean_without_conflict() -> None:
    j = jacobian(50, 3, 8)
    gen = torch.Generator().manual_seed(51)
    c1 = torch.rand(3, generator=gen, dtype=torch.float64) + 0.1
    c2 = torch.rand(3, generator=gen, dtype=torch.float64) + 0.1

    def upgrad(c: torch.Tensor) -> np.ndarray:
        return direction("upgrad", c[:, None] * j)[0]

    np.testing.assert_allclose(upgrad(c1 + c2), upgrad(c1) + upgrad(c2), rtol=1e-7, atol=1e-9)
    # gradients with pairwise non-negative inner products are already in the dual cone
    aligned = torch.abs(jacobian(52, 4, 6))
    d, _ = direction("upgrad", aligned)
    np.testing.assert_allclose(d, aligned.numpy().mean(axis=0), rtol=1e-9)


# -- MoCo ----------------------------------------------------------------------------------------

def test_moco_tracks_constant_gradients_with_decaying_steps() -> None:
    j = jacobian(60, 3, 5)
    method = methods.build("moco", 3, beta=0.5, beta_sigma=0.5)
    remaining = 1.0
    for step in range(1, 6):
        method.combine(j, torch.ones(3, dtype=torch.float64))
        remaining *= 1 - 0.5 / step ** 0.5
        # y = (1 − Π_k (1 − β_k)) h from y = 0
        torch.testing.assert_close(method.tracked, (1 - remaining) * j, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_moco_converges_to_the_min_norm_weights_on_a_fixed_jacobian(rho: float) -> None:
    j = jacobian(61, 3, 10)
    j = j / j.norm(dim=1, keepdim=True)   # unit gradients: γ_k ‖YYᵀ‖ < 2
    method = methods.build("moco", 3, gamma=0.5, gamma_sigma=0.0, rho=rho)
    for _ in range(3000):
        d = method.combine(j, torch.ones(3, dtype=torch.float64))
    expected = min_norm_weights_qp(j @ j.T + rho * torch.eye(3, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(method.last_weights.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(d.numpy(), expected @ j.numpy(), atol=1e-6)


def test_moco_simplex_projection_is_the_euclidean_projection() -> None:
    import quadprog

    gen = torch.Generator().manual_seed(62)
    for _ in range(20):
        v = torch.randn(5, generator=gen, dtype=torch.float64) * 2
        # min ½‖x − v‖² s.t. Σx = 1, x ≥ 0
        constraints = np.concatenate([np.ones((5, 1)), np.eye(5)], axis=1)
        reference = quadprog.solve_qp(np.eye(5), v.numpy(), constraints, np.r_[1.0, np.zeros(5)], meq=1)[0]
        np.testing.assert_allclose(project_to_simplex(v).numpy(), np.clip(reference, 0, None), atol=1e-10)


def test_moco_authors_code_variants_first_step() -> None:
    j = jacobian(63, 2, 4)
    losses = torch.tensor([0.7, 2.0], dtype=torch.float64)
    method = methods.build("moco", 2, lambda_update="softmax", normalize_grads=True, step_scale="none")
    d = method.combine(j, losses)
    h = j / (j.norm(dim=1, keepdim=True) + 1e-8) * losses[:, None]
    y = 0.5 * h                                          # β_1 = 0.5 from y = 0
    start = torch.full((2,), 0.5, dtype=torch.float64)
    lam = torch.softmax(start - 0.1 * (y @ y.T) @ start, dim=0)     # γ_1 = 0.1, ρ = 0
    torch.testing.assert_close(method.last_weights, lam)
    torch.testing.assert_close(d, lam @ y)


# -- ExcessMTL -----------------------------------------------------------------------------------

def test_excessmtl_hand_computed_first_two_steps() -> None:
    g1 = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, -1.0]], dtype=torch.float64)
    g2 = torch.tensor([[0.1, 0.2, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    method = methods.build("excessmtl", 2, robust_step_size=0.5)
    d1 = method.combine(g1, torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, torch.tensor([0.5, 0.5], dtype=torch.float64))  # baseline only
    torch.testing.assert_close(d1, g1.mean(dim=0))
    s = g1 ** 2
    e1 = (g1 ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1)
    s = s + g2 ** 2
    e2 = (g2 ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1)
    w = torch.softmax(0.5 * e2 / e1, dim=0)
    method.combine(g2, torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, w, rtol=1e-12, atol=1e-12)


def test_excessmtl_shifts_weight_to_the_task_far_from_convergence() -> None:
    method = methods.build("excessmtl", 2, robust_step_size=0.1)
    base = jacobian(70, 2, 20)
    for step in range(40):
        # task 0 keeps a large gradient; task 1 converges (its gradient shrinks geometrically)
        grads = torch.stack([base[0], base[1] * 0.8 ** step])
        method.combine(grads, torch.ones(2, dtype=torch.float64))
    w = method.last_weights
    assert float(w[0]) > 0.6 and float(w.sum()) == pytest.approx(1.0)


def test_excessmtl_matches_torchjd_with_one_warmup_step() -> None:
    from torchjd.aggregation import ExcessMTLWeighting

    # TorchJD with n_warmup_steps = 1 = the official code: the first step only sets the baseline
    reference = ExcessMTLWeighting(robust_step_size=0.05, n_warmup_steps=1)
    method = methods.build("excessmtl", 3, robust_step_size=0.05)
    for step in range(8):
        grads = jacobian(80 + step, 3, 12, scale=1.0 / (step + 1))
        method.combine(grads, torch.ones(3, dtype=torch.float64))
        torch.testing.assert_close(method.last_weights, reference(grads), rtol=1e-6, atol=1e-9)


def test_excessmtl_warmup_epochs_average_the_baseline() -> None:
    method = methods.build("excessmtl", 2, warmup_epochs=1, robust_step_size=1.0)
    grads = [jacobian(90 + i, 2, 6) for i in range(3)]
    for g in grads[:2]:
        method.combine(g, torch.ones(2, dtype=torch.float64))
        torch.testing.assert_close(method.last_weights, torch.full((2,), 0.5, dtype=torch.float64))
    method.on_epoch_end(1)
    method.combine(grads[2], torch.ones(2, dtype=torch.float64))
    s = torch.zeros(2, 6, dtype=torch.float64)
    estimates = []
    for g in grads:
        s = s + g ** 2
        estimates.append((g ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1))
    baseline = (estimates[0] + estimates[1]) / 2
    torch.testing.assert_close(method.last_weights, torch.softmax(estimates[2] / baseline, dim=0))


# -- all six: validation, state round trips, training through the trainer ----------------------

@pytest.mark.parametrize("name,hparams,fragment", [
    ("cagrad", {"c": 1.0}, "c=1.0"), ("cagrad", {"c": -0.1}, "c="), ("cagrad", {"rescale": 3}, "rescale"),
    ("nashmtl", {"optim_niter": 0}, "optim_niter"), ("nashmtl", {"update_weights_every": 0}, "update_weights_every"),
    ("nashmtl", {"solver": "nope"}, "solver"), ("nashmtl", {"two_task_closed_form": 1}, "two_task_closed_form"),
    ("moco", {"beta": 0.0}, "beta"), ("moco", {"gamma": -1.0}, "gamma"), ("moco", {"lambda_update": "x"}, "lambda"),
    ("alignedmtl", {"scale_mode": "max"}, "scale_mode"), ("upgrad", {"reg_eps": -1e-3}, "reg_eps"),
    ("excessmtl", {"robust_step_size": 0.0}, "robust_step_size"), ("excessmtl", {"warmup_epochs": -1}, "warmup"),
])
def test_invalid_hyper_parameters_are_rejected(name: str, hparams: dict, fragment: str) -> None:
    with pytest.raises(InvalidParameterError) as exc:
        methods.build(name, 2, **hparams)
    assert fragment in str(exc.value) and exc.value.exit_code == 2


def round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("name", MINE)
def test_state_round_trip_continues_identically(name: str) -> None:
    hparams = {"two_task_closed_form": False} if name == "nashmtl" else {}
    original = methods.build(name, 3, **hparams)
    steps = [jacobian(300 + i, 3, 9) for i in range(6)]
    losses = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    for g in steps[:3]:
        original.combine(g, losses)
    original.on_epoch_end(1)
    clone = methods.build(name, 3, **hparams)
    clone.load_state_dict(round_trip(original.state_dict()))
    for g in steps[3:]:
        a, b = original.combine(g, losses), clone.combine(g, losses)
        assert torch.equal(a, b), name
        assert torch.equal(original.last_weights, clone.last_weights), name


def test_registry_lists_the_six_methods_with_papers() -> None:
    for name in MINE:
        info = methods.info(name)
        assert info.name == name and info.paper and info.equations and info.cost == "O(K)"


def test_nashmtl_cccp_trains_on_toy_with_amortised_weights(tmp_path: Path) -> None:
    data = tmp_path / "toy"
    jobs.prepare("toy", data, start=3, steps_per_epoch=30)
    run = tmp_path / "run"
    jobs.train(data, run, method="nashmtl", hparams={"two_task_closed_form": False, "update_weights_every": 3},
               epochs=1, lr=0.05, progress=False)
    blob = torch.load(run / "model.pt", weights_only=False)
    assert torch.isfinite(blob["state_dict"]["trunk.x"]).all()
    state = torch.load(run / "checkpoint.pt", weights_only=False)["method"]
    alpha = state["alpha"]
    assert alpha is not None and torch.all(alpha > 0)
