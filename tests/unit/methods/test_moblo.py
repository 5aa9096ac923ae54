"""MOML and FORUM (Ye, PhD thesis ch. 3): hypergradients against finite differences, FORUM's QP (Eq. 3.29)
against its KKT conditions and CVXPY, the method-owned samplers, the shared hyper-parameters, the task- and
sample-weights objectives, FORUM's normalised upper-level gradients, momentum and ∇_α q̃, the step the
callbacks see, and bad input."""

from __future__ import annotations

import copy
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from mtlflow import benchmarks, jobs, methods
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError, NonFiniteValueError, SolverError
from mtlflow.engine.trainer import Trainer
from mtlflow.methods import forum as forum_module
from mtlflow.methods._moblo import (
    BilevelState,
    FunctionalModel,
    SampleWeights,
    SplitSampler,
    TaskWeights,
    build_outer_optimizer,
    build_upper_level,
    common_hparams,
)
from mtlflow.methods.forum import FORUM, forum_nu, forum_qp
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


def test_moml_hypergradient_leaves_a_parameter_the_lower_level_never_uses_alone() -> None:
    """A model parameter outside the LL objective (a frozen or unused module) gets no inner step and changes
    nothing: the hypergradient is the one without it, against the same finite differences."""
    alpha, steps, lr = torch.tensor([0.35, 0.65], dtype=torch.float64), 3, 0.2
    unused = torch.tensor([5.0, -1.0], dtype=torch.float64, requires_grad=True)
    hyper, values = unrolled_hypergradients(alpha, {"w": OMEGA0.clone().requires_grad_(True), "unused": unused},
                                            lambda a, p, t: lower(a, p, t, False), upper, steps, lr)
    eps = 1e-6
    numeric = torch.stack([(unrolled_value(alpha + eps * e, steps, lr, False)
                            - unrolled_value(alpha - eps * e, steps, lr, False)) / (2 * eps)
                           for e in torch.eye(2, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(hyper, numeric, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(values, unrolled_value(alpha, steps, lr, False))


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


def test_forum_qp_lambda_is_the_solvers_lambda_renormalised_onto_the_simplex(monkeypatch: pytest.MonkeyPatch) -> None:
    """quadprog meets Σλ = 1 only to ~1e-7 on this 5-task Gram matrix; forum_qp returns its clipped λ divided by
    its sum, so λ is on the simplex to rounding."""
    import quadprog

    raw: list[np.ndarray] = []
    solve = quadprog.solve_qp

    def spy(*args, **kwargs):
        solution = solve(*args, **kwargs)
        raw.append(solution[0].copy())
        return solution

    monkeypatch.setattr(quadprog, "solve_qp", spy)
    gram, _ = random_gram(141, 5, aligned=True)
    lam = forum_qp(gram, 0.1).lam.numpy()
    solver_lam = np.clip(raw[0][:5], 0.0, None)
    assert abs(solver_lam.sum() - 1.0) > 1e-8                          # the case needs the renormalisation
    np.testing.assert_allclose(lam, solver_lam / solver_lam.sum(), rtol=1e-15, atol=0.0)
    assert abs(lam.sum() - 1.0) <= 1e-15


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


def test_split_sampler_hands_out_each_permutation_whole_before_drawing_the_next() -> None:
    """size / batch_size batches of one permutation cover the split exactly once, the last batch ending at
    the permutation's end."""
    sampler = SplitSampler("forum/upper")
    sampler.reseed(3)
    for size in (8, 12, 8):
        batches = [sampler.next_indices(size, 4).tolist() for _ in range(size // 4)]
        assert sorted(sum(batches, [])) == list(range(size)), batches


def test_moblo_hyperparameters_and_upper_level_are_checked() -> None:
    # the upper_solver and sample-weights refusals are matched word for word further below
    with pytest.raises(InvalidParameterError, match="inner_steps"):
        methods.build("forum", 2, inner_steps=0)


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
    state = BilevelState("moml")
    state.upper = TaskWeights(2, "projection", torch.device("cpu"))
    state.optimizer = build_outer_optimizer({"outer_optimizer": optimizer, "outer_lr": 0.1}, state.upper.variable)
    state.step_upper(torch.tensor([1.0, -1.0], dtype=torch.float64))
    np.testing.assert_allclose(state.upper.variable.detach().numpy(), expected, atol=1e-7)


def test_task_weights_are_the_variable_under_projection_and_its_softmax_under_softmax() -> None:
    """α of the LL objective f = Σ α_i L_i: the variable itself with ``simplex=projection``, softmax(logits)
    with ``simplex=softmax`` (logits (0, ln 3) give α = (¼, ¾)); ``weights_summary`` reports that α."""
    losses = torch.tensor([2.0, 4.0], dtype=torch.float64)
    model = SimpleNamespace(task_losses=lambda preds, targets: losses)
    for simplex, variable, alpha in [("projection", [0.3, 0.7], [0.3, 0.7]),
                                     ("softmax", [0.0, math.log(3.0)], [0.25, 0.75])]:
        upper_level = TaskWeights(2, simplex, torch.device("cpu"))
        with torch.no_grad():
            upper_level.variable.copy_(torch.tensor(variable, dtype=torch.float64))
        objective = upper_level.lower_objective(upper_level.variable, model, None, None)
        assert float(objective) == pytest.approx(2.0 * alpha[0] + 4.0 * alpha[1], rel=1e-12), simplex
        np.testing.assert_allclose(upper_level.weights_summary().numpy(), alpha, rtol=1e-12)


def test_forum_lower_level_step_follows_the_thesis_per_benchmark() -> None:
    """Thesis §3.5: LL step η = 0.01 on QM9, 0.1 on Office-31 / NYUv2 (the method's default)."""
    qm9 = {**methods.build("forum", 11).hp, **benchmarks.build("qm9").method_defaults("forum")}
    assert qm9["inner_lr"] == 0.01 and qm9["inner_steps"] == 5 and qm9["rho"] == 0.1
    for name in ("nyuv2", "office31"):
        hp = {**methods.build("forum", 3).hp, **benchmarks.build(name).method_defaults("forum")}
        assert hp["inner_lr"] == 0.1, name


def test_the_shared_bilevel_hyperparameters_have_the_thesis_defaults_and_constraints() -> None:
    """``common_hparams`` called at test time (MOML's and FORUM's tables are built at import): the keys the
    bilevel machinery reads, the thesis' defaults with the method's own T and η, and each constraint."""
    spec = common_hparams(inner_steps=3, inner_lr=0.2)
    defaults = {key: h.default for key, h in spec.items()}
    assert defaults == {"upper": "task-weights", "simplex": "projection", "inner_steps": 3, "inner_lr": 0.2,
                        "inner_batches": "step", "outer_optimizer": "adam", "outer_lr": 1e-3, "upper_split": "val"}
    assert {key: h.requirement for key, h in spec.items()} == {
        "upper": "'task-weights' or 'sample-weights'", "simplex": "'projection' or 'softmax'",
        "inner_steps": "an integer >= 1", "inner_lr": "> 0", "inner_batches": "'step' or 'fresh'",
        "outer_optimizer": "'adam' or 'sgd'", "outer_lr": "> 0", "upper_split": "'val' or 'train'"}
    assert spec["inner_steps"].accepts(1) and not spec["inner_steps"].accepts(0)
    assert spec["inner_lr"].accepts(1e-9) and not spec["inner_lr"].accepts(0.0)
    with pytest.raises(InvalidParameterError) as error:
        spec["inner_steps"].coerce("moml", "inner_steps", 2.0)
    assert str(error.value) == "moml: hyper-parameter inner_steps=2.0 must be of type int"
    # the defaults drive the machinery: α = 1/K on the simplex, Adam at 1e-3 on it, the step's batch inside
    upper_level = build_upper_level(defaults, SimpleNamespace(tasks=[0, 1, 2], device=torch.device("cpu")))
    assert isinstance(upper_level, TaskWeights) and upper_level.simplex == "projection"
    torch.testing.assert_close(upper_level.variable, torch.full((3,), 1 / 3, dtype=torch.float64))
    optimizer = build_outer_optimizer(defaults, upper_level.variable)
    assert type(optimizer) is torch.optim.Adam and optimizer.param_groups[0]["lr"] == 1e-3
    assert BilevelState("moml").inner_batch_source(defaults, None, "the step's batch")(0) == "the step's batch"


def test_an_empty_upper_level_split_is_refused_in_one_line() -> None:
    trainer = SimpleNamespace(data=SimpleNamespace(splits={"train": [], "val": [1, 2]}))
    with pytest.raises(InvalidParameterError) as error:
        BilevelState("forum").setup({"upper_split": "train"}, trainer)
    assert str(error.value) == "forum needs a non-empty 'train' split for its upper level"


def test_a_split_sampler_batch_is_the_drawn_samples_in_draw_order_whatever_the_loaders_default() -> None:
    """The method owns the order of its batches (drawn from its seeded generator, checkpointed): it asks the
    benchmark's loader not to shuffle, so even a ``make_loader`` override that shuffles by default (a
    plugin's) gives the drawn samples in the drawn order."""
    class ShufflingBench:
        def make_loader(self, dataset, batch_size, shuffle=True):
            return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)

    dataset = TensorDataset(torch.arange(10) * 10)
    sampler, twin = SplitSampler("moml/upper"), SplitSampler("moml/upper")
    sampler.reseed(5)
    twin.reseed(5)
    torch.manual_seed(0)  # the global generator a shuffling loader would draw from
    for _ in range(3):
        (batch,) = sampler.batch(ShufflingBench(), dataset, 4)
        assert batch.tolist() == [10 * i for i in twin.next_indices(10, 4).tolist()]


def test_sample_weights_lower_objective_is_the_sigmoid_weighted_mean_per_task_summed() -> None:
    """Section 3.7.1: f(ω, α) = Σ_i (1/|B_i|) Σ_j σ(α_{i, id_ij}) ℓ_ij, with the cross-entropies of the
    hyper-cleaning benchmark, against a hand computation."""
    bench = benchmarks.build("hypercleaning")
    trainer = SimpleNamespace(bench=bench, task_index=[0, 1], data=SimpleNamespace(splits={"train": range(5)}),
                              device=torch.device("cpu"))
    upper_level = SampleWeights(trainer)
    variable = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5], [-0.5, 0.3, 0.0, 1.0, -2.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    preds = [torch.randn(n, 10, generator=gen, dtype=torch.float64) for n in (3, 2)]
    labels = [torch.tensor([1, 7, 3]), torch.tensor([0, 9])]
    ids = [torch.tensor([4, 0, 2]), torch.tensor([3, 1])]
    value = upper_level.lower_objective(variable, None, preds, [*labels, *ids])

    def cross_entropy(row: list[float], label: int) -> float:
        return math.log(sum(math.exp(v) for v in row)) - row[label]

    expected = sum(sum(1 / (1 + math.exp(-float(variable[i, j]))) * cross_entropy(preds[i][n].tolist(), int(y))
                       for n, (y, j) in enumerate(zip(labels[i], ids[i], strict=True))) / len(labels[i])
                   for i in range(2))
    assert float(value) == pytest.approx(expected, rel=1e-12)


def test_sample_weights_start_at_one_half_for_every_training_sample_and_summarise_per_task() -> None:
    """Section 3.7.1's α: one float64 logit per (task, training sample), 0 at the start (σ = 1/2); the logged
    summary is each task's mean σ(α_ij) over its samples."""
    trainer = SimpleNamespace(bench=benchmarks.build("hypercleaning"), task_index=[0, 1],
                              data=SimpleNamespace(splits={"train": range(5)}), device=torch.device("cpu"))
    upper_level = SampleWeights(trainer)
    assert upper_level.variable.dtype == torch.float64 and upper_level.variable.shape == (2, 5)
    assert torch.equal(upper_level.weights_summary(), torch.full((2,), 0.5, dtype=torch.float64))
    with torch.no_grad():
        upper_level.variable.copy_(torch.tensor([[0.0, 0.0, 0.0, 0.0, math.log(3.0)],
                                                 [-math.log(3.0), 0.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(upper_level.weights_summary(),  # σ(log 3) = 3/4, σ(-log 3) = 1/4
                               torch.tensor([(4 * 0.5 + 0.75) / 5, (0.25 + 4 * 0.5) / 5], dtype=torch.float64))


def _trainer(bench, data, tmp_path: Path, method: str, hparams: dict, callbacks: tuple = ()) -> Trainer:
    """A trainer of ``method`` on the tiny MultiMNIST data, plain SGD, batches of 8."""
    config = RunConfig(method=method, epochs=1, batch_size=8, optimizer="sgd", lr=0.1,
                       hparams={**jobs.resolved_hparams(bench, method, {}), **hparams})
    return Trainer(bench, data, config, tmp_path / method, callbacks=list(callbacks), progress=False)


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_the_callbacks_of_a_bilevel_step_see_the_trainers_step_and_epoch(name: str, multimnist_small: Path,
                                                                          tmp_path: Path) -> None:
    """MOML and FORUM own their step; the state they hand the step rules carries the trainer's step number
    (0, then 1), the epoch it was called with and the step's batch."""

    class StepLog(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, int]] = []
            self.batches: list = []

        def before_optimizer_step(self, trainer, state) -> None:
            self.seen.append((state.epoch, state.step))
            self.batches.append(state.batch)
            self.losses.append(state.losses)

    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    log = StepLog()
    log.losses = []
    trainer = _trainer(bench, data, tmp_path, name, {"inner_steps": 1}, (log,))
    batch = next(iter(trainer._loader(1)))
    with torch.no_grad():
        first_losses = trainer.forward_pass(batch).stacked   # the upper step moves α, not the model
    trainer.train_step(batch, 3)
    trainer.train_step(batch, 3)
    assert log.seen == [(3, 0), (3, 1)]
    assert len(log.batches) == 2 and all(seen is batch for seen in log.batches)
    torch.testing.assert_close(log.losses[0], first_losses)   # and the step's training losses


def _spy_on_forum_gram(monkeypatch: pytest.MonkeyPatch, argument: str) -> list[torch.Tensor]:
    """A copy of one argument of every call of FORUM's ``_gram`` (what the QP is built from), in call order."""
    seen: list[torch.Tensor] = []
    gram = FORUM._gram

    def spy(upper_grads, f_omega, q_alpha):
        seen.append({"upper_grads": upper_grads, "q_alpha": q_alpha}[argument].detach().clone())
        return gram(upper_grads, f_omega, q_alpha)

    monkeypatch.setattr(FORUM, "_gram", staticmethod(spy))
    return seen


def _upper_grads_raw_and_normalized(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    loss_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation gradients FORUM's QP gets on its first step, with ``normalize_upper_grads`` off and on
    (twin runs), every task loss multiplied by ``loss_scale``."""
    seen = _spy_on_forum_gram(monkeypatch, "upper_grads")
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(data_dir)
    for normalize in (False, True):
        trainer = _trainer(bench, data, tmp_path / str(normalize), "forum",
                           {"inner_steps": 1, "normalize_upper_grads": normalize})
        if loss_scale != 1.0:
            model = trainer.method.state.model
            losses = model.task_losses
            monkeypatch.setattr(model, "task_losses",
                                lambda preds, targets, losses=losses: loss_scale * losses(preds, targets))
        trainer.train_step(next(iter(trainer._loader(1))), 1)
    raw, normalized = seen
    return raw, normalized


def test_forum_normalize_upper_grads_gives_the_qp_unit_validation_gradients(multimnist_small: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``normalize_upper_grads`` (the authors' code) each ∇_ω F_i reaches the QP as ∇_ω F_i / ‖∇_ω F_i‖:
    the first step's rows against the raw ones of a twin run with the option off."""
    raw, normalized = _upper_grads_raw_and_normalized(multimnist_small, tmp_path, monkeypatch, loss_scale=1.0)
    assert raw.shape[0] == 2 and raw.shape[1] > 2
    torch.testing.assert_close(normalized, raw / raw.norm(dim=1, keepdim=True), rtol=1e-5, atol=1e-7)


def test_forum_momentum_starts_at_the_first_qp_solution_and_follows_eq_3_30(multimnist_small: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Eq. 3.30: λ̃^k = (1 − β_k) λ̃^{k−1} + β_k λ^k with β_k = (k + 1)^{-3/4} from k = 0, so β_0 = 1 (λ̃^0 = λ^0,
    the 1/K start drops out) and λ̃^1 = (1 − 2^{-3/4}) λ^0 + 2^{-3/4} λ^1, against the QP's own λ^k."""
    solutions: list[torch.Tensor] = []

    def spy(gram, rho):
        solution = forum_qp(gram, rho)
        solutions.append(solution.lam.clone())
        return solution

    monkeypatch.setattr(forum_module, "forum_qp", spy)
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, "forum", {"inner_steps": 1})
    batch = next(iter(trainer._loader(1)))
    trainer.train_step(batch, 1)
    torch.testing.assert_close(trainer.method.lam_tilde, solutions[0], rtol=0.0, atol=1e-15)
    trainer.train_step(batch, 1)
    beta = 2.0 ** -0.75
    torch.testing.assert_close(trainer.method.lam_tilde, (1 - beta) * solutions[0] + beta * solutions[1],
                               rtol=0.0, atol=1e-15)
    assert trainer.method.iteration == 2


def test_forum_constraint_gradient_in_alpha_is_the_loss_drop_of_the_inner_steps(
        multimnist_small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Algorithm 2, step 9, for task weights: ∇_α q̃ = ∇_α f(α, ω_k) − ∇_α f(α, ω̃^T) = L(ω_k) − L(ω̃^T), the
    training losses before and after the T inner SGD steps; here T = 1 from α = (½, ½), written out on a copy
    of the model."""
    seen = _spy_on_forum_gram(monkeypatch, "q_alpha")
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    inner_lr = 0.5
    trainer = _trainer(bench, data, tmp_path, "forum", {"inner_steps": 1, "inner_lr": inner_lr})
    batch = next(iter(trainer._loader(1)))
    twin = copy.deepcopy(trainer.model).train()
    inputs, targets = bench.unpack(batch)

    def losses() -> torch.Tensor:
        preds = twin(inputs)
        return torch.stack([task.loss(pred, targets[idx])
                            for task, pred, idx in zip(trainer.tasks, preds, trainer.task_index, strict=True)])

    before = losses()
    params = [p for p in twin.parameters() if p.requires_grad]
    grads = torch.autograd.grad((0.5 * before).sum(), params)
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(inner_lr * g)
        after = losses()
    trainer.train_step(batch, 1)
    expected = (before.detach() - after).to(torch.float64)
    assert float(expected.abs().min()) > 1e-3                         # the inner step changed both losses
    torch.testing.assert_close(seen[0], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_a_bilevel_step_reports_the_seconds_its_upper_solver_took(name: str, multimnist_small: Path,
                                                                  tmp_path: Path) -> None:
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, name, {"inner_steps": 1})
    batch = next(iter(trainer._loader(1)))
    started = time.perf_counter()
    info = trainer.train_step(batch, 1)
    assert 0.0 <= info["solver_seconds"] <= time.perf_counter() - started
    assert torch.equal(info["weights"], trainer.method.last_weights)   # the task weights it logs


def test_moml_refuses_diverged_validation_losses_in_one_line(multimnist_small: Path, tmp_path: Path) -> None:
    """An inner step far too large makes the unrolled model's validation losses non-finite: one line naming the
    method, the losses, the step and the step sizes to lower."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, "moml", {"inner_steps": 2, "inner_lr": 1e30})
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step(next(iter(trainer._loader(1))), 1)
    assert re.fullmatch(r"moml: non-finite validation losses \(\[[^\n]*\]\) at step 0; lower --lr or the "
                        r"method's inner_lr/outer_lr", str(error.value)), str(error.value)


def test_moml_with_its_task_weights_still_uniform_steps_the_model_as_linear_scalarisation(multimnist_small: Path,
                                                                                        tmp_path: Path) -> None:
    """α = 1/K times the trainer's ×K convention is LS's objective: with an upper step too small to move α, one
    MOML step moves the model exactly as one LS step from the same start."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    moml = _trainer(bench, data, tmp_path, "moml", {"inner_steps": 1, "outer_lr": 1e-12})
    ls = _trainer(bench, data, tmp_path / "ls", "ls", {})
    ls.model.load_state_dict(moml.model.state_dict())
    batch = next(iter(moml._loader(1)))
    moml.train_step(batch, 1)
    ls.train_step(batch, 1)
    for (key, a), b in zip(moml.model.state_dict().items(), ls.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=key)


def _nan_image_batch(trainer: Trainer) -> list:
    """The trainer's first batch with one input image set to NaN."""
    images, targets = next(iter(trainer._loader(1)))
    images = images.clone()
    images[0] = float("nan")
    return [images, targets]


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_a_bilevel_step_refuses_non_finite_training_losses_in_one_line(name: str, multimnist_small: Path,
                                                                       tmp_path: Path) -> None:
    """With fresh inner batches the validation losses stay finite and a NaN image in the step's batch reaches
    the training-loss check: one line naming the method, the losses and the step."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, name, {"inner_steps": 1, "inner_batches": "fresh"})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step(_nan_image_batch(trainer), 1)
    assert str(error.value) == (f"{name}: non-finite training losses ([nan, nan]) at step 0; lower --lr or the "
                                "method's inner_lr/outer_lr")
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())   # the model not stepped


def test_forum_refuses_a_diverged_inner_loss_in_one_line(multimnist_small: Path, tmp_path: Path) -> None:
    """A first inner step of size 1e30 makes the second inner lower-level loss non-finite while the step's
    training losses are finite: FORUM names that loss."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, "forum", {"inner_steps": 2, "inner_lr": 1e30, "inner_batches": "fresh"})
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step(next(iter(trainer._loader(1))), 1)
    assert str(error.value) == ("forum: non-finite inner lower-level loss ([nan]) at step 0; lower --lr or the "
                                "method's inner_lr/outer_lr")


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_the_upper_level_step_refuses_a_non_finite_gradient_and_keeps_its_variable(name: str, multimnist_small: Path,
                                                                                 tmp_path: Path) -> None:
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    state = _trainer(bench, data, tmp_path, name, {}).method.state
    variable = state.upper.variable
    before = variable.detach().clone()
    gradient = torch.zeros_like(variable)
    gradient.view(-1)[-1] = float("inf")
    with pytest.raises(NonFiniteLossError) as error:
        state.step_upper(gradient)
    assert str(error.value) == f"{name}: non-finite upper-level gradient; lower outer_lr or inner_lr"
    assert torch.equal(variable.detach(), before) and variable.grad is None


@pytest.mark.parametrize("name", ["moml", "forum"])
def test_a_bilevel_step_refuses_non_finite_validation_losses_from_its_upper_batch(
        name: str, multimnist_small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN image in the upper-level (validation) batch, the training batch finite: one line naming the
    validation losses."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, name, {"inner_steps": 1})
    upper = _nan_image_batch(trainer)
    monkeypatch.setattr(trainer.method.state, "upper_batch", lambda hp, view: upper)
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step(next(iter(trainer._loader(1))), 1)
    assert str(error.value) == (f"{name}: non-finite validation losses ([nan, nan]) at step 0; lower --lr or the "
                                "method's inner_lr/outer_lr")


def test_forum_steps_the_model_along_eq_3_26_and_hands_nu_times_q_alpha_to_the_upper_level(
        multimnist_small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eq. 3.26, d = −(Σ λ̃_i ∇F_i + ν ∇q̃): with plain SGD (lr 0.1; momentum has no effect on a first step) ω
    moves by 0.1 · 2 · (Σ λ̃_i ∇_ω F_i + ν ∇_ω f) (× K = 2: the trainer's scale for a convex combination), the
    gradients taken by autograd on a twin of the model, and the upper-level variable is stepped along ν ∇_α q̃.
    ρ = 10 makes ν positive, so the constraint term counts."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, "forum", {"inner_steps": 1, "rho": 10.0})
    state = trainer.method.state
    nus: list[float] = []
    upper_batches: list = []
    upper_steps: list[torch.Tensor] = []
    forum_nu = forum_module.forum_nu
    monkeypatch.setattr(forum_module, "forum_nu", lambda *args: nus.append(forum_nu(*args)) or nus[-1])
    q_alphas = _spy_on_forum_gram(monkeypatch, "q_alpha")
    upper_batch, step_upper = state.upper_batch, state.step_upper
    monkeypatch.setattr(state, "upper_batch", lambda *args: upper_batches.append(upper_batch(*args)) or upper_batches[-1])
    monkeypatch.setattr(state, "step_upper", lambda g: upper_steps.append(g.detach().clone()) or step_upper(g))
    batch = next(iter(trainer._loader(1)))
    twin = copy.deepcopy(trainer.model).train()
    alpha = state.upper.variable.detach().clone()
    trainer.train_step(batch, 1)

    params = [p for p in twin.parameters() if p.requires_grad]

    def task_losses(some_batch) -> torch.Tensor:
        inputs, targets = bench.unpack(some_batch)
        return torch.stack([task.loss(pred, targets[idx])
                            for task, pred, idx in zip(trainer.tasks, twin(inputs), trainer.task_index, strict=True)])

    def flat(tensors) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors]).to(torch.float64)

    f_omega = flat(torch.autograd.grad((alpha.float() * task_losses(batch)).sum(), params))
    val = task_losses(upper_batches[0])
    upper = torch.stack([flat(torch.autograd.grad(val[i], params, retain_graph=True)) for i in range(2)])
    assert nus[0] > 0.1
    expected = flat(params).detach() - 0.1 * 2.0 * (trainer.method.lam_tilde @ upper + nus[0] * f_omega)
    moved = flat(p for p in trainer.model.parameters() if p.requires_grad).detach()
    torch.testing.assert_close(moved, expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(upper_steps[0], nus[0] * q_alphas[0], rtol=0.0, atol=0.0)


def test_forum_gram_is_that_of_the_full_vectors_in_alpha_and_omega() -> None:
    """_gram builds the Gram matrix of (∇F_1, …, ∇F_K, ∇q̃) in z = (α, ω) without writing the zero α-parts of
    ∇F_i: against the matrix of the vectors written out, ∇F_i = (0, ∇_ω F_i) and ∇q̃ = (∇_α q̃, ∇_ω f)."""
    gen = torch.Generator().manual_seed(5)
    upper_grads, f_omega, q_alpha = (torch.randn(*shape, generator=gen, dtype=torch.float32)
                                     for shape in ((3, 7), (7,), (3,)))
    vectors = torch.cat([torch.cat([torch.zeros(3, 3), upper_grads], dim=1),
                         torch.cat([q_alpha, f_omega]).reshape(1, -1)]).double()
    gram = FORUM._gram(upper_grads, f_omega, q_alpha)
    assert gram.dtype == torch.float64
    torch.testing.assert_close(gram, vectors @ vectors.T, rtol=1e-12, atol=1e-12)


def _stationary_gram(scale: float, q_norm2: float) -> torch.Tensor:
    """Two unit UL gradients times √scale and ∇q̃ orthogonal to both with ‖∇q̃‖² = q_norm2."""
    gram = torch.zeros(3, 3, dtype=torch.float64)
    gram[:2, :2] = scale * torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    gram[2, 2] = q_norm2
    return gram


@pytest.mark.parametrize("scale,q_norm2,stationary", [(1e6, 1e-7, True), (1e6, 1e-5, False), (1e-3, 1e-4, False),
                                                     (0.0, 0.0, True), (1.0, 1e-12, True)])   # "at": the boundary
def test_forum_takes_a_constraint_within_1e_12_of_the_largest_squared_norm_as_stationary(
        scale: float, q_norm2: float, stationary: bool) -> None:
    """‖∇q̃‖² at or below 1e-12 x the largest squared gradient norm counts as 0: ν = 0, and the QP falls back to
    the min-norm weights with γ = ϕ = 0 and no multipliers (NaN); above it, ∇q̃ ⊥ ∇F_i gives ν = ρ."""
    gram = _stationary_gram(scale, q_norm2)
    lam = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert forum_nu(gram, lam, 0.4) == (0.0 if stationary else pytest.approx(0.4))
    solution = forum_qp(gram, 0.4)
    if stationary:
        assert (solution.gamma, solution.phi) == (0.0, 0.0)
        assert solution.pi.shape == (2,) and solution.multipliers.shape == (5,)
        assert solution.pi.dtype == solution.multipliers.dtype == torch.float64
        assert bool(solution.pi.isnan().all()) and bool(solution.multipliers.isnan().all())
        torch.testing.assert_close(solution.lam, torch.tensor([0.5, 0.5], dtype=torch.float64))
    else:
        assert solution.phi == pytest.approx(0.2 * q_norm2) and solution.gamma > 0.0


def test_forum_qp_refuses_a_non_finite_gram_and_names_a_failed_solve_and_a_missing_quadprog(monkeypatch: pytest.MonkeyPatch) -> None:
    from method_helpers import hide_module

    gram = _stationary_gram(1.0, 1.0)
    gram[0, 1] = gram[1, 0] = float("nan")
    with pytest.raises(NonFiniteValueError) as error:
        forum_qp(gram, 0.1)
    assert str(error.value) == "forum: the gradient Gram matrix contains NaN or Inf; check the losses and learning rates"
    import quadprog

    def inconsistent(*args, **kwargs):
        raise ValueError("constraints are inconsistent, no solution")

    monkeypatch.setattr(quadprog, "solve_qp", inconsistent)
    with pytest.raises(SolverError) as error:
        forum_qp(_stationary_gram(1.0, 1.0), 0.1)
    assert str(error.value) == "forum: the QP of Eq. 3.29 failed (constraints are inconsistent, no solution)"
    hide_module(monkeypatch, "quadprog")
    with pytest.raises(SolverError) as error:
        forum_qp(_stationary_gram(1.0, 1.0), 0.1)
    assert str(error.value) == "forum needs quadprog for its QP (Eq. 3.29): pip install quadprog"


def test_moml_and_forum_refuse_a_bad_upper_solver_and_an_unfit_benchmark_word_for_word(multimnist_small: Path,
                                                                                      tmp_path: Path) -> None:
    """The two refusals a user meets first, each with its way out: a non-gradient upper solver, and
    sample weights on a benchmark without per-sample losses."""
    with pytest.raises(InvalidParameterError) as error:
        methods.build("moml", 2, upper_solver="ls")
    assert str(error.value) == ("moml: upper_solver='ls' is not a gradient method; use mgda, moco or another "
                                "method that combines gradients")
    with pytest.raises(InvalidParameterError) as error:
        jobs.train(multimnist_small, tmp_path / "run", method="forum", hparams={"upper": "sample-weights"},
                   epochs=1, batch_size=32, max_steps_per_epoch=1, progress=False)
    assert str(error.value) == ("upper=sample-weights needs a benchmark with per-sample training losses and sample "
                                "ids (e.g. hypercleaning); 'multimnist' has none, use upper=task-weights")


@pytest.mark.parametrize("present", ["per_sample_losses", "sample_ids"])
def test_sample_weights_refuse_a_benchmark_with_only_one_of_the_two_hooks(present: str) -> None:
    """A plug-in benchmark needs both duck-typed hooks (losses per sample and the ids that index α); one
    alone is refused like none, not with an AttributeError."""
    bench = SimpleNamespace(name="plugin", **{present: lambda *args: None})
    trainer = SimpleNamespace(bench=bench, task_index=[0, 1], data=SimpleNamespace(splits={"train": range(5)}),
                              device=torch.device("cpu"))
    with pytest.raises(InvalidParameterError) as error:
        SampleWeights(trainer)
    assert str(error.value) == ("upper=sample-weights needs a benchmark with per-sample training losses and sample "
                                "ids (e.g. hypercleaning); 'plugin' has none, use upper=task-weights")


def test_the_functional_model_passes_inputs_without_to_through_and_moves_the_targets() -> None:
    """A plug-in benchmark's inputs may be a dict of tensors (no ``.to``; the trainer guards the same way):
    they reach the model as they are, the targets are moved to the device."""
    inputs = {"image": torch.ones(2, 3)}
    targets = [torch.zeros(2), torch.ones(2)]
    trainer = SimpleNamespace(model=torch.nn.Linear(3, 1), device=torch.device("cpu"),
                              bench=SimpleNamespace(unpack=lambda batch: batch))
    got_inputs, got_targets = FunctionalModel(trainer).inputs_targets((inputs, targets))
    assert got_inputs is inputs
    assert len(got_targets) == 2 and all(torch.equal(a, b) for a, b in zip(got_targets, targets, strict=True))


def test_moml_hands_its_upper_solver_the_validation_losses(multimnist_small: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Loss-aware solvers (dbmtl's shifted losses) read the second argument of ``combine``: the K validation
    losses F_i(ω_T). With an inner step of 1e-12, ω_T = ω, so they are the model's losses on the upper batch,
    computed here on a twin of the model."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    trainer = _trainer(bench, data, tmp_path, "moml", {"inner_steps": 1, "inner_lr": 1e-12,
                                                       "upper_solver": "dbmtl"})
    state, solver = trainer.method.state, trainer.method.solver
    seen_losses: list = []
    upper_batches: list = []
    combine, upper_batch = solver.combine, state.upper_batch
    monkeypatch.setattr(solver, "combine", lambda grads, losses: seen_losses.append(losses) or combine(grads, losses))
    monkeypatch.setattr(state, "upper_batch", lambda *args: upper_batches.append(upper_batch(*args)) or upper_batches[-1])
    twin = copy.deepcopy(trainer.model).train()
    trainer.train_step(next(iter(trainer._loader(1))), 1)
    inputs, targets = bench.unpack(upper_batches[0])
    with torch.no_grad():
        expected = torch.stack([task.loss(pred, targets[idx])
                                for task, pred, idx in zip(trainer.tasks, twin(inputs), trainer.task_index,
                                                           strict=True)])
    assert len(seen_losses) == 1
    torch.testing.assert_close(seen_losses[0], expected, rtol=1e-5, atol=1e-6)


def test_forum_steps_a_model_with_a_parameter_no_loss_uses_as_without_it(multimnist_small: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainable parameter no loss reads (an unused module; here the model's first parameter, so ∇_α f is
    not confused with it) has no gradient anywhere: it gets a zero row, stays where it is, and α, ∇_α q̃ and
    every other weight move as in the run of the same model without it."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    hparams = {"inner_steps": 2, "rho": 10.0}     # ρ = 10: ν > 0, so ∇q̃ (and ∇_α q̃) moves the weights
    plain = _trainer(bench, data, tmp_path / "plain", "forum", hparams)
    make_model = bench.make_model

    def with_unused(names=None):
        model = make_model(names)
        model.register_parameter("unused", torch.nn.Parameter(torch.full((3,), 2.0)))
        return model

    with monkeypatch.context() as patch:
        patch.setattr(bench, "make_model", with_unused)
        extra = _trainer(bench, data, tmp_path / "extra", "forum", hparams)
    assert next(iter(extra.model.named_parameters()))[0] == "unused"
    extra.model.load_state_dict({**plain.model.state_dict(), "unused": extra.model.unused.detach()})
    q_alphas = _spy_on_forum_gram(monkeypatch, "q_alpha")
    batch = next(iter(plain._loader(1)))
    plain.train_step(batch, 1)
    extra.train_step(batch, 1)
    assert torch.equal(extra.model.unused.detach(), torch.full((3,), 2.0))
    torch.testing.assert_close(q_alphas[1], q_alphas[0], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(extra.method.state.upper.variable, plain.method.state.upper.variable,
                               rtol=1e-6, atol=1e-9)
    for key, value in plain.model.state_dict().items():
        torch.testing.assert_close(extra.model.state_dict()[key], value, rtol=1e-5, atol=1e-7, msg=key)


def test_forum_normalize_upper_grads_adds_1e_8_to_a_tiny_norm(multimnist_small: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The authors' normalisation is ∇_ω F_i / (‖∇_ω F_i‖ + 1e-8): a guard that matters once the norm is near
    1e-8. Every loss scaled by 2e-7 puts both norms near 1e-7, where the rows reach the QP ~9 % shorter than
    unit length, against the raw rows of a twin run with the option off."""
    raw, normalized = _upper_grads_raw_and_normalized(multimnist_small, tmp_path, monkeypatch, loss_scale=2e-7)
    norms = raw.norm(dim=1, keepdim=True)
    assert bool(((norms > 2e-8) & (norms < 5e-7)).all()), norms            # the 1e-8 is not negligible here
    torch.testing.assert_close(normalized, raw / (norms + 1e-8), rtol=1e-4, atol=0.0)


def test_forum_keeps_the_step_statistics_of_batch_norm_to_the_steps_own_batch(multimnist_small: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner steps and the validation pass run on copies of the buffers: after one FORUM step a BatchNorm
    layer's running statistics are those of one training-mode forward pass on the step's batch (a twin)."""
    torch.set_num_threads(1)
    bench, data = jobs.load_prepared(multimnist_small)
    make_model = bench.make_model

    def with_batch_norm(names=None):
        model = make_model(names)
        model.trunk = torch.nn.Sequential(model.trunk, torch.nn.BatchNorm1d(model.trunk.out_features))
        return model

    monkeypatch.setattr(bench, "make_model", with_batch_norm)
    trainer = _trainer(bench, data, tmp_path, "forum", {"inner_steps": 2})
    batch = next(iter(trainer._loader(1)))
    twin = copy.deepcopy(trainer.model).train()
    with torch.no_grad():
        twin(bench.unpack(batch)[0])
    trainer.train_step(batch, 1)
    buffers = dict(trainer.model.named_buffers())
    assert int(buffers["trunk.1.num_batches_tracked"]) == 1
    for name, expected in twin.named_buffers():
        torch.testing.assert_close(buffers[name], expected, rtol=1e-6, atol=1e-7, msg=name)


def test_forum_qp_holds_the_weights_to_sum_one_when_the_constraint_gradient_opposes_the_tasks() -> None:
    """Σλ = 1 is an equality of Eq. 3.29: with ∇F = e1, e2 and ∇q̃ = (−1, −0.5, 0.1) pointing against them, a
    larger Σλ would pay, so a solver with Σλ ≥ 1 scales λ past 1. Against brute force over λ_1 on a grid,
    with γ at its closed-form optimum max(πᵀλ, (ϕ − ⟨∇q̃, Σλ_i∇F_i⟩)/‖∇q̃‖², 0) for each λ."""
    vectors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0, -0.5, 0.1]], dtype=torch.float64)
    gram, rho = vectors @ vectors.T, 0.1
    solution = forum_qp(gram, rho)
    q = vectors[2]
    q_norm2 = float(q @ q)
    phi = 0.5 * rho * q_norm2
    pi = (2 * phi - vectors[:2] @ q) / q_norm2
    grid = torch.linspace(0.0, 1.0, 100001, dtype=torch.float64)
    lams = torch.stack([grid, 1.0 - grid], dim=1)                          # [n, 2]
    combined = lams @ vectors[:2]                                           # [n, 3]
    gammas = torch.stack([lams @ pi, (phi - combined @ q) / q_norm2, torch.zeros_like(grid)]).amax(0)
    values = 0.5 * (combined + gammas[:, None] * q).pow(2).sum(1) - gammas * phi
    best = int(values.argmin())
    assert float(solution.lam[0]) == pytest.approx(float(grid[best]), abs=1e-4)
    assert solution.gamma == pytest.approx(float(gammas[best]), abs=1e-4)
    assert float(solution.lam.sum()) == pytest.approx(1.0, abs=1e-15)
