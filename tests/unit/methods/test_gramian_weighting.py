"""Gramian weightings (the direction is w @ J with w a function of the Gramian J Jᵀ), each against an
independent solve or closed form: MGDA (KKT conditions of the min-norm point, two-task closed form),
FairGrad (the α-fair fixed point), PCGrad (the projection invariant, = TorchJD), GradVac (cosines raised to
the target, first step = PCGrad, = TorchJD), IMTL-G (equal projections on unit gradients) and IMTL, CAGrad
(the primal SOCP with cvxpy/Clarabel, dense sampling of the ball), Nash-MTL (the bargaining fixed point),
Aligned-MTL (equal singular values), UPGrad (non-conflicting, linear); then the family's contract
(`method_contracts.GramianContract`) for every one of them.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from method_contracts import GramianContract
from method_helpers import (
    FULL_RANK,
    PROPERTY_SETTINGS,
    RANK_DEFICIENT,
    SHAPES,
    ctx,
    direction,
    fake_trainer,
    gramian,
    hide_cvxpy,
    hide_module,
    jacobian,
    random_orders,
    roundtrip,
    small_model,
)
from torchjd import aggregation as torchjd_aggregation

from mtlflow import methods
from mtlflow.core.errors import InvalidParameterError, SolverError
from mtlflow.methods._cvx import solve_checked
from mtlflow.methods._support import MethodGenerator
from mtlflow.methods.alignedmtl import balance_transform
from mtlflow.methods.gradvac import gradvac_coefficients
from mtlflow.methods.imtlg import imtlg_weights
from mtlflow.methods.nashmtl import CONIC_STATIONARITY_TOL, _CCCPProblem, cccp_start, stationarity_tol
from mtlflow.methods.pcgrad import pcgrad_coefficients
from mtlflow.methods.solvers import fairgrad_weights, min_norm_weights_frank_wolfe, min_norm_weights_qp

# -- MGDA ----------------------------------------------------------------------------------------

def mgda_direction(grads: torch.Tensor, solver: str) -> tuple[np.ndarray, np.ndarray]:
    method = methods.build("mgda", grads.shape[0], solver=solver)
    losses = torch.ones(grads.shape[0], dtype=grads.dtype)
    d = method.combine(grads, losses)
    w = method.last_weights.numpy()
    # the direction is exactly the weighted sum of the task gradients
    np.testing.assert_allclose(d.numpy(), w @ grads.numpy(), rtol=1e-12, atol=1e-12)
    return w, d.numpy()


def kkt_residuals(m: np.ndarray, w: np.ndarray, active: float) -> tuple[float, float]:
    """(max_i (v - (Mw)_i), max_{w_i > active} |(Mw)_i - v|), both relative to max diag(M)."""
    mw = m @ w
    v = float(w @ mw)
    scale = float(np.max(np.diag(m)))
    stationarity = float(np.max(v - mw)) / scale
    on_support = np.abs(mw[w > active] - v)
    complementarity = float(np.max(on_support)) / scale if on_support.size else 0.0
    return stationarity, complementarity


def assert_on_simplex(w: np.ndarray, atol: float = 1e-9) -> None:
    assert np.all(w >= -atol), w
    assert abs(w.sum() - 1.0) <= atol, w.sum()


@pytest.mark.parametrize("seed,k,p", SHAPES)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_mgda_qp_satisfies_kkt(seed: int, k: int, p: int, scale: float) -> None:
    grads = jacobian(seed, k, p, scale)
    w, _ = mgda_direction(grads, "qp")
    assert_on_simplex(w)
    stationarity, complementarity = kkt_residuals(gramian(grads), w, active=1e-6)
    assert stationarity <= 1e-6
    assert complementarity <= 1e-6


@pytest.mark.parametrize("seed,k,p", [(0, 3, 5), (1, 4, 6), (2, 5, 3)])
def test_frank_wolfe_starts_from_the_best_pair_of_tasks(seed: int, k: int, p: int) -> None:
    """Sener & Koltun's Alg. 2 starts from the min-norm point of the best pair (Alg. 1's closed form, checked
    here on every pair); with no iteration that start is the answer."""
    g = jacobian(seed, k, p).numpy()
    best, expected = np.inf, None
    for i in range(k):
        for j in range(i + 1, k):
            diff = g[i] - g[j]
            gamma = float(np.clip((g[j] @ g[j] - g[i] @ g[j]) / (diff @ diff), 0.0, 1.0))
            point = gamma * g[i] + (1 - gamma) * g[j]
            if point @ point < best:
                best, expected = point @ point, np.zeros(k)
                expected[i], expected[j] = gamma, 1 - gamma
    w = min_norm_weights_frank_wolfe(torch.from_numpy(g @ g.T), 0, 1e-5).numpy()
    np.testing.assert_allclose(w, expected, rtol=1e-9, atol=1e-12)


def test_mgda_of_one_task_is_its_gradient_with_either_solver() -> None:
    g = jacobian(3, 1, 7)
    for solver in ("frank-wolfe", "qp"):
        w, d = mgda_direction(g, solver)
        assert w.dtype == np.float64 and w.tolist() == [1.0]
        np.testing.assert_allclose(d, g.numpy()[0], rtol=1e-12)


@pytest.mark.parametrize("seed,k,p", SHAPES)
def test_mgda_frank_wolfe_satisfies_kkt_loosely(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    w, _ = mgda_direction(grads, "frank-wolfe")
    assert_on_simplex(w)
    m = gramian(grads)
    # Frank-Wolfe converges sublinearly: the duality gap is small, not zero, and weights left on
    # non-optimal vertices are small.
    stationarity, complementarity = kkt_residuals(m, w, active=0.05)
    assert stationarity <= 1e-2
    assert complementarity <= 5e-2
    # ... and its objective is close to the exact optimum
    w_qp, _ = mgda_direction(grads, "qp")
    scale = float(np.max(np.diag(m)))
    assert w @ m @ w <= w_qp @ m @ w_qp + 1e-3 * scale


@given(seed=st.integers(0, 2**31 - 1), k=st.integers(2, 8), p=st.integers(1, 40),
       log_scale=st.floats(-3, 3), solver=st.sampled_from(["qp", "frank-wolfe"]))
@PROPERTY_SETTINGS
def test_mgda_min_norm_properties_hypothesis(seed: int, k: int, p: int, log_scale: float, solver: str) -> None:
    grads = jacobian(seed, k, p, 10.0 ** log_scale)
    w, d = mgda_direction(grads, solver)
    assert_on_simplex(w)
    m = gramian(grads)
    scale = float(np.max(np.diag(m)))
    tol = 1e-6 if solver == "qp" else 1e-2
    stationarity, _ = kkt_residuals(m, w, active=1e-6)
    assert stationarity <= tol
    # common descent: d·g_i >= |d|² for every task (the KKT condition written on the direction)
    g = grads.numpy()
    assert np.all(g @ d >= d @ d - tol * scale)


@pytest.mark.parametrize("solver", ["qp", "frank-wolfe"])
@pytest.mark.parametrize("seed", range(8))
def test_mgda_two_tasks_matches_closed_form(solver: str, seed: int) -> None:
    grads = jacobian(seed, 2, 5)
    g1, g2 = grads.numpy()
    # min_γ ||γ g1 + (1-γ) g2||²: derivative 2(γ g1 + (1-γ) g2)·(g1 - g2) = 0
    #   => γ = (g2·g2 - g1·g2) / ||g1 - g2||², clipped to [0, 1] (Sener & Koltun, Alg. 1)
    gamma = float(np.clip((g2 @ g2 - g1 @ g2) / ((g1 - g2) @ (g1 - g2)), 0.0, 1.0))
    w, d = mgda_direction(grads, solver)
    np.testing.assert_allclose(w, [gamma, 1 - gamma], atol=1e-7)
    np.testing.assert_allclose(d, gamma * g1 + (1 - gamma) * g2, atol=1e-7)


def test_mgda_two_tasks_hand_computed() -> None:
    # g1 = (1, 0), g2 = (0, 1): the min-norm point of the segment is (1/2, 1/2).
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    for solver in ("qp", "frank-wolfe"):
        w, d = mgda_direction(grads, solver)
        np.testing.assert_allclose(w, [0.5, 0.5], atol=1e-9)
        np.testing.assert_allclose(d, [0.5, 0.5], atol=1e-9)
    # g1 = (1, 0), g2 = (3, 0): g1 itself is the min-norm point, γ = 1.
    grads = torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    for solver in ("qp", "frank-wolfe"):
        w, d = mgda_direction(grads, solver)
        np.testing.assert_allclose(w, [1.0, 0.0], atol=1e-9)
        np.testing.assert_allclose(d, [1.0, 0.0], atol=1e-9)


@pytest.mark.parametrize("solver", ["qp", "frank-wolfe"])
@pytest.mark.parametrize("seed,k", [(0, 3), (1, 4), (2, 6)])
def test_mgda_returns_gradient_that_is_already_min_norm(solver: str, seed: int, k: int) -> None:
    # g_0 = u and g_j = u + r_j with r_j ⟂ u and the r_j independent: every convex combination is
    # u + Σ_{j>0} w_j r_j, whose norm exceeds |u| unless w = e_0.
    gen = torch.Generator().manual_seed(seed)
    p = 12
    u = torch.randn(p, generator=gen, dtype=torch.float64) * 0.3
    r = torch.randn(k - 1, p, generator=gen, dtype=torch.float64)
    r = r - (r @ u)[:, None] * u[None, :] / (u @ u)  # orthogonal to u
    grads = torch.cat([u[None, :], u[None, :] + r])
    order = torch.randperm(k, generator=gen)         # put u at a random position
    grads = grads[order]
    where = int((order == 0).nonzero())
    w, d = mgda_direction(grads, solver)
    expected = np.zeros(k)
    expected[where] = 1.0
    np.testing.assert_allclose(w, expected, atol=1e-6)
    np.testing.assert_allclose(d, u.numpy(), atol=1e-6)


def test_mgda_zero_at_pareto_stationary_point() -> None:
    # opposite gradients: 0 is in the convex hull, so the min-norm direction vanishes
    grads = torch.tensor([[1.0, 2.0, -1.0], [-2.0, -4.0, 2.0]], dtype=torch.float64)
    for solver in ("qp", "frank-wolfe"):
        w, d = mgda_direction(grads, solver)
        np.testing.assert_allclose(w, [2 / 3, 1 / 3], atol=1e-7)
        assert np.linalg.norm(d) <= 1e-6


# -- FairGrad -------------------------------------------------------------------------------------

def fairgrad_solve(grads: torch.Tensor, alpha: float) -> tuple[np.ndarray, methods.Method]:
    method = methods.build("fairgrad", grads.shape[0], alpha=alpha)
    d = method.combine(grads, torch.ones(grads.shape[0], dtype=grads.dtype))
    w = method.last_weights.numpy()
    np.testing.assert_allclose(d.numpy(), w @ grads.numpy(), rtol=1e-12, atol=1e-12)
    return w, method


def fixed_point_residual(m: np.ndarray, w: np.ndarray, alpha: float) -> float:
    """||M w - w^(-1/α)||_∞ relative to ||w^(-1/α)||_∞ (scale-free)."""
    target = np.power(w, -1.0 / alpha)
    return float(np.max(np.abs(m @ w - target)) / np.max(np.abs(target)))




@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_fairgrad_solves_fixed_point(alpha: float, seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    w, method = fairgrad_solve(grads, alpha)
    m = gramian(grads)
    assert np.all(w > 0)
    assert fixed_point_residual(m, w, alpha) <= 1e-5
    # the logged residual is the relative residual of the equation
    target = w ** (-1 / alpha)
    assert method.last_residual == pytest.approx(float(np.max(np.abs(m @ w - target) / target)), rel=1e-6, abs=1e-15)


@given(seed=st.integers(0, 2**31 - 1), k=st.integers(2, 6), extra=st.integers(0, 30),
       alpha=st.sampled_from([0.5, 1.0, 2.0]))
@PROPERTY_SETTINGS
def test_fairgrad_fixed_point_hypothesis(seed: int, k: int, extra: int, alpha: float) -> None:
    grads = jacobian(seed, k, k + extra)
    w, _ = fairgrad_solve(grads, alpha)
    assert np.all(w > 0)
    assert fixed_point_residual(gramian(grads), w, alpha) <= 1e-5


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_fairgrad_alpha_one_is_nash_bargaining(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    w, _ = fairgrad_solve(grads, 1.0)
    m = gramian(grads)
    # α = 1: w_i (GᵀG w)_i = 1 for every task (the Nash-MTL condition)
    np.testing.assert_allclose(w * (m @ w), np.ones(k), atol=1e-5)


def test_fairgrad_orthogonal_gradients_hand_computed() -> None:
    # M = diag(4, 1): w_i m_i = w_i^(-1/α) => w_i = m_i^(-α/(1+α)); α = 1 gives w = (1/2, 1).
    grads = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    w, _ = fairgrad_solve(grads, 1.0)
    np.testing.assert_allclose(w, [0.5, 1.0], rtol=1e-6)
    w, _ = fairgrad_solve(grads, 2.0)
    np.testing.assert_allclose(w, [4.0 ** (-2 / 3), 1.0], rtol=1e-6)


def test_fairgrad_fixed_point_is_scale_invariant() -> None:
    worst = 0.0
    for seed in range(12):
        k = 2 + seed % 3
        grads = jacobian(seed, k, 10, scale=1e-3)
        for alpha in (0.5, 1.0, 2.0):
            w, _ = fairgrad_solve(grads, alpha)
            worst = max(worst, fixed_point_residual(gramian(grads), w, alpha))
    assert worst <= 1e-4, f"worst relative fixed-point residual {worst:.3g} at gradient scale 1e-3"


# -- PCGrad ---------------------------------------------------------------------------------------

def projected(grads: torch.Tensor, orders: list[list[int]]) -> np.ndarray:
    g = grads.numpy()
    return pcgrad_coefficients(g @ g.T, orders) @ g


@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
def test_pcgrad_last_visited_task_never_conflicts(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    g = grads.numpy()
    orders = random_orders(seed, k)
    scale = float((g**2).sum(axis=1).max())
    # the invariant of Alg. 1: right after visiting j, g_i^PC · g_j >= 0 for the ORIGINAL g_j (a later
    # projection onto another g_k may break it again, so it is checked after every prefix of the orders)
    for visits in range(1, k):
        pc = projected(grads, [order[:visits] for order in orders])
        for i in range(k):
            assert pc[i] @ g[orders[i][visits - 1]] >= -1e-10 * scale
    # a gradient that conflicts with no other one is left unchanged
    pc = projected(grads, orders)
    for i in range(k):
        if np.all(g[i] @ g.T >= 0):
            np.testing.assert_allclose(pc[i], g[i])


@pytest.mark.parametrize("seed", range(6))
def test_pcgrad_two_tasks_projects_onto_normal_planes(seed: int) -> None:
    grads = jacobian(seed, 2, 7)
    g1, g2 = grads.numpy()
    if g1 @ g2 >= 0:
        grads[1] = grads[1] - 2 * (g1 @ g2) / (g1 @ g1) * grads[0]     # make them conflict
        g1, g2 = grads.numpy()
    assert g1 @ g2 < 0
    pc = projected(grads, [[1], [0]])
    np.testing.assert_allclose(pc[0], g1 - (g1 @ g2) / (g2 @ g2) * g2)
    np.testing.assert_allclose(pc[1], g2 - (g1 @ g2) / (g1 @ g1) * g1)
    assert abs(pc[0] @ g2) < 1e-10 and abs(pc[1] @ g1) < 1e-10       # non-negative (zero) after projection
    direction = methods.build("pcgrad", 2).combine(grads, torch.ones(2, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(direction, pc.sum(axis=0))
    assert direction @ g1 >= 0 and direction @ g2 >= 0


def test_pcgrad_leaves_non_conflicting_gradients_alone() -> None:
    base = jacobian(0, 1, 6).abs()
    grads = base + jacobian(1, 4, 6).abs()          # all entries positive: no conflict
    torch.testing.assert_close(methods.build("pcgrad", 4).combine(grads, torch.ones(4)), grads.sum(dim=0))


def torchjd_orders(seed: int, k: int) -> list[list[int]]:
    """The visiting orders TorchJD's PCGrad draws after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    orders = []
    for i in range(k):
        perm = torch.randperm(k).tolist()
        orders.append([j for j in perm if j != i])
    return orders


@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
def test_pcgrad_matches_torchjd_on_the_same_orders(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    orders = torchjd_orders(seed, k)
    torch.manual_seed(seed)
    expected = torchjd_aggregation.PCGrad()(grads)
    np.testing.assert_allclose(projected(grads, orders).sum(axis=0), expected.numpy(), rtol=1e-9, atol=1e-9)


def test_pcgrad_orders_are_seeded_and_checkpointed() -> None:
    grads = jacobian(3, 5, 8)
    losses = torch.ones(5, dtype=torch.float64)
    a, b = methods.build("pcgrad", 5, 1), methods.build("pcgrad", 5, 1)
    torch.testing.assert_close(a.combine(grads, losses), b.combine(grads, losses))
    clone = roundtrip(a)
    for _ in range(3):
        torch.testing.assert_close(clone.combine(grads, losses), a.combine(grads, losses))
    directions = {tuple(a.combine(grads, losses).tolist()) for _ in range(20)}
    assert len(directions) > 1          # the order is random and matters for K > 2


# -- GradVac --------------------------------------------------------------------------------------

def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
def test_gradvac_first_step_is_pcgrad(seed: int, k: int, p: int) -> None:
    g = jacobian(seed, k, p).numpy()
    orders = random_orders(seed, k)
    coef, _ = gradvac_coefficients(g @ g.T, np.zeros((k, k)), orders, 0.5)
    np.testing.assert_allclose(coef, pcgrad_coefficients(g @ g.T, orders), atol=1e-12)


def test_gradvac_direction_of_two_conflicting_tasks_at_the_first_step_is_the_sum_of_their_projections() -> None:
    """Targets start at 0, so the first step projects each of two conflicting gradients onto the other's normal
    plane (PCGrad) and the update is the sum of the two projected gradients, by hand."""
    g0, g1 = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), torch.tensor([-0.8, 1.0, 0.3], dtype=torch.float64)
    assert float(g0 @ g1) < 0
    expected = (g0 - (g0 @ g1) / (g1 @ g1) * g1) + (g1 - (g0 @ g1) / (g0 @ g0) * g0)
    d, _ = direction("gradvac", torch.stack([g0, g1]))
    np.testing.assert_allclose(d, expected.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_gradvac_raises_cosines_to_the_target(seed: int, k: int, p: int) -> None:
    g = jacobian(seed, k, p).numpy()
    gram = g @ g.T
    rng = np.random.default_rng(seed)
    targets = rng.uniform(-0.5, 0.8, size=(k, k))
    orders = random_orders(seed, k)
    beta = 0.3
    coef, new_targets = gradvac_coefficients(gram, targets, orders, beta)
    adjusted = coef @ g
    # right after visiting j, cos(g_i', g_j) >= the old target for the ORIGINAL g_j (every prefix)
    for visits in range(1, k):
        partial, _ = gradvac_coefficients(gram, targets, [order[:visits] for order in orders], beta)
        for i in range(k):
            j = orders[i][visits - 1]
            assert cosine(partial[i] @ g, g[j]) >= targets[i, j] - 1e-9
    if k == 2:                       # one pair per task: exact target, or untouched when above it
        for i, j in ((0, 1), (1, 0)):
            raw = cosine(g[i], g[j])
            if raw < targets[i, j]:
                assert cosine(adjusted[i], g[j]) == pytest.approx(targets[i, j], abs=1e-9)
            else:
                np.testing.assert_allclose(adjusted[i], g[i])
            assert new_targets[i, j] == pytest.approx((1 - beta) * targets[i, j] + beta * raw)
    assert np.all(np.diag(new_targets) == np.diag(targets))     # only pairs i ≠ j are tracked


def gradvac_torchjd_orders(seed: int, k: int) -> list[list[int]]:
    torch.manual_seed(seed)
    orders = []
    for i in range(k):
        others = [j for j in range(k) if j != i]
        orders.append([others[idx] for idx in torch.randperm(k - 1).tolist()])
    return orders


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_gradvac_matches_torchjd_over_several_steps(seed: int, k: int, p: int) -> None:
    beta = 0.5
    reference = torchjd_aggregation.GradVac(beta=beta)
    targets = np.zeros((k, k))
    for step in range(4):
        grads = jacobian(100 * seed + step, k, p)
        g = grads.numpy()
        orders = gradvac_torchjd_orders(step, k)
        coef, targets = gradvac_coefficients(g @ g.T, targets, orders, beta)
        torch.manual_seed(step)
        expected = reference(grads)
        np.testing.assert_allclose(coef.sum(axis=0) @ g, expected.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(targets, reference.gramian_weighting._phi_t.numpy(), atol=1e-6)


def test_gradvac_state_roundtrip() -> None:
    k = 4
    vac = methods.build("gradvac", k, 2, beta=0.2)
    for step in range(3):
        vac.combine(jacobian(step, k, 9), torch.ones(k))
    assert np.any(vac.targets != 0)
    clone = roundtrip(vac)
    grads = jacobian(7, k, 9)
    torch.testing.assert_close(clone.combine(grads, torch.ones(k)), vac.combine(grads, torch.ones(k)))
    np.testing.assert_array_equal(clone.targets, vac.targets)


# -- IMTL-G and IMTL ------------------------------------------------------------------------------

def assert_equal_unit_projections(direction: np.ndarray, grads: np.ndarray) -> None:
    units = grads / np.linalg.norm(grads, axis=1, keepdims=True)
    projections = units @ direction
    np.testing.assert_allclose(projections, np.full(len(grads), projections.mean()),
                               rtol=1e-8, atol=1e-10 * np.linalg.norm(direction))


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_imtlg_equal_projections_on_unit_gradients(seed: int, k: int, p: int, scale: float) -> None:
    grads = jacobian(seed, k, p) * torch.logspace(0, 2, k, dtype=torch.float64)[:, None] * scale
    imtlg = methods.build("imtlg", k)
    direction = imtlg.combine(grads, torch.ones(k))
    alpha = imtlg.last_weights.numpy()
    assert alpha.sum() == pytest.approx(1.0, abs=1e-10)
    np.testing.assert_allclose(direction.numpy(), alpha @ grads.numpy(), rtol=1e-12, atol=1e-12 * scale)
    assert_equal_unit_projections(direction.numpy(), grads.numpy())
    expected = torchjd_aggregation.IMTLG()(grads)
    np.testing.assert_allclose(direction.numpy(), expected.numpy(), rtol=1e-6, atol=1e-9 * scale)


def test_imtlg_hand_computed_and_degenerate_cases() -> None:
    # g1 = (1, 0), g2 = (0, 2): d = (α, 2(1 - α)) with d·u1 = d·u2 => α = 2/3, d = (2/3, 2/3)
    grads = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    np.testing.assert_allclose(imtlg_weights((grads @ grads.T).numpy()), [2 / 3, 1 / 3])
    # a zero task gradient gets weight 0; the others still get equal projections
    grads = torch.cat([jacobian(0, 2, 5), torch.zeros(1, 5, dtype=torch.float64)])
    alpha = imtlg_weights((grads @ grads.T).numpy())
    assert alpha[2] == 0 and alpha.sum() == pytest.approx(1.0)
    assert_equal_unit_projections(alpha[:2] @ grads[:2].numpy(), grads[:2].numpy())
    for seed, k, p in RANK_DEFICIENT:      # linearly dependent rows: a solution of the defining equations
        g = jacobian(seed, k, p).numpy()
        alpha = imtlg_weights(g @ g.T)
        assert np.all(np.isfinite(alpha)) and alpha.sum() == pytest.approx(1.0)
        assert_solves_the_imtlg_equations(alpha, g)
    assert imtlg_weights(np.zeros((3, 3))).tolist() == [0.0, 0.0, 0.0]


def imtlg_least_norm_reference(j: np.ndarray) -> tuple[np.ndarray, float]:
    """(α, residual): the least-norm solution of IMTL-G's defining equations, d = Jᵀα with Σα = 1 and
    d·u_i = c for every i, as one linear system in (α, c) built from J itself (not from a Gramian, no
    pseudo-inverse cut-off): [U Jᵀ, −1; 1ᵀ, 0] (α, c) = (0, 1), solved by numpy's SVD least squares."""
    k = j.shape[0]
    units = j / np.linalg.norm(j, axis=1, keepdims=True)
    system = np.zeros((k + 1, k + 1))
    system[:k, :k], system[:k, k], system[k, :k] = units @ j.T, -1.0, 1.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
    return solution[:k], float(np.linalg.norm(system @ solution - rhs))


def assert_solves_the_imtlg_equations(alpha: np.ndarray, j: np.ndarray, rtol: float = 1e-9) -> None:
    """Σα = 1 and equal projections of d = αJ on the unit gradients, to ``rtol`` of the gradients' scale
    Σ|α_i|‖g_i‖ (the size d would have without cancellation): d = 0 passes, d = −5·g1 with projections ∓5‖g1‖
    does not."""
    assert alpha.sum() == pytest.approx(1.0, abs=1e-12)
    norms = np.linalg.norm(j, axis=1)
    projections = (j / norms[:, None]) @ (alpha @ j)
    assert np.ptp(projections) <= rtol * float(np.abs(alpha) @ norms), projections


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ratio", [2.0, 0.25, 1e3])
def test_imtlg_antiparallel_gradients_of_unequal_norms_give_zero_update(dtype: torch.dtype, ratio: float) -> None:
    """g2 = −r·g1 (r a power of 2 or 1e3, exact in every dtype's product with these rows): d = (α1 − r·α2)·g1
    and d·u1 = d·u2 = −d·u1 force d = 0, so α1 = r·α2 and Σα = 1 give α = (r, 1)/(1 + r) (by hand; r = 2:
    α = (2/3, 1/3)). The pseudo-inverse alone gives α = (−1, 2), d = −5·g1 for r = 2."""
    g1 = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    grads = torch.stack([g1, -ratio * g1]).to(dtype)
    # fp32/bf16 Jacobians: the Gramian carries float32 rounding (~eps₃₂ relative), the weights follow it
    rtol = 1e-12 if dtype == torch.float64 else 4 * float(torch.finfo(torch.float32).eps)
    imtlg = methods.build("imtlg", 2)
    d = imtlg.combine(grads, torch.ones(2, dtype=dtype))
    alpha = imtlg.last_weights.double().numpy()
    np.testing.assert_allclose(alpha, [ratio / (1 + ratio), 1 / (1 + ratio)], rtol=rtol)
    exact = grads.double().numpy()
    zero_tol = rtol * ratio * float(g1.norm())
    np.testing.assert_allclose(alpha @ exact, 0.0, atol=zero_tol)
    assert float(d.double().abs().max()) <= zero_tol + 2 * float(torch.finfo(dtype).eps) * ratio
    assert_solves_the_imtlg_equations(alpha, exact, rtol=max(rtol, 1e-9))
    reference, residual = imtlg_least_norm_reference(exact)
    assert residual < 1e-12
    np.testing.assert_allclose(alpha, reference, rtol=max(rtol, 1e-9))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k,p,rank", [(40, 10, 10), (40, 12, 10), (6, 5, 3), (3, 5, 2)])
@pytest.mark.parametrize("noise", [0.0, 1e-8])
def test_imtlg_on_rank_deficient_jacobians_of_unequal_norms_matches_the_least_norm_reference(
        seed: int, k: int, p: int, rank: int, noise: float) -> None:
    """K rows of rank ``rank`` < K, norms spread over two decades, exactly or with 1e-8 noise (relative to each
    row): where √diag(G) is outside the range of G the only solutions have d = 0, the reference finds
    ‖d‖ ~ 1e-14 (exact) or ~ 1e-8 (noise), and the pseudo-inverse alone gave ‖d‖ of 1-60 with unequal
    projections. Against :func:`imtlg_least_norm_reference` (J-based, no cut-off): the same direction, within
    1e-6 of it plus 1e-12 of the gradients' scale."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.randn(k, rank, generator=gen, dtype=torch.float64) @ torch.randn(rank, p, generator=gen,
                                                                                    dtype=torch.float64)
    j = basis * torch.logspace(0, 2, k, dtype=torch.float64)[:, None]
    j = j + noise * torch.randn(k, p, generator=gen, dtype=torch.float64) * torch.linalg.norm(j, dim=1, keepdim=True)
    imtlg = methods.build("imtlg", k)
    d = imtlg.combine(j, torch.ones(k, dtype=torch.float64)).numpy()
    alpha, jn = imtlg.last_weights.numpy(), j.numpy()
    assert_solves_the_imtlg_equations(alpha, jn)
    reference, residual = imtlg_least_norm_reference(jn)
    scale = float(np.linalg.norm(jn, axis=1).max())
    assert residual < 1e-9
    d_reference = reference @ jn
    assert np.linalg.norm(d_reference) < 1e-6 * scale          # the reference's own answer: d ≈ 0
    np.testing.assert_allclose(d, d_reference, rtol=1e-6, atol=1e-12 * scale)


def test_imtl_loss_part_gradient_and_combined_direction() -> None:
    k = 3
    model = small_model(k)
    imtl = methods.build("imtl", k)
    imtl.setup(fake_trainer(model))
    with torch.no_grad():
        imtl.log_scales.copy_(torch.tensor([0.5, -1.0, 2.0]))
    losses = torch.tensor([2.0, 0.3, 0.7], dtype=torch.float64)
    imtl.before_backward(ctx(losses))
    s = imtl.log_scales.detach().double()
    torch.testing.assert_close(imtl.log_scales.grad.double(), torch.exp(s) * losses - 1)   # ∂(e^s L - s)/∂s
    for i in range(k):
        for prm in model.task_parameters(i):
            prm.grad = torch.ones_like(prm)
    grads = jacobian(4, k, 11)
    direction = imtl.combine(grads, losses).numpy()
    # IMTL-G on the scaled gradients e^s g: still equal projections on the unit task gradients
    assert_equal_unit_projections(direction, grads.numpy())
    scaled = grads * torch.exp(s)[:, None]
    np.testing.assert_allclose(direction, imtlg_weights((scaled @ scaled.T).numpy()) @ scaled.numpy(), rtol=1e-10)
    np.testing.assert_allclose(imtl.last_weights.numpy() @ grads.numpy(), direction, rtol=1e-10)
    for i in range(k):                                  # head i is trained on e^{s_i} L_i
        for prm in model.task_parameters(i):
            torch.testing.assert_close(prm.grad, torch.full_like(prm, math.exp(float(s[i]))))
    # with s = 0 IMTL is IMTL-G
    fresh = methods.build("imtl", k)
    torch.testing.assert_close(fresh.combine(grads, losses), methods.build("imtlg", k).combine(grads, losses))
    clone = roundtrip(imtl)
    torch.testing.assert_close(clone.log_scales, imtl.log_scales)


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
@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
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


def test_cagrad_with_nothing_to_balance_is_the_mean_gradient_with_a_zero_gap() -> None:
    """One task, c = 0, all-zero gradients, and a mean gradient g_0 = 0 (two opposite tasks): d = g_0, i.e. the
    weights 1/K, certified exactly (gap 0), without a solve."""
    from mtlflow.methods.cagrad import cagrad_weights

    assert methods.build("cagrad", 3).last_gap is None   # no solve yet, no gap to report
    g = jacobian(11, 3, 5).numpy()
    opposite = np.stack([g[0], -g[0]])
    cases = [(g[:1] @ g[:1].T, 0.4), (g @ g.T, 0.0), (np.zeros((3, 3)), 0.4), (opposite @ opposite.T, 0.4)]
    for a, c in cases:
        weights, gap = cagrad_weights(a, c, 1e-6)
        k = a.shape[0]
        np.testing.assert_array_equal(weights, np.full(k, 1.0 / k))
        assert gap == 0.0


def test_cagrad_two_task_dual_of_identical_gradients_splits_evenly() -> None:
    """g_1 = g_2 (zero or not): F is constant on the segment, and the closed form returns the midpoint (no division
    by ‖u‖² = 0)."""
    from mtlflow.methods.cagrad import two_task_dual

    for g in (np.array([[3.0, -1.0, 2.0], [3.0, -1.0, 2.0]]), np.zeros((2, 3))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            w = two_task_dual(g @ g.T, 0.4)
        np.testing.assert_array_equal(w, [0.5, 0.5])


def test_cagrad_uncertified_solve_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import mtlflow.methods.cagrad as cagrad

    # a dual solver that stops at the start point: the duality-gap certificate must catch it
    monkeypatch.setattr(cagrad, "dual_weights", lambda a, radius: np.full(a.shape[0], 1.0 / a.shape[0]))
    j = jacobian(13, 3, 2) * torch.tensor([[1.0], [-1.0], [0.2]], dtype=torch.float64)
    with pytest.raises(SolverError) as error:
        direction("cagrad", j)
    # at w = b (Gramian A divided by max_i ‖g_i‖²): F(b) = (1 + c) bᵀAb and the weights are (1 + c) b,
    # so the gap is (1 + c) (bᵀAb − min_i (Ab)_i)
    a = (j @ j.T).numpy()
    a = a / a.diagonal().max()
    gap = 1.4 * (a.mean() - a.mean(axis=1).min())
    assert str(error.value) == (f"cagrad: the dual solve is {gap:.2g} (relative duality gap) away from the optimum; "
                                "the task gradients may be degenerate")


def test_cagrad_dual_solve_at_an_optimal_kink_returns_it_silently() -> None:
    from mtlflow.methods.cagrad import slsqp_dual

    # g_1 + g_2 = 0 and g_3 + g_4 = 0: at the start w = b, g_w = 0, where F(w) = wᵀAb + r‖g_w‖ = r‖g_w‖
    # is not differentiable and minimal (F ≥ 0 = F(b)); its gradient there is the subgradient Ab = 0
    g = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no division by ‖g_w‖ = 0
        w = slsqp_dual(g @ g.T / 4.0, 0.4)
    np.testing.assert_array_equal(w, np.full(4, 0.25))


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


def test_nashmtl_reports_no_solve_before_its_first_step_and_its_last_solve_after_a_restore() -> None:
    method = methods.get("nashmtl")(3)
    assert method.last_residual is None and method.last_iterations == 0 and method.stationary_steps == 0
    _, _, solved = nash(jacobian(0, 3, 5))
    assert isinstance(solved.last_residual, float) and solved.last_iterations >= 1
    resumed = methods.get("nashmtl")(3)   # a restored Nash-MTL reports the weights of its last solve
    resumed.load_state_dict(solved.state_dict())
    assert resumed.last_weights.dtype == torch.float64 and torch.equal(resumed.last_weights, solved.last_weights)


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


def test_nashmtl_start_falls_back_to_the_shifted_min_norm_weights() -> None:
    # unit gradients at 0°, 20° and 140°: (C1)_3 ∝ 1 + cos 140° + cos 120° < 0, so ones is no linearisation
    # point; the min-norm point is the midpoint of u_1 and u_3 (⟨u_2, mid⟩ > ‖mid‖²): w = (1/2, 0, 1/2)
    angles = np.deg2rad([0.0, 20.0, 140.0])
    u = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    frobenius = float(np.linalg.norm(u @ u.T))
    c = u @ u.T / frobenius
    margin = (1.0 + np.cos(angles[2])) / 2.0 / frobenius                          # min_i (Cw)_i, at i = 1, 3
    max_row_sum = (1.0 + np.cos(angles[1]) + np.cos(angles[2] - angles[1])) / frobenius   # (C1)_2
    shift = 0.5 * margin / max_row_sum
    assert shift < 1.0 / 3.0
    start = np.array([0.5, 0.0, 0.5]) + shift
    expected = start / np.sqrt(np.min(start * (c @ start)))       # on the boundary min_i α_i (Cα)_i = 1
    np.testing.assert_allclose(cccp_start(c, None, CONIC_STATIONARITY_TOL), expected, rtol=1e-7)


@pytest.mark.parametrize("niter", [1, 2, 3])
def test_nashmtl_runs_optim_niter_cccp_steps_when_it_does_not_converge(niter: int) -> None:
    grads = jacobian(2, 3, 10)
    _, _, method = nash(grads, optim_niter=niter, residual_tol=1e-300, step_tol=1e-300)
    assert method.last_iterations == niter
    # the same steps by hand: normalised Gramian C_n, the start point, niter CCCP steps, back to α
    m = gramian(grads)
    norms = np.sqrt(np.diag(m))
    correlation = m / np.outer(norms, norms)
    frobenius = float(np.linalg.norm(correlation))
    c = correlation / frobenius
    x = cccp_start(c, None, max(stationarity_tol(torch.float64), CONIC_STATIONARITY_TOL))
    problem = _CCCPProblem(3, "CLARABEL")
    for _ in range(niter):
        x = problem.step(c, x)
    np.testing.assert_allclose(method.last_weights.numpy(), x / (np.sqrt(frobenius) * norms), rtol=1e-9)


@pytest.mark.parametrize("value", [None, [float("inf"), 1.0], [float("nan"), 1.0], [0.0, 1.0]])
def test_a_cccp_step_without_finite_positive_weights_raises(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    # an "optimal" solve whose variable holds no usable weights (a solver bug the check guards against)
    monkeypatch.setattr("mtlflow.methods.nashmtl.solve_checked", lambda *args: None)
    problem = _CCCPProblem(2, "CLARABEL")
    problem.alpha = SimpleNamespace(value=None if value is None else np.array(value))
    with pytest.raises(SolverError) as error:
        problem.step(np.eye(2) / np.sqrt(2.0), np.ones(2))
    assert str(error.value) == ("nashmtl: the CLARABEL solve returned no positive weights; the task gradients "
                                "may be degenerate")


def test_a_fresh_nashmtl_checkpoints_no_weights() -> None:
    state = methods.build("nashmtl", 3).state_dict()
    assert state == {"alpha": None, "stationary_steps": 0}
    clone = methods.build("nashmtl", 3)
    clone.load_state_dict(state)
    assert clone._alpha is None and clone.last_weights is None and clone.stationary_steps == 0


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


@pytest.mark.parametrize(("installed", "asked", "message"), [
    (["SCS", "OSQP", "CLARABEL"], "ecos", "ECOS is not installed (installed: SCS, OSQP, CLARABEL); pip install ecos, "
                                          "or choose an installed one with --hp solver=CLARABEL"),
    (["OSQP", "SCS"], "mosek", "MOSEK is not installed (installed: OSQP, SCS); install MOSEK and its licence, or "
                               "choose an installed one with --hp solver=SCS"),
    ([], "Clarabel", "CLARABEL is not installed (installed: none); pip install clarabel, or choose an installed one "
                     "with --hp solver=CLARABEL"),
])
def test_a_missing_cvxpy_solver_is_named_with_the_installed_ones_and_the_fix(
        monkeypatch: pytest.MonkeyPatch, installed: list[str], asked: str, message: str) -> None:
    """The suggested replacement is the installed exponential-cone solver first in the order of preference
    (CLARABEL, ECOS, SCS, MOSEK), CLARABEL when none is installed."""
    import cvxpy

    from mtlflow.methods._cvx import require_solver

    monkeypatch.setattr(cvxpy, "installed_solvers", lambda: installed)
    with pytest.raises(SolverError) as exc:
        require_solver("nashmtl", asked)
    assert str(exc.value) == f"nashmtl: cvxpy solver {message}"


def test_an_installed_cvxpy_solver_is_returned_by_its_canonical_name() -> None:
    from mtlflow.methods._cvx import require_solver

    assert require_solver("nashmtl", "clarabel") == "CLARABEL"


def test_nashmtl_rejects_solvers_without_exponential_cones() -> None:
    with pytest.raises(InvalidParameterError, match="solver"):
        methods.build("nashmtl", 2, solver="OSQP")


def test_a_non_optimal_status_raises() -> None:
    import cvxpy as cp

    x = cp.Variable()
    infeasible = cp.Problem(cp.Minimize(x), [x >= 1, x <= 0])
    with pytest.raises(SolverError, match="status 'infeasible'"):
        solve_checked(infeasible, "CLARABEL", "nashmtl")


def test_a_failing_cccp_solve_raises_one_clear_error_naming_nashmtl(monkeypatch: pytest.MonkeyPatch) -> None:
    import cvxpy as cp

    def fail(problem: Any, **options: Any) -> None:
        raise cp.error.SolverError("Solver 'CLARABEL' failed.")

    monkeypatch.setattr(cp.Problem, "solve", fail)
    with pytest.raises(SolverError) as error:
        methods.build("nashmtl", 3).weights_from_gramian(torch.from_numpy(gramian(jacobian(2, 3, 10))),
                                                         torch.ones(3, dtype=torch.float64))
    assert str(error.value) == ("nashmtl: the CLARABEL solve failed (Solver 'CLARABEL' failed.); the task gradients "
                                "may be degenerate (zero, NaN or linearly dependent)")


def test_a_non_finite_gramian_raises_one_clear_error_naming_nashmtl() -> None:
    from mtlflow.core.errors import NonFiniteValueError

    m = torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]], dtype=torch.float64)
    with pytest.raises(NonFiniteValueError) as error:
        methods.build("nashmtl", 2).weights_from_gramian(m, torch.ones(2, dtype=torch.float64))
    assert str(error.value) == ("nashmtl: the task-gradient Gramian contains NaN or Inf; check the losses and "
                                "lower --lr")


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

def test_alignedmtl_of_zero_gradients_is_the_zero_update_with_the_mean_weights() -> None:
    """No non-zero eigenvalue to align: the transform is the identity, so the weights are the preference 1/K."""
    d, method = direction("alignedmtl", torch.zeros(3, 5, dtype=torch.float64))
    assert np.array_equal(d, np.zeros(5))
    assert method.last_weights.dtype == torch.float64
    np.testing.assert_array_equal(method.last_weights.numpy(), np.full(3, 1 / 3))


@pytest.mark.parametrize("scale_mode", ["min", "median", "rmse"])
@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
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

    for seed, k, p in FULL_RANK + RANK_DEFICIENT:
        j = jacobian(seed, k, p)
        _, method = direction("alignedmtl", j, scale_mode=scale_mode)
        reference = AlignedMTLWeighting(scale_mode=scale_mode)(j @ j.T)
        np.testing.assert_allclose(method.last_weights.numpy(), reference.numpy(), rtol=1e-9, atol=1e-12)


# -- UPGrad --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
def test_upgrad_matches_torchjd(seed: int, k: int, p: int) -> None:
    from torchjd._linalg import QuadprogProjector
    from torchjd.aggregation import UPGrad as TorchJDUPGrad

    j = jacobian(seed, k, p)
    d, _ = direction("upgrad", j, solver="quadprog")
    # TorchJD's defaults except norm_eps = 0 (TorchJD zeroes Gramians with trace < 1e-4)
    reference = TorchJDUPGrad(projector=QuadprogProjector(norm_eps=0.0, reg_eps=1e-4))(j).numpy()
    np.testing.assert_allclose(d, reference, rtol=1e-7, atol=1e-9)


def test_upgrad_quadprog_is_scale_free_below_unit_trace_and_zero_on_zero_gradients() -> None:
    """TorchJD's formulation normalises G by its trace, so gradients 1000 times smaller (trace < 1) get the same
    weights and a 1000 times shorter update; an all-zero Jacobian gets the update 0, weights 1/K."""
    j = jacobian(7, 3, 6) - 0.5 * jacobian(8, 1, 6)
    d, method = direction("upgrad", j, solver="quadprog")
    small, small_method = direction("upgrad", 1e-3 * j, solver="quadprog")
    assert float(np.trace((1e-3 * j.numpy()) @ (1e-3 * j.numpy()).T)) < 1.0
    np.testing.assert_allclose(small_method.last_weights.numpy(), method.last_weights.numpy(), rtol=1e-9)
    np.testing.assert_allclose(small, 1e-3 * d, rtol=1e-9, atol=1e-15)
    zero, zero_method = direction("upgrad", torch.zeros(3, 6, dtype=torch.float64), solver="quadprog")
    assert np.array_equal(zero, np.zeros(6))
    np.testing.assert_array_equal(zero_method.last_weights.numpy(), np.full(3, 1 / 3))


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


# -- the family contract -----------------------------------------------------------------------------


def pcgrad_brute_force(g: np.ndarray, orders: list[list[int]]) -> np.ndarray:
    """Yu et al.'s Alg. 1 on the rows themselves: each g_i is projected onto the normal plane of every g_j it
    conflicts with, in its visiting order, and the projected gradients are summed."""
    total = np.zeros(g.shape[1])
    for i, order in enumerate(orders):
        projected_i = g[i].copy()
        for j in order:
            dot = projected_i @ g[j]
            if dot < 0:
                projected_i -= dot / (g[j] @ g[j]) * g[j]
        total += projected_i
    return total


def assert_bargaining_fixed_point_or_pareto_stationary(grads: torch.Tensor, method: methods.Method,
                                                       direction: torch.Tensor) -> None:
    """Nash-MTL and FairGrad with α = 1: α ⊙ Gα = 1 with α > 0 (every task improves), or, where 0 is in the
    convex hull of the gradients (no such α exists), a step counted as stationary with a zero update from
    non-negative weights."""
    g, w, d = grads.numpy(), method.last_weights.numpy(), direction.numpy()
    scale = float(np.linalg.norm(g, axis=1).max())
    if method.stationary_steps:
        assert np.all(w >= -1e-9) and w.sum() > 0
        assert np.linalg.norm(d) <= 1e-6 * scale
    else:
        assert np.all(w > 0)
        np.testing.assert_allclose(w * (g @ g.T @ w), 1.0, atol=1e-5)


class TestAlignedMTL(GramianContract):
    name = "alignedmtl"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """Alg. 1 (scale_mode "min"): Ĵ = σ_min U_r V_rᵀ from J's thin SVD on its row space, d = Ĵᵀ 1/K."""
        u, s, vh = np.linalg.svd(grads.numpy(), full_matrices=False)
        rank = int(np.sum(s > s[0] * max(grads.shape) * 1e-12))
        aligned = s[rank - 1] * u[:, :rank] @ vh[:rank]
        np.testing.assert_allclose(direction.numpy(), aligned.T @ np.full(self.n_tasks, 1 / self.n_tasks),
                                   rtol=1e-8, atol=1e-10 * s[0])


class TestCAGrad(GramianContract):
    name = "cagrad"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """Alg. 1: max_d min_i g_i·d on the ball ‖d − g_0‖ ≤ c‖g_0‖ (c = 0.4): on its sphere, and as good as
        the primal solved with cvxpy."""
        j, d = grads.numpy(), direction.numpy()
        g0 = j.mean(axis=0)
        radius = 0.4 * np.linalg.norm(g0)
        assert np.linalg.norm(d - g0) == pytest.approx(radius, rel=1e-8)
        reference = cagrad_primal(j, 0.4)
        assert (j @ d).min() >= (j @ reference).min() - 1e-6 * float(np.linalg.norm(j, axis=1).max()) * radius


class TestFairGrad(GramianContract):
    name = "fairgrad"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        assert_bargaining_fixed_point_or_pareto_stationary(grads, method, direction)


class TestGradVac(GramianContract):
    name = "gradvac"
    task_symmetric = False

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """The first step (targets φ̂ = 0) is PCGrad's Alg. 1 in the method's own visiting orders."""
        orders = MethodGenerator("gradvac", 3).visiting_orders(self.n_tasks)
        np.testing.assert_allclose(direction.numpy(), pcgrad_brute_force(grads.numpy(), orders),
                                   rtol=1e-9, atol=1e-12 * float(grads.norm(dim=1).max()))


class TestIMTLG(GramianContract):
    name = "imtlg"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        assert_solves_the_imtlg_equations(method.last_weights.numpy(), grads.numpy())


class TestMGDA(GramianContract):
    name = "mgda"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """The min-norm point of the convex hull: weights on the simplex meeting the KKT conditions."""
        w = method.last_weights.numpy()
        assert_on_simplex(w)
        assert max(kkt_residuals(gramian(grads), w, active=1e-6)) <= 1e-6


class TestMGDAUB(GramianContract):
    name = "mgdaub"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """normalization "none" (the paper): the min-norm point of the hull of the gradients, as MGDA."""
        w = method.last_weights.numpy()
        assert_on_simplex(w)
        assert max(kkt_residuals(gramian(grads), w, active=1e-6)) <= 1e-6


class TestNashMTL(GramianContract):
    name = "nashmtl"
    solver_atol = 1e-7

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        assert_bargaining_fixed_point_or_pareto_stationary(grads, method, direction)


class TestPCGrad(GramianContract):
    name = "pcgrad"
    task_symmetric = False

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        orders = MethodGenerator("pcgrad", 3).visiting_orders(self.n_tasks)
        np.testing.assert_allclose(direction.numpy(), pcgrad_brute_force(grads.numpy(), orders),
                                   rtol=1e-9, atol=1e-12 * float(grads.norm(dim=1).max()))


class TestUPGrad(GramianContract):
    name = "upgrad"

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        """Non-conflicting: g_i·d ≥ 0 for every task (to rounding of the largest ‖g_i‖²)."""
        g = grads.numpy()
        assert (g @ direction.numpy()).min() >= -1e-10 * float((g ** 2).sum(axis=1).max())


def test_fairgrad_resumes_its_count_of_stationary_steps() -> None:
    saved = methods.build("fairgrad", 2)
    saved.stationary_steps = 3
    resumed = methods.build("fairgrad", 2)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.stationary_steps == 3
    fresh = methods.build("fairgrad", 2)
    fresh.load_state_dict({})  # a checkpoint from before the count was saved
    assert fresh.stationary_steps == 0


def test_a_method_without_cvxpy_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtlflow.methods._cvx import require_cvxpy

    hide_cvxpy(monkeypatch)
    with pytest.raises(SolverError) as error:
        require_cvxpy("nashmtl")
    assert str(error.value) == "nashmtl needs cvxpy: pip install cvxpy (it brings the Clarabel solver)"


def test_mgda_without_quadprog_says_how_to_install_it_or_which_solver_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "quadprog")
    with pytest.raises(SolverError) as error:
        methods.build("mgda", 2).weights_from_gramian(torch.eye(2, dtype=torch.float64), torch.ones(2))
    assert str(error.value) == ("MGDA's exact solver needs quadprog: pip install 'torchjd[quadprog-projector]' "
                                "or use solver='frank-wolfe'")


def test_mgdaub_frank_wolfe_reaches_the_min_norm_weights_of_the_normalised_gramian() -> None:
    # three gradients in the plane; the min-norm point of their convex hull, brute-forced on a fine simplex grid
    g = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]], dtype=torch.float64)
    gramian = g @ g.T
    losses = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    steps = 400
    i, j = np.meshgrid(np.arange(steps + 1), np.arange(steps + 1), indexing="ij")
    keep = i + j <= steps
    grid = np.stack([i[keep], j[keep], steps - i[keep] - j[keep]], axis=1) / steps
    unit = (g / torch.linalg.norm(g, dim=1, keepdim=True)).numpy()  # normalization=l2
    best = torch.from_numpy(grid[np.argmin(np.linalg.norm(grid @ unit, axis=1))])
    method = methods.build("mgdaub", 3, solver="frank-wolfe", normalization="l2", max_iter=5000, tol=1e-12)
    weights = method.weights_from_gramian(gramian, losses)
    assert torch.allclose(weights, best, atol=5e-3)


def test_mgdaub_normalisers_are_those_of_sener_and_koltun() -> None:
    """Sec. 3.3's normalisations of g_i before the min-norm solve: none, ‖g_i‖ (l2), L_i (loss), L_i ‖g_i‖ (loss+),
    by hand for gradients shorter and longer than 1."""
    from mtlflow.methods.mgdaub import gradient_normalizers

    g = torch.tensor([[0.3, 0.4], [6.0, 8.0]], dtype=torch.float64)     # norms 0.5 and 10
    losses = torch.tensor([2.0, 0.25], dtype=torch.float64)
    expected = {"none": [1.0, 1.0], "l2": [0.5, 10.0], "loss": [2.0, 0.25], "loss+": [1.0, 2.5]}
    for kind, values in expected.items():
        torch.testing.assert_close(gradient_normalizers(g @ g.T, losses, kind),
                                   torch.tensor(values, dtype=torch.float64), rtol=1e-12, atol=0)
    # the method solves the min-norm problem of the normalised gradients g_i / L_i: two tasks in closed form
    u = (g / losses[:, None]).numpy()
    diff = u[0] - u[1]
    gamma = float(np.clip((u[1] @ u[1] - u[0] @ u[1]) / (diff @ diff), 0.0, 1.0))
    weights = methods.build("mgdaub", 2, normalization="loss").weights_from_gramian(g @ g.T, losses)
    np.testing.assert_allclose(weights.numpy(), [gamma, 1.0 - gamma], rtol=1e-9)
    zero_task = torch.tensor([[0.0, 0.0], [6.0, 8.0]], dtype=torch.float64)   # ‖g_1‖ = 0: nothing to divide by
    with pytest.raises(SolverError) as error:
        methods.build("mgdaub", 2, normalization="l2").weights_from_gramian(zero_task @ zero_task.T, losses)
    assert str(error.value) == ("mgdaub: normalization 'l2' needs positive losses and non-zero gradients; use "
                                "normalization=none")


def test_upgrad_without_quadprog_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "quadprog")
    with pytest.raises(SolverError) as error:
        direction("upgrad", jacobian(70, 2, 3), solver="quadprog")
    assert str(error.value) == "upgrad needs quadprog: pip install 'torchjd[quadprog-projector]' (or quadprog)"


def test_upgrad_refuses_a_singular_gramian_without_ridge_naming_the_remedies() -> None:
    # a duplicated task makes G singular; with reg_eps = 0 quadprog rejects it as not positive definite
    j = jacobian(71, 3, 5)
    j[2] = j[0]
    with pytest.raises(SolverError) as error:
        direction("upgrad", j, solver="quadprog", reg_eps=0.0)
    assert str(error.value) == ("upgrad: the dual-cone QP failed (matrix G is not positive definite); increase "
                                "--hp reg_eps or use --hp solver=nnls")
