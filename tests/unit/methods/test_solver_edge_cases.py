"""Edge cases of the small solvers behind the Gramian methods, each against a hand computation or a brute force.

* GradVac (Wang et al. 2021, Eq. 2): a zero gradient has cosine 0 with every task (its pairs are skipped and
  their targets decay towards 0), also when its Gramian diagonal rounds to a tiny negative number; cosines of
  (anti)parallel gradients are exactly ±1 although their Gramian ratio rounds past ±1; a target of 1, which
  the EMA reaches exactly after enough parallel steps, admits no finite correction and leaves the pair alone.
* UPGrad's exact NNLS solver: equal to the mean of the projections onto the dual cone found by enumerating
  the active sets (a brute force sharing nothing with the NNLS), with zero-gradient tasks and a single
  non-zero task; a weight past the float64 range is refused with one clear message.
* ``_cvx.solve_checked``: the solver it is given is the one that runs, the options reach it, and a missing
  cvxpy or a non-optimal status is reported with one exact message.
* CAGrad with a zero mean gradient of three tasks takes d = g_0 without a solve; MGDA's Frank-Wolfe stops at
  the first step below its tolerance and keeps identical gradients on the simplex; the stationarity margin of
  a Gramian diagonal rounding below zero is 0 without a NaN.
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings

import numpy as np
import pytest
import torch
from method_helpers import jacobian

from mtlflow import methods
from mtlflow.core.errors import SolverError
from mtlflow.methods._cvx import solve_checked
from mtlflow.methods.cagrad import cagrad_weights
from mtlflow.methods.gradvac import gradvac_coefficients
from mtlflow.methods.solvers import min_norm_weights_frank_wolfe, stationarity_margin, two_task_min_norm

# -- GradVac ------------------------------------------------------------------------------------------


def gradvac_with_targets(targets: np.ndarray, beta: float = 0.5) -> methods.Method:
    """A GradVac whose target cosines are ``targets``, restored as from a checkpoint of a running job."""
    method = methods.build("gradvac", targets.shape[0], 0, beta=beta)
    state = method.state_dict()
    state["targets"] = torch.from_numpy(targets.copy())
    method.load_state_dict(state)
    return method


@pytest.mark.parametrize("zero_diagonal", [0.0, -1e-20])
def test_gradvac_skips_the_pairs_of_a_zero_gradient_and_decays_their_targets_towards_cosine_zero(
        zero_diagonal: float) -> None:
    """g0 = (1, 0), g1 = 0, g2 = (-1, 1); every target 0.5, β = 0.5. Task 1 has cosine 0 with everything (as in
    TorchJD): its pairs are never corrected and their targets become 0.5·0.5 = 0.25. cos(g0, g2) = -1/√2 < 0.5,
    so Eq. (2) adds a·g2 to g0 and b·g0 to g2 with (φ = -1/√2, φ̂ = 1/2)
        a = |g0| (φ̂√(1-φ²) - φ√(1-φ̂²)) / (|g2| √(1-φ̂²)) = (1 + √3) / (2√3),   b = (1 + √3) / √3,
    and both targets become 0.25 - 0.5/√2. The visiting order does not matter here (the zero task is skipped).
    A handed-over Gramian may carry the zero gradient's diagonal as -1e-20 (accepted as rounding): the same
    result, with no invalid-value warning from a square root."""
    gram = torch.tensor([[1.0, 0.0, -1.0], [0.0, zero_diagonal, 0.0], [-1.0, 0.0, 2.0]], dtype=torch.float64)
    targets = np.full((3, 3), 0.5)
    np.fill_diagonal(targets, 0.0)
    method = gradvac_with_targets(targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = method.weights_from_gramian(gram, torch.ones(3, dtype=torch.float64)).numpy()
    a, b = (1 + math.sqrt(3)) / (2 * math.sqrt(3)), (1 + math.sqrt(3)) / math.sqrt(3)
    np.testing.assert_allclose(weights, [1 + b, 1.0, 1 + a], rtol=1e-14)
    corrected = 0.25 - 0.5 / math.sqrt(2)
    np.testing.assert_allclose(method.targets, [[0.0, 0.25, corrected], [0.25, 0.0, 0.25], [corrected, 0.25, 0.0]],
                               rtol=1e-14, atol=0)
    # the corrected cosines are the old target, 1/2 (the property Eq. (2) is built for)
    g0, g2 = np.array([1.0, 0.0]), np.array([-1.0, 1.0])
    for new, other in ((g0 + a * g2, g2), (g2 + b * g0, g0)):
        assert float(new @ other / (np.linalg.norm(new) * np.linalg.norm(other))) == pytest.approx(0.5, abs=1e-14)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradvac_cosines_of_parallel_gradients_are_exactly_plus_or_minus_one(sign: float) -> None:
    """g1 = ±2·g0 with g0 = (2, 3): the Gramian ratio 26 / (√13·√52) rounds to 1.0000000000000002, but a cosine is
    ±1, so the first step's targets are β·(±1) = ±0.5 exactly. Antiparallel gradients conflict: each is
    projected onto the other's normal plane (PCGrad, targets 0), which leaves nothing, so the update is 0."""
    grads = torch.tensor([[2.0, 3.0], [sign * 4.0, sign * 6.0]], dtype=torch.float64)
    gram = (grads @ grads.T).numpy()
    assert abs(gram[0, 1] / (math.sqrt(gram[0, 0]) * math.sqrt(gram[1, 1]))) > 1.0   # the rounding this is about
    method = methods.build("gradvac", 2, 0)
    d = method.combine(grads, torch.ones(2, dtype=torch.float64))
    np.testing.assert_array_equal(method.targets, [[0.0, sign * 0.5], [sign * 0.5, 0.0]])
    np.testing.assert_array_equal(d.numpy(), [0.0, 0.0] if sign < 0 else [6.0, 9.0])


def test_gradvac_leaves_a_pair_alone_once_its_target_reaches_one() -> None:
    """Identical gradients (3, 4) have cosine exactly 1; the EMA φ̂ ← ½φ̂ + ½ reaches 1 exactly in float64.
    Eq. (2) divides by √(1-φ̂²) = 0 then, so no finite correction exists: with orthogonal gradients next
    (cosine 0 < 1) the update is their plain sum and the targets fall to ½."""
    method = methods.build("gradvac", 2, 0)
    same = torch.tensor([[3.0, 4.0], [3.0, 4.0]], dtype=torch.float64)
    for _ in range(80):
        method.combine(same, torch.ones(2, dtype=torch.float64))
    np.testing.assert_array_equal(method.targets, [[0.0, 1.0], [1.0, 0.0]])
    orthogonal = torch.tensor([[3.0, 4.0], [4.0, -3.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = method.combine(orthogonal, torch.ones(2, dtype=torch.float64))
    np.testing.assert_array_equal(d.numpy(), [7.0, 1.0])
    np.testing.assert_array_equal(method.targets, [[0.0, 0.5], [0.5, 0.0]])


def test_gradvac_coefficients_of_a_pair_with_a_zero_gradient_are_untouched_whatever_the_target() -> None:
    """Through ``gradvac_coefficients`` directly, both roles: the zero task 0 as i (its row stays e_0) and as j
    (no task gets a multiple of it); its targets decay as (1 - β)·φ̂ for β = 0.3."""
    gram = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, -0.5], [0.0, -0.5, 1.0]])
    targets = np.array([[0.0, 0.9, -0.4], [0.7, 0.0, 0.2], [-0.6, 0.3, 0.0]])
    coef, new = gradvac_coefficients(gram, targets, [[1, 2], [0, 2], [1, 0]], 0.3)
    np.testing.assert_array_equal(coef[0], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(coef[:, 0], [1.0, 0.0, 0.0])
    for i, j in ((0, 1), (0, 2), (1, 0), (2, 0)):
        assert new[i, j] == pytest.approx(0.7 * targets[i, j], abs=1e-15)
    # cos(g1, g2) = -1/2 against 0.2 and 0.3: corrected, targets 0.7·φ̂ - 0.15
    assert new[1, 2] == pytest.approx(0.7 * 0.2 - 0.15, abs=1e-15)
    assert new[2, 1] == pytest.approx(0.7 * 0.3 - 0.15, abs=1e-15)


# -- UPGrad (exact NNLS solver) ------------------------------------------------------------------------


def projection_onto_dual_cone_by_active_sets(j: np.ndarray, g: np.ndarray) -> np.ndarray:
    """argmin_x ‖x - g‖ s.t. J x ≥ 0 by brute force: the projection lies on the face {J_S x = 0} of some set S of
    constraints, so project g onto the null space of J_S for every S and keep the closest feasible point."""
    best, best_distance = None, math.inf
    for size in range(len(j) + 1):
        for subset in itertools.combinations(range(len(j)), size):
            rows = j[list(subset)]
            x = g - np.linalg.pinv(rows) @ (rows @ g) if size else g.copy()
            if np.all(j @ x >= -1e-12) and np.linalg.norm(x - g) < best_distance - 1e-15:
                best, best_distance = x, float(np.linalg.norm(x - g))
    assert best is not None
    return best


def upgrad_by_brute_force(j: np.ndarray) -> np.ndarray:
    return np.mean([projection_onto_dual_cone_by_active_sets(j, g) for g in j], axis=0)


def one_nonzero_task() -> np.ndarray:
    j = np.zeros((3, 4))
    j[1] = [1.0, -2.0, 0.5, 3.0]
    return j


def a_zero_task_among_conflicting_ones() -> np.ndarray:
    rng = np.random.default_rng(11)
    j = rng.standard_normal((4, 5))
    j[2] = 0.0
    j[3] = -0.8 * j[0] + 0.4 * j[1]
    return j


@pytest.mark.parametrize("j", [
    np.array([[1.0, -2.0, 0.5]]),          # one task: the update is its gradient
    one_nonzero_task(),                    # d = g_1 / 3: the zero tasks project to 0
    a_zero_task_among_conflicting_ones(),
], ids=["single-task", "one-nonzero-of-three", "zero-task-and-conflict"])
def test_upgrad_is_the_mean_projection_onto_the_dual_cone_found_by_enumerating_active_sets(j: np.ndarray) -> None:
    method = methods.build("upgrad", len(j))
    d = method.combine(torch.from_numpy(j), torch.ones(len(j), dtype=torch.float64)).numpy()
    np.testing.assert_allclose(d, upgrad_by_brute_force(j), rtol=1e-9, atol=1e-12)
    zero = np.linalg.norm(j, axis=1) == 0
    assert np.all(method.last_weights.numpy()[zero] == 0)    # tasks with a zero gradient get weight 0


def test_upgrad_with_only_one_nonzero_gradient_weights_it_one_over_k() -> None:
    gram = torch.from_numpy(np.diag([0.0, 4.0, 0.0]))
    weights = methods.build("upgrad", 3).weights_from_gramian(gram, torch.ones(3, dtype=torch.float64))
    np.testing.assert_array_equal(weights.numpy(), [0.0, 1 / 3, 0.0])


def test_upgrad_refuses_weights_beyond_the_float64_range_with_one_message() -> None:
    """Norms 1e150 and 1e-160 with cosine -1/2: projecting g0 adds z·g1 with z = ½·|g0|/|g1| (Proposition 1 on the
    unit rows), so task 1's weight is (1/K)·½·1e150/1e-160 = 2.5e309, past the largest float64."""
    n0, n1 = 1e150, 1e-160
    gram = torch.tensor([[n0 * n0, -0.5 * n0 * n1], [-0.5 * n0 * n1, n1 * n1]], dtype=torch.float64)
    assert 0.5 * 0.5 * (n0 / n1) > sys.float_info.max
    with warnings.catch_warnings(), pytest.raises(SolverError) as error:
        warnings.simplefilter("ignore", RuntimeWarning)       # numpy's own overflow warning
        methods.build("upgrad", 2).weights_from_gramian(gram, torch.ones(2, dtype=torch.float64))
    assert str(error.value) == "upgrad: the dual-cone solve returned non-finite weights"


# -- _cvx.solve_checked --------------------------------------------------------------------------------


def projection_problem():
    """min ‖x - (1, 2)‖² s.t. x ≥ 0, x1 + x2 ≤ 1: the solution (0, 1) by hand (cvxpy's default here is OSQP)."""
    import cvxpy as cp

    x = cp.Variable(2)
    return cp.Problem(cp.Minimize(cp.sum_squares(x - np.array([1.0, 2.0]))), [x >= 0, cp.sum(x) <= 1]), x


@pytest.mark.parametrize("solver", ["SCS", "CLARABEL"])
def test_solve_checked_runs_the_solver_it_is_given(solver: str) -> None:
    problem, x = projection_problem()
    solve_checked(problem, solver, "nashmtl")
    assert problem.solver_stats.solver_name == solver
    np.testing.assert_allclose(x.value, [0.0, 1.0], atol=1e-4)


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate:UserWarning")
def test_solve_checked_hands_its_options_to_the_solver() -> None:
    """Clarabel stopped after one iteration (``max_iter=1``) cannot reach optimality: reported, not ignored."""
    problem, _ = projection_problem()
    with pytest.raises(SolverError) as error:
        solve_checked(problem, "CLARABEL", "nashmtl", max_iter=1)
    assert str(error.value) == ("nashmtl: the CLARABEL solve ended with status 'user_limit' instead of 'optimal'; "
                                "the task gradients may be degenerate (zero, NaN or linearly dependent)")


def test_a_non_optimal_status_is_reported_with_one_exact_message() -> None:
    import cvxpy as cp

    x = cp.Variable()
    infeasible = cp.Problem(cp.Minimize(x), [x >= 1, x <= 0])
    with pytest.raises(SolverError) as error:
        solve_checked(infeasible, "CLARABEL", "nashmtl")
    assert str(error.value) == ("nashmtl: the CLARABEL solve ended with status 'infeasible' instead of 'optimal'; "
                                "the task gradients may be degenerate (zero, NaN or linearly dependent)")
    assert error.value.exit_code == 5


def test_solve_checked_without_cvxpy_names_the_method(monkeypatch: pytest.MonkeyPatch) -> None:
    problem, _ = projection_problem()
    monkeypatch.setitem(sys.modules, "cvxpy", None)          # `import cvxpy` now raises ImportError
    with pytest.raises(SolverError) as error:
        solve_checked(problem, "CLARABEL", "nashmtl")
    assert str(error.value) == "nashmtl needs cvxpy: pip install cvxpy (it brings the Clarabel solver)"


# -- CAGrad, MGDA's Frank-Wolfe and the stationarity margin --------------------------------------------


def test_cagrad_with_a_zero_mean_gradient_of_three_tasks_is_the_mean_weighting_with_no_gap() -> None:
    """g_1 + g_2 + g_3 = (1, 2) + (3, -1) + (-4, -1) = 0: g_0 = 0, so d = g_0 (weights 1/3) without a solve,
    whose gap is exactly 0 (a dual solve would certify only a rounding-sized gap)."""
    g = np.array([[1.0, 2.0], [3.0, -1.0], [-4.0, -1.0]])
    assert not g.sum(axis=0).any()
    weights, gap = cagrad_weights(g @ g.T, 0.4, 1e-6)
    assert weights.tolist() == [1.0 / 3.0] * 3
    assert gap == 0.0


@pytest.mark.parametrize("tol", [0.5, 0.01])
def test_mgda_frank_wolfe_stops_at_the_first_step_that_moves_the_weights_less_than_tol(tol: float) -> None:
    """The iterates w_n come from runs with tol = 0 (never stops early) and max_iter = n; the run with ``tol``
    returns w_N for the first N with ‖w_N − w_(N−1)‖₁ < tol."""
    grads = jacobian(3, 4, 6)
    gramian = grads @ grads.T
    iterates = [min_norm_weights_frank_wolfe(gramian, n, 0.0).numpy() for n in range(40)]
    expected = next(n for n in range(1, 40) if np.abs(iterates[n] - iterates[n - 1]).sum() < tol)
    assert 1 < expected < 30
    method = methods.build("mgda", 4, solver="frank-wolfe", tol=tol)
    method.combine(grads, torch.ones(4, dtype=torch.float64))
    np.testing.assert_allclose(method.last_weights.numpy(), iterates[expected], rtol=0, atol=1e-15)


def test_mgda_frank_wolfe_of_two_identical_gradients_stays_on_the_simplex() -> None:
    """g_1 = g_2: every γ in [0, 1] is a min-norm pair weight (zero denominator); the solver takes γ = 1/2 and
    the weights stay a convex combination whose direction is g itself."""
    assert two_task_min_norm(6.0, 6.0, 6.0) == 0.5
    grads = torch.tensor([[1.0, 2.0, -1.0], [1.0, 2.0, -1.0]], dtype=torch.float64)
    method = methods.build("mgda", 2, solver="frank-wolfe")
    d = method.combine(grads, torch.ones(2, dtype=torch.float64))
    w = method.last_weights.numpy()
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(d.numpy(), [1.0, 2.0, -1.0], rtol=1e-12)


def test_stationarity_margin_with_a_diagonal_rounding_below_zero_is_zero_without_warnings() -> None:
    """A zero gradient whose Gramian diagonal rounds to -1e-20 (within the PSD tolerance) has norm 0, not NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stationarity_margin(np.array([[1.0, 0.0], [0.0, -1e-20]])) == 0.0
