"""Nash-MTL's CCCP solver piece by piece: one CCCP step solves the documented convex subproblem (checked
against its KKT conditions and SciPy's SLSQP, with ∇φ by finite differences), the start point (warm start,
ones, the shifted min-norm weights; scaled onto the constraint boundary), the two stopping rules and the
iteration count they give, the warm start from the previous solve (and from a checkpoint), and the message
when cvxpy disappears before the problem is first built, or is missing (or lacks the solver) at
construction. One task (α = 1/‖g‖) and the Pareto-stationary steps (a zero gradient; their count). Also
MOML's restore of a stateful upper-level solver (MoCo), which continues the uninterrupted run exactly.
"""

from __future__ import annotations

import itertools
import warnings

import cvxpy as cp
import numpy as np
import pytest
import torch
from method_helpers import hide_cvxpy, jacobian, positive_losses, through_torch_save

from mtlflow import methods
from mtlflow.core.errors import SolverError
from mtlflow.methods._moblo import TaskWeights, build_outer_optimizer
from mtlflow.methods.nashmtl import CONIC_STATIONARITY_TOL, _CCCPProblem, cccp_start, stationarity_tol
from mtlflow.methods.solvers import min_norm_weights_qp

TOL = max(stationarity_tol(torch.float64), CONIC_STATIONARITY_TOL)


def planar_gradients(degrees: list[float], norms: list[float]) -> torch.Tensor:
    angles = np.deg2rad(degrees)
    return torch.tensor(np.stack([np.cos(angles), np.sin(angles)], axis=1) * np.array(norms)[:, None])


# three gradients spanning 175°: far from their Nash point, the CCCP from ones needs several steps
SPREAD = planar_gradients([0.0, 5.0, 175.0], [1.0, 10.0, 0.1])


def normalised_gramian(grads: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(C_n, the map α -> α_n) of the module docstring: the Frobenius-normalised correlation matrix."""
    m = (grads @ grads.T).numpy()
    norms = np.sqrt(np.diag(m))
    correlation = m / np.outer(norms, norms)
    frobenius = float(np.linalg.norm(correlation))
    return correlation / frobenius, np.sqrt(frobenius) * norms


def solve(grads: torch.Tensor, method: methods.Method | None = None, **hparams) -> methods.Method:
    method = method or methods.build("nashmtl", grads.shape[0], **hparams)
    method.combine(grads, torch.ones(grads.shape[0], dtype=torch.float64))
    return method


def hand_iterates(c: np.ndarray, steps: int) -> list[np.ndarray]:
    """x_0 (the cold start) and the CCCP iterates x_1 .. x_steps."""
    iterates = [cccp_start(c, None, TOL)]
    problem = _CCCPProblem(c.shape[0], "CLARABEL")
    for _ in range(steps):
        iterates.append(problem.step(c, iterates[-1]))
    return iterates


# -- one CCCP step -------------------------------------------------------------------------------

def test_a_cccp_step_solves_the_linearised_subproblem() -> None:
    """min Σ_i (Cα)_i + ∇φ(x)ᵀα s.t. log α_i + log (Cα)_i ≥ 0, φ(α) = Σ_i log α_i + log (Cα)_i:
    the step's result satisfies the KKT conditions (sufficient, the problem is convex) with ∇φ by central
    differences, and agrees with SciPy's SLSQP on the same problem."""
    c, _ = normalised_gramian(SPREAD)
    x = cccp_start(c, None, TOL)

    def phi(a: np.ndarray) -> float:
        return float(np.sum(np.log(a) + np.log(c @ a)))

    h = 1e-6 * float(np.min(x))
    linear = np.array([(phi(x + h * e) - phi(x - h * e)) / (2 * h) for e in np.eye(3)])
    new = _CCCPProblem(3, "CLARABEL").step(c, x)
    assert new.dtype == np.float64
    products = new * (c @ new)
    assert np.all(products >= 1.0 - 1e-6)                      # feasible
    active = products - 1.0 <= 1e-4
    assert 0 < active.sum() < 3                                # not the Nash point: the objective matters
    objective_gradient = c.sum(axis=0) + linear
    constraint_gradients = (np.eye(3) / new[:, None] + c / (c @ new)[:, None])[active]
    multipliers, *_ = np.linalg.lstsq(constraint_gradients.T, objective_gradient, rcond=None)
    assert np.all(multipliers > 0)
    stationarity = np.linalg.norm(constraint_gradients.T @ multipliers - objective_gradient)
    assert stationarity <= 1e-4 * np.linalg.norm(objective_gradient)
    # the same problem in its concave form (log α + log Cα ≥ 0) by another algorithm, SCS's first-order
    # conic solver; SciPy's SLSQP was the reference before and stopped short on some hosts' BLAS (status 8,
    # "positive directional derivative", with x ~ 100: the problem is badly scaled for it)
    alpha = cp.Variable(3)
    reference = cp.Problem(cp.Minimize(objective_gradient @ alpha), [cp.log(alpha) + cp.log(c @ alpha) >= 0])
    reference.solve(solver="SCS", eps=1e-9, max_iters=200_000)
    assert reference.status == "optimal"
    np.testing.assert_allclose(new, alpha.value, rtol=1e-3)


# -- the start point -----------------------------------------------------------------------------

def assert_on_boundary_along(start: np.ndarray, c: np.ndarray, direction: np.ndarray) -> None:
    """start = t·direction with t > 0 and min_i start_i (C start)_i = 1."""
    assert np.all(np.isfinite(start))
    t = float(start @ direction) / float(direction @ direction)
    assert t > 0
    np.testing.assert_allclose(start, t * direction, rtol=1e-12)
    assert float(np.min(start * (c @ start))) == pytest.approx(1.0, rel=1e-12)


C_POSITIVE = np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 1.0]])


def test_the_cccp_starts_from_ones_when_they_qualify() -> None:
    assert_on_boundary_along(cccp_start(C_POSITIVE, None, TOL), C_POSITIVE, np.ones(3))


def test_the_cccp_starts_from_a_qualifying_warm_start() -> None:
    warm = np.array([1.0, 2.0, 3.0])
    assert_on_boundary_along(cccp_start(C_POSITIVE, warm, TOL), C_POSITIVE, warm)


def test_a_warm_start_with_a_zero_weight_is_no_linearisation_point() -> None:
    warm = np.array([1.0, 1.0, 0.0])            # Cα > 0, but α_3 = 0: log α_3 is not defined there
    assert np.all(C_POSITIVE @ warm > 0)
    assert_on_boundary_along(cccp_start(C_POSITIVE, warm, TOL), C_POSITIVE, np.ones(3))


def test_ones_with_a_zero_row_sum_are_no_linearisation_point() -> None:
    """Unit gradients u_1 = e_1, u_2, u_3 with cos(u_1, u_j) = -1/2, cos(u_2, u_3) = 1/4: (C1)_1 = 0 exactly.
    The min-norm weights are (3, 2, 2)/7 (Cw = 1/7 everywhere), margin 1/7, max|C1| = 3/4, shift 2/21:
    start (11, 8, 8)/21 with α(Cα) = (33, 36, 36)/441, scaled to (11, 8, 8)/√33."""
    c = np.array([[1.0, -0.5, -0.5], [-0.5, 1.0, 0.25], [-0.5, 0.25, 1.0]])
    assert (c @ np.ones(3))[0] == 0.0
    np.testing.assert_allclose(cccp_start(c, None, TOL), np.array([11.0, 8.0, 8.0]) / np.sqrt(33.0), rtol=1e-7)


# -- stopping rules and iteration counts ---------------------------------------------------------

@pytest.mark.parametrize("residual_tol", [0.2, 0.05, 1e-3])
def test_the_cccp_stops_at_the_first_iterate_whose_residual_is_below_residual_tol(residual_tol: float) -> None:
    c, to_normalised = normalised_gramian(SPREAD)
    iterates = hand_iterates(c, 20)
    residuals = [np.linalg.norm(c @ x - 1.0 / x) for x in iterates[1:]]
    expected = next(n for n, r in enumerate(residuals, start=1) if r < residual_tol)
    assert 1 < expected < 20
    method = solve(SPREAD, residual_tol=residual_tol, step_tol=1e-300)
    assert method.last_iterations == expected
    np.testing.assert_allclose(method.last_weights.numpy(), iterates[expected] / to_normalised, rtol=1e-9)


@pytest.mark.parametrize("step_tol", [10.0, 1e-3])
def test_the_cccp_stops_at_the_first_step_shorter_than_step_tol(step_tol: float) -> None:
    c, to_normalised = normalised_gramian(SPREAD)
    iterates = hand_iterates(c, 20)
    steps = [np.linalg.norm(b - a) for a, b in itertools.pairwise(iterates)]
    expected = next(n for n, s in enumerate(steps, start=1) if s < step_tol)
    assert 1 < expected < 20
    method = solve(SPREAD, residual_tol=1e-300, step_tol=step_tol)
    assert method.last_iterations == expected
    np.testing.assert_allclose(method.last_weights.numpy(), iterates[expected] / to_normalised, rtol=1e-9)


def test_a_second_solve_of_the_same_gramian_starts_at_the_solution_and_takes_one_step() -> None:
    """The warm start is the previous weights in normalised units: the CCCP's fixed point, which one step
    reproduces. The cold start (ones) needs several steps here; so does a fresh instance, while one restored
    from the checkpoint warm-starts too."""
    method = solve(SPREAD)
    cold = method.last_iterations
    assert cold > 1
    first = method.last_weights.clone()
    restored = methods.build("nashmtl", 3)
    restored.load_state_dict(through_torch_save(method.state_dict()))
    solve(SPREAD, method)
    assert method.last_iterations == 1
    np.testing.assert_allclose(method.last_weights.numpy(), first.numpy(), rtol=1e-6)
    assert solve(SPREAD, restored).last_iterations == 1
    assert solve(SPREAD).last_iterations == cold
    m = (SPREAD @ SPREAD.T).numpy()
    alpha = method.last_weights.numpy()
    np.testing.assert_allclose(alpha * (m @ alpha), np.ones(3), atol=1e-5)


# -- cvxpy imported lazily -----------------------------------------------------------------------

def test_the_cccp_problem_built_without_cvxpy_names_nashmtl(monkeypatch: pytest.MonkeyPatch) -> None:
    method = methods.build("nashmtl", 3)          # cvxpy and the solver were there at construction
    hide_cvxpy(monkeypatch)
    with pytest.raises(SolverError) as error:
        solve(jacobian(2, 3, 10), method)          # the CCCP problem is built on the first K ≥ 3 solve
    assert str(error.value) == "nashmtl needs cvxpy: pip install cvxpy (it brings the Clarabel solver)"


def test_building_nashmtl_without_cvxpy_names_nashmtl(monkeypatch: pytest.MonkeyPatch) -> None:
    # the solver check at construction is the first place cvxpy is imported
    hide_cvxpy(monkeypatch)
    with pytest.raises(SolverError) as error:
        methods.build("nashmtl", 2)
    assert str(error.value) == "nashmtl needs cvxpy: pip install cvxpy (it brings the Clarabel solver)"


def test_building_nashmtl_without_its_default_solver_names_nashmtl_and_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import cvxpy

    monkeypatch.setattr(cvxpy, "installed_solvers", lambda: ["OSQP"])    # no exponential-cone solver
    with pytest.raises(SolverError) as error:
        methods.build("nashmtl", 2)
    assert str(error.value) == ("nashmtl: cvxpy solver CLARABEL is not installed (installed: OSQP); "
                                "pip install clarabel, or choose an installed one with --hp solver=CLARABEL")


# -- one task and zero gradients -----------------------------------------------------------------

def test_nashmtl_with_one_task_weights_it_one_over_its_norm() -> None:
    """K = 1: α (GᵀG α) = 1 is α‖g‖² = 1/α, so α = 1/‖g‖ = 1/5 for g = (3, 4) and d = g/‖g‖ = (0.6, 0.8)."""
    method = methods.build("nashmtl", 1)
    d = method.combine(torch.tensor([[3.0, 4.0]], dtype=torch.float64), torch.ones(1, dtype=torch.float64))
    assert method.last_weights.tolist() == pytest.approx([0.2], rel=1e-15)
    np.testing.assert_allclose(d.numpy(), [0.6, 0.8], rtol=1e-15)
    assert method.last_residual == pytest.approx(0.0, abs=1e-15)
    assert method.stationary_steps == 0 and method.last_iterations == 0


@pytest.mark.parametrize("grads", [
    [[0.0, 0.0]],
    [[1.0, 0.0], [0.0, 0.0]],
    [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
])
def test_nashmtl_with_an_exactly_zero_gradient_takes_the_stationary_min_norm_step(grads: list) -> None:
    """A zero gradient puts 0 in the convex hull (Pareto-stationary): no bargaining solution, so the min-norm
    weights, whose direction is 0, without a solve (which would divide by the zero norm)."""
    g = torch.tensor(grads, dtype=torch.float64)
    method = methods.build("nashmtl", g.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # the solve's division by ‖0‖ would only warn at K = 2
        d = method.combine(g, torch.ones(g.shape[0], dtype=torch.float64))
    assert method.stationary_steps == 1 and method.last_residual is None and method.last_iterations == 0
    assert float(d.norm()) <= 1e-8
    np.testing.assert_allclose(method.last_weights.numpy(), min_norm_weights_qp(g @ g.T).numpy())


def test_nashmtl_counts_every_pareto_stationary_step_and_clears_the_residual() -> None:
    """Anti-parallel gradients g and -3g: 0 is in their hull. After an ordinary solve (a float residual), two
    stationary steps count 2, in the checkpoint too, and leave no residual (nothing was solved)."""
    method = methods.build("nashmtl", 2)
    ones = torch.ones(2, dtype=torch.float64)
    method.combine(torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64), ones)
    assert isinstance(method.last_residual, float) and method.stationary_steps == 0
    stationary = torch.tensor([[1.0, 2.0], [-3.0, -6.0]], dtype=torch.float64)
    for _ in range(2):
        method.combine(stationary, ones)
    assert method.stationary_steps == 2 and method.state_dict()["stationary_steps"] == 2
    assert method.last_residual is None


# -- MOML with a stateful upper-level solver ------------------------------------------------------

def test_a_restored_moml_continues_its_moco_upper_solver_exactly() -> None:
    def fresh() -> methods.Method:
        method = methods.build("moml", 2, upper_solver="moco")
        method.state.upper = TaskWeights(2, "projection", torch.device("cpu"))
        method.state.optimizer = build_outer_optimizer(method.hp, method.state.upper.variable)
        return method

    saved = fresh()
    for seed in (1, 2):
        saved.solver.combine(jacobian(seed, 2, 2), positive_losses(seed, 2))
    resumed = fresh()
    resumed.load_state_dict(through_torch_save(saved.state_dict()))
    assert resumed.solver.step == 2
    hyper, losses = jacobian(3, 2, 2), positive_losses(3, 2)
    expected = saved.solver.combine(hyper, losses)            # the uninterrupted run
    assert not torch.allclose(fresh().solver.combine(hyper, losses), expected)
    assert torch.equal(resumed.solver.combine(hyper, losses), expected)
    assert torch.equal(resumed.solver.lam, saved.solver.lam)
