"""MOML and FORUM (Ye, PhD thesis ch. 3): hypergradients against finite differences, FORUM's QP (Eq. 3.29)
against its KKT conditions and CVXPY, the method-owned samplers, and bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mtlflow import jobs, methods
from mtlflow.core.errors import InvalidParameterError
from mtlflow.methods._moblo import SplitSampler
from mtlflow.methods.forum import forum_nu, forum_qp
from mtlflow.methods.moml import unrolled_hypergradients

TARGETS = torch.tensor([[1.0, -2.0], [-1.5, 0.5]], dtype=torch.float64)    # LL quadratics, one per task
VAL_TARGETS = torch.tensor([[2.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
OMEGA0 = torch.tensor([0.3, 0.7], dtype=torch.float64)
CURVATURE = torch.tensor([1.0, 3.0], dtype=torch.float64)


def lower(alpha: torch.Tensor, params: dict, t: int, softmax: bool) -> torch.Tensor:
    """f(ω, α) = Σ_i α_i ½‖ω − c_i‖²_A with a diagonal curvature A (2 parameters, 2 tasks)."""
    w = torch.softmax(alpha, dim=0) if softmax else alpha
    omega = params["w"]
    return sum(w[i] * 0.5 * (CURVATURE * (omega - TARGETS[i]) ** 2).sum() for i in range(2))


def upper(params: dict) -> torch.Tensor:
    omega = params["w"]
    return torch.stack([((omega - VAL_TARGETS[i]) ** 2).sum() for i in range(2)])


def unrolled_value(alpha: torch.Tensor, steps: int, lr: float, softmax: bool) -> torch.Tensor:
    """F(ω_T(α)) by plain (non-differentiated) unrolling, for finite differences."""
    w = torch.softmax(alpha, dim=0) if softmax else alpha
    omega = OMEGA0.clone()
    for _ in range(steps):
        grad = sum(w[i] * CURVATURE * (omega - TARGETS[i]) for i in range(2))
        omega = omega - lr * grad
    return upper({"w": omega})


@pytest.mark.parametrize("softmax", [False, True])
def test_moml_hypergradient_matches_finite_differences(softmax: bool) -> None:
    alpha = torch.tensor([0.35, 0.65], dtype=torch.float64) if not softmax else torch.tensor([0.2, -0.4],
                                                                                              dtype=torch.float64)
    steps, lr = 4, 0.2
    hyper, values = unrolled_hypergradients(alpha, {"w": OMEGA0.clone().requires_grad_(True)},
                                            lambda a, p, t: lower(a, p, t, softmax), upper, steps, lr)
    assert hyper.shape == (2, 2)
    torch.testing.assert_close(values, unrolled_value(alpha, steps, lr, softmax))
    eps = 1e-6
    numeric = torch.zeros(2, 2, dtype=torch.float64)
    for j in range(2):
        step = torch.zeros(2, dtype=torch.float64)
        step[j] = eps
        numeric[:, j] = (unrolled_value(alpha + step, steps, lr, softmax)
                         - unrolled_value(alpha - step, steps, lr, softmax)) / (2 * eps)
    torch.testing.assert_close(hyper, numeric, rtol=1e-6, atol=1e-8)
    assert hyper.abs().max() > 1e-2  # the hypergradient is not trivially zero


def random_gram(seed: int, k: int, dim: int = 6, aligned: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vectors = torch.randn(k + 1, dim, generator=gen, dtype=torch.float64)
    if aligned:  # ∇q̃ short and aligned with the UL gradients: ν hits its lower bound 0
        vectors[k] = vectors[:k].sum(0) * 0.5
    return vectors @ vectors.T, vectors


@pytest.mark.parametrize("seed,k,rho,aligned", [(0, 2, 0.1, False), (1, 3, 0.5, False), (2, 4, 0.3, False),
                                                (3, 2, 0.1, True), (4, 3, 1.0, False)])
def test_forum_qp_satisfies_kkt_and_matches_cvxpy(seed: int, k: int, rho: float, aligned: bool) -> None:
    gram, vectors = random_gram(seed, k, aligned=aligned)
    sol = forum_qp(gram, rho)
    lam, gamma, mult = sol.lam.numpy(), sol.gamma, sol.multipliers.numpy()
    m = gram.numpy()
    x = np.concatenate([lam, [gamma]])
    q_norm2 = m[k, k]
    assert sol.phi == pytest.approx(0.5 * rho * q_norm2)
    np.testing.assert_allclose(sol.pi.numpy(), rho - m[:k, k] / q_norm2)
    # constraints: Σλ = 1 (multiplier free), λ_i ≥ 0, γ ≥ 0, γ − πᵀλ ≥ 0
    a_eq = np.concatenate([np.ones(k), [0.0]])
    a_ineq = np.vstack([np.eye(k + 1), np.concatenate([-sol.pi.numpy(), [1.0]])])
    slack = a_ineq @ x
    scale = max(1.0, np.abs(m).max())
    assert abs(a_eq @ x - 1.0) < 1e-9 and np.all(slack >= -1e-9)                  # primal feasibility
    assert np.all(mult[1:] >= -1e-7 * scale)                                        # dual feasibility
    assert np.all(np.abs(mult[1:] * slack) <= 1e-7 * scale)                         # complementary slackness
    gradient = m @ x - np.concatenate([np.zeros(k), [sol.phi]])
    stationarity = gradient - mult[0] * a_eq - a_ineq.T @ mult[1:]
    assert np.abs(stationarity).max() <= 1e-6 * scale                              # stationarity
    # the constraint γ ≥ πᵀλ is binding: the QP's γ is ν(λ) of Eq. 3.27 in the proof's form
    assert gamma == pytest.approx(forum_nu(gram, sol.lam, rho), abs=1e-7)
    assert (gamma == 0.0) == aligned
    # the direction satisfies the barrier of Eq. 3.20, ⟨∇q̃, d⟩ ≤ −ϕ_k
    d = -(torch.from_numpy(lam) @ vectors[:k] + gamma * vectors[k])
    assert float(vectors[k] @ d) <= -sol.phi + 1e-9
    # the same optimum as CVXPY (the thesis' solver)
    cp = pytest.importorskip("cvxpy")
    r = cp.Variable(k + 1)
    sqrt_gram = np.linalg.cholesky(m + 1e-12 * np.eye(k + 1)).T
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(sqrt_gram @ r) - sol.phi * r[k]),
                         [cp.sum(r[:k]) == 1, r >= 0, r[k] >= sol.pi.numpy() @ r[:k]])
    problem.solve(solver=cp.CLARABEL)
    ours = 0.5 * x @ m @ x - sol.phi * gamma
    assert ours <= problem.value + 1e-6 * scale


def test_forum_nu_uses_the_proofs_rho_and_qp_falls_back_when_q_is_stationary() -> None:
    gram, _ = random_gram(7, 2)
    lam = torch.tensor([0.25, 0.75], dtype=torch.float64)
    inner = float(lam @ gram[:2, 2])
    assert forum_nu(gram, lam, 0.4) == pytest.approx(max(0.4 - inner / float(gram[2, 2]), 0.0))
    flat = gram.clone()
    flat[2, :] = 0.0
    flat[:, 2] = 0.0
    sol = forum_qp(flat, 0.1)
    assert sol.gamma == 0.0
    torch.testing.assert_close(sol.lam, methods.get("mgda")(2).weights_from_gramian(flat[:2, :2], torch.ones(2)))


def test_split_sampler_cycles_permutations_and_resumes_exactly() -> None:
    a = SplitSampler("forum/upper")
    a.reseed(3)
    first = [a.next_indices(10, 4).tolist() for _ in range(2)]
    saved = a.state_dict()
    rest = [a.next_indices(10, 4).tolist() for _ in range(3)]
    b = SplitSampler("forum/upper")
    b.load_state_dict(saved)
    assert [b.next_indices(10, 4).tolist() for _ in range(3)] == rest
    assert sorted(first[0] + first[1]) == sorted(set(first[0] + first[1]))         # no repeats within a permutation
    assert a.next_indices(1, 32).tolist() == [0]                                     # a 1-sample split (toy)


def test_moblo_hyperparameters_and_upper_level_are_checked(multimnist_small: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="upper_solver"):
        methods.build("moml", 2, upper_solver="ls")
    with pytest.raises(InvalidParameterError, match="inner_steps"):
        methods.build("forum", 2, inner_steps=0)
    with pytest.raises(InvalidParameterError, match="sample-weights needs a benchmark"):
        jobs.train(multimnist_small, tmp_path / "run", method="forum", hparams={"upper": "sample-weights"},
                   epochs=1, batch_size=32, max_steps_per_epoch=1, progress=False)


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_task_weights_stay_on_the_simplex_and_move(name: str, multimnist_small: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run = tmp_path / name
    jobs.train(multimnist_small, run, method=name, hparams={"outer_lr": 0.05, "inner_batches": "fresh"},
               epochs=1, batch_size=32, max_steps_per_epoch=3, progress=False)
    state = torch.load(run / "checkpoint.pt", weights_only=False)["method"]["bilevel"]
    alpha = state["variable"]
    assert alpha.dtype == torch.float64 and bool((alpha >= 0).all())
    assert float(alpha.sum()) == pytest.approx(1.0)
    assert not torch.allclose(alpha, torch.full_like(alpha, 0.5))      # the upper level moved
    assert state["upper_sampler"]["position"] > 0 and state["inner_sampler"]["position"] > 0


@pytest.mark.parametrize("optimizer,expected", [("sgd", [0.4, 0.6]), ("adam", [0.4, 0.6])])
def test_upper_step_moves_the_task_weights_against_the_hypergradient(optimizer: str, expected: list) -> None:
    """BilevelState.step_upper is a descent step: from α = (½, ½), the gradient (1, −1) and step 0.1 give
    α = Π_Δ(α − 0.1·(1, −1)) = (0.4, 0.6) with SGD, and the same first step with Adam (lr·g/|g|)."""
    from mtlflow.methods._moblo import BilevelState, TaskWeights, build_outer_optimizer

    state = BilevelState("moml")
    state.upper = TaskWeights(2, "projection", torch.device("cpu"))
    state.optimizer = build_outer_optimizer({"outer_optimizer": optimizer, "outer_lr": 0.1}, state.upper.variable)
    state.step_upper(torch.tensor([1.0, -1.0], dtype=torch.float64))
    np.testing.assert_allclose(state.upper.variable.detach().numpy(), expected, atol=1e-7)


def test_forum_lower_level_step_follows_the_thesis_per_benchmark() -> None:
    """Thesis §3.5: LL step η = 0.01 on QM9, 0.1 on Office-31 / NYUv2 (the method's default)."""
    from mtlflow import benchmarks

    qm9 = {**methods.build("forum", 11).hp, **benchmarks.build("qm9").method_defaults("forum")}
    assert qm9["inner_lr"] == 0.01 and qm9["inner_steps"] == 5 and qm9["rho"] == 0.1
    for name in ("nyuv2", "office31"):
        hp = {**methods.build("forum", 3).hp, **benchmarks.build(name).method_defaults("forum")}
        assert hp["inner_lr"] == 0.1, name
