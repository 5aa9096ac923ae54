"""Defining properties of the registered methods, checked on random Jacobians.

MGDA: the min-norm point of the convex hull of the task gradients (KKT conditions, closed form for two
tasks, common descent). FairGrad: the α-fair fixed point GᵀG w = w^(-1/α). FAMO: the logit update
direction, the gradient of its objective, uniform start and exact state round trip. LS: equal weights.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtlflow import methods
from mtlflow.core.errors import InvalidParameterError, UnknownNameError, UsageError
from mtlflow.methods.base import StepContext

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True)


def random_jacobian(seed: int, k: int, p: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(k, p, generator=gen, dtype=torch.float64) * scale


def gramian(grads: torch.Tensor) -> np.ndarray:
    return (grads @ grads.T).numpy()


# Seeded cases: (seed, K, P) with K <= P (full rank) and K > P (rank-deficient Gramian).
SHAPES = [(0, 2, 3), (1, 2, 50), (2, 3, 10), (3, 4, 4), (4, 5, 30), (5, 8, 20), (6, 8, 100),
          (7, 5, 3), (8, 8, 2), (9, 3, 2)]


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
    grads = random_jacobian(seed, k, p, scale)
    w, _ = mgda_direction(grads, "qp")
    assert_on_simplex(w)
    stationarity, complementarity = kkt_residuals(gramian(grads), w, active=1e-6)
    assert stationarity <= 1e-6
    assert complementarity <= 1e-6


@pytest.mark.parametrize("seed,k,p", SHAPES)
def test_mgda_frank_wolfe_satisfies_kkt_loosely(seed: int, k: int, p: int) -> None:
    grads = random_jacobian(seed, k, p)
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
    grads = random_jacobian(seed, k, p, 10.0 ** log_scale)
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
    grads = random_jacobian(seed, 2, 5)
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


FULL_RANK = [(s, k, p) for s, k, p in SHAPES if k <= p]


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_fairgrad_solves_fixed_point(alpha: float, seed: int, k: int, p: int) -> None:
    grads = random_jacobian(seed, k, p)
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
    grads = random_jacobian(seed, k, k + extra)
    w, _ = fairgrad_solve(grads, alpha)
    assert np.all(w > 0)
    assert fixed_point_residual(gramian(grads), w, alpha) <= 1e-5


@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_fairgrad_alpha_one_is_nash_bargaining(seed: int, k: int, p: int) -> None:
    grads = random_jacobian(seed, k, p)
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
        grads = random_jacobian(seed, k, 10, scale=1e-3)
        for alpha in (0.5, 1.0, 2.0):
            w, _ = fairgrad_solve(grads, alpha)
            worst = max(worst, fixed_point_residual(gramian(grads), w, alpha))
    assert worst <= 1e-4, f"worst relative fixed-point residual {worst:.3g} at gradient scale 1e-3"


# -- FAMO -----------------------------------------------------------------------------------------

def test_famo_starts_uniform_and_weights_sum_to_one() -> None:
    famo = methods.build("famo", 4)
    equal = torch.full((4,), 0.7, dtype=torch.float64)
    torch.testing.assert_close(famo.task_weights(), torch.full((4,), 0.25))
    torch.testing.assert_close(famo.weights(equal), torch.full((4,), 0.25, dtype=torch.float64))
    unequal = torch.tensor([0.1, 1.0, 2.5, 7.0], dtype=torch.float64)
    w = famo.weights(unequal)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.all(w > 0)
    # with equal logits the weights are inversely proportional to the losses (log-loss gradient)
    torch.testing.assert_close(w, (1 / unequal) / (1 / unequal).sum())


def test_famo_logit_update_moves_weight_to_the_task_that_improved_less() -> None:
    famo = methods.build("famo", 2)
    before = famo.task_weights().clone()
    famo.update_logits(torch.tensor([1.0, 0.1]))  # task 0 improved much more than task 1
    after = famo.task_weights()
    assert after[0] < before[0]
    assert after[1] > before[1]
    # the opposite observation moves it back the other way
    famo2 = methods.build("famo", 2)
    famo2.update_logits(torch.tensor([0.1, 1.0]))
    assert famo2.task_weights()[0] > 0.5


def test_famo_logit_update_three_tasks() -> None:
    famo = methods.build("famo", 3)
    for _ in range(5):
        famo.update_logits(torch.tensor([2.0, 0.5, -1.0]))
    z = famo.task_weights()
    # the task that improved most loses weight, the one that got worse gains most
    assert z[0] < 1 / 3 < z[2]
    assert z[0] < z[1] < z[2]
    assert float(z.sum()) == pytest.approx(1.0, abs=1e-6)


def test_famo_hooks_update_logits_from_observed_decrease() -> None:
    famo = methods.build("famo", 2)
    losses = torch.tensor([1.0, 1.0])
    ctx = StepContext(step=0, epoch=1, losses=losses,
                      recompute_losses=lambda: torch.tensor([0.5, 0.95]))  # task 0 fell much more
    famo.before_backward(ctx)
    famo.after_optimizer_step(ctx)
    z = famo.task_weights()
    assert z[0] < 0.5 < z[1]


@pytest.mark.parametrize("k", [2, 3, 5])
def test_famo_objective_gradient_equals_weights(k: int) -> None:
    famo = methods.build("famo", k)
    gen = torch.Generator().manual_seed(k)
    for _ in range(3):  # make the logits non-uniform first
        famo.update_logits(torch.randn(k, generator=gen))
    losses = (torch.rand(k, generator=gen, dtype=torch.float64) * 3 + 0.05).requires_grad_(True)
    (grad,) = torch.autograd.grad(famo.objective(losses), losses)
    expected = famo.weights(losses.detach())
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(famo.last_weights, expected)
    assert not torch.allclose(expected, torch.full((k,), 1.0 / k, dtype=torch.float64))


def test_famo_state_dict_round_trip_is_exact() -> None:
    gen = torch.Generator().manual_seed(0)
    famo = methods.build("famo", 3, w_lr=0.05, gamma=0.01)
    for _ in range(4):
        famo.update_logits(torch.randn(3, generator=gen))
    famo.min_losses = torch.tensor([0.1, 0.0, -0.2])
    # go through bytes, as a checkpoint does
    buf = io.BytesIO()
    torch.save(famo.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=False)

    clone = methods.build("famo", 3, w_lr=0.05, gamma=0.01)
    clone.load_state_dict(state)
    assert torch.equal(clone.logits.detach(), famo.logits.detach())
    assert torch.equal(clone.min_losses, famo.min_losses)
    original_opt = famo._optimizer.state_dict()
    cloned_opt = clone._optimizer.state_dict()
    assert original_opt["param_groups"] == cloned_opt["param_groups"]
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(torch.as_tensor(original_opt["state"][0][key]), torch.as_tensor(cloned_opt["state"][0][key]))
    # the two continue identically
    for _ in range(3):
        delta = torch.randn(3, generator=gen)
        famo.update_logits(delta)
        clone.update_logits(delta)
    assert torch.equal(clone.logits.detach(), famo.logits.detach())


# -- LS -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 5])
def test_ls_weights_are_ones_and_objective_is_sum(k: int) -> None:
    ls = methods.build("ls", k)
    losses = (torch.arange(k, dtype=torch.float64) + 0.5).requires_grad_(True)
    torch.testing.assert_close(ls.weights(losses.detach()), torch.ones(k, dtype=torch.float64))
    objective = ls.objective(losses)
    assert float(objective.detach()) == pytest.approx(float(losses.detach().sum()))
    (grad,) = torch.autograd.grad(objective, losses)
    torch.testing.assert_close(grad, torch.ones(k, dtype=torch.float64))


# -- registry -------------------------------------------------------------------------------------

def test_registry_lists_the_four_methods() -> None:
    names = methods.available()
    assert {"ls", "mgda", "famo", "fairgrad"} <= set(names)
    assert names == sorted(names)
    for name in names:
        info = methods.info(name)
        assert info.name == name and info.paper and info.family


def test_registry_rejects_unknown_name_listing_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as exc:
        methods.build("nope", 2)
    message = str(exc.value)
    assert "'nope'" in message
    for name in methods.available():
        assert name in message
    assert exc.value.valid == methods.available()
    assert isinstance(exc.value, UsageError) and exc.value.exit_code == 2


@pytest.mark.parametrize("name,hparams,fragment", [
    ("fairgrad", {"alpha": 0.0}, "alpha"),
    ("fairgrad", {"alpha": -1.0}, "alpha"),
    ("fairgrad", {"alpha": float("nan")}, "finite"),
    ("fairgrad", {"alpha": "big"}, "alpha"),
    ("mgda", {"solver": "x"}, "solver"),
    ("mgda", {"max_iter": 0}, "max_iter"),
    ("famo", {"w_lr": 0.0}, "w_lr"),
    ("famo", {"gamma": -0.1}, "gamma"),
    ("ls", {"alpha": 1.0}, "unknown hyper-parameter"),
    ("mgda", {"alpha": 1.0}, "valid: max_iter, solver, tol"),
])
def test_registry_rejects_invalid_hparams(name: str, hparams: dict, fragment: str) -> None:
    with pytest.raises(InvalidParameterError) as exc:
        methods.build(name, 2, **hparams)
    assert fragment in str(exc.value)
    assert exc.value.exit_code == 2


def test_registry_coerces_int_to_float_and_rejects_bad_task_count() -> None:
    method = methods.build("fairgrad", 2, alpha=2)
    assert method.hp["alpha"] == 2.0 and isinstance(method.hp["alpha"], float)
    with pytest.raises(InvalidParameterError):
        methods.build("ls", 0)
