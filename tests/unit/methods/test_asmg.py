"""ASMG (Ye, PhD thesis ch. 4): the estimators are unbiased on a quadratic, λ solves Eq. 4.10, the synthetic
problems converge, the trainer methods never differentiate the model, and the experiment command writes
its plot and table."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from mtlflow import benchmarks, jobs, methods
from mtlflow.benchmarks.asmg_synthetic import PROBLEMS, mixed_ellipsoid_rastrigin, shift_l1_ellipsoid, start_point
from mtlflow.cli import main
from mtlflow.config.run import RunConfig
from mtlflow.core.errors import DataError, InvalidParameterError, NonFiniteLossError
from mtlflow.engine.trainer import Trainer
from mtlflow.methods._blackbox import (
    ASMG,
    ASMGConfig,
    asmg_lambda,
    covariance_gradient,
    mean_gradient,
    minimize,
    smoothing_estimates,
)
from mtlflow.methods.asmg import tuned_parameters
from mtlflow.models.base import MultiTaskModel

D = 4


def quadratics(x: torch.Tensor) -> torch.Tensor:
    """Two quadratics F_i(x) = ½ (x − c_i)ᵀ A_i (x − c_i) with dense A_i, on points [n, d] -> [n, 2]."""
    gen = torch.Generator().manual_seed(11)
    values = []
    for _ in range(2):
        b = torch.randn(D, D, generator=gen, dtype=torch.float64)
        a = b @ b.T / D + torch.eye(D, dtype=torch.float64)
        c = torch.randn(D, generator=gen, dtype=torch.float64)
        diff = x - c
        values.append(0.5 * ((diff @ a) * diff).sum(-1))
    return torch.stack(values, dim=-1)


def true_smoothed_gradients(mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """∇_μ J_i = A_i(μ − c_i) and diag ∇_Σ J_i = ½ diag(A_i) for J_i(μ, Σ) = F_i(μ) + ½ tr(A_i Σ)."""
    gen = torch.Generator().manual_seed(11)
    grads, diags = [], []
    for _ in range(2):
        b = torch.randn(D, D, generator=gen, dtype=torch.float64)
        a = b @ b.T / D + torch.eye(D, dtype=torch.float64)
        c = torch.randn(D, generator=gen, dtype=torch.float64)
        grads.append(a @ (mu - c))
        diags.append(0.5 * torch.diagonal(a))
    return torch.stack(grads), torch.stack(diags)


def test_estimators_are_unbiased_on_a_quadratic() -> None:
    mu = torch.tensor([0.5, -1.0, 2.0, 0.3], dtype=torch.float64)
    sigma = torch.tensor([0.3, 1.5, 0.8, 2.0], dtype=torch.float64)
    n = 400_000
    z = torch.randn(n, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    values = quadratics(mu + sigma.sqrt() * z)
    center = quadratics(mu.reshape(1, -1))[0]
    p_hat, h_hat = smoothing_estimates(z, values, center)
    g_hat, big_g_hat = mean_gradient(p_hat, sigma), covariance_gradient(h_hat, sigma)
    true_g, true_big_g = true_smoothed_gradients(mu)
    # standard errors of the means from the per-sample terms of Eqs. 4.15 and 4.16
    delta = values - center
    g_terms = (z / sigma.sqrt()).unsqueeze(1) * delta.unsqueeze(2)                       # [n, m, d]
    big_g_terms = ((z * z - 1) / (2 * sigma)).unsqueeze(1) * delta.unsqueeze(2)
    g_se = g_terms.std(0) / math.sqrt(n)
    big_g_se = big_g_terms.std(0) / math.sqrt(n)
    assert torch.all((g_hat - true_g).abs() < 5 * g_se), (g_hat, true_g)
    assert torch.all((big_g_hat - true_big_g).abs() < 5 * big_g_se), (big_g_hat, true_big_g)
    # and the estimates are informative: errors far below the signal
    assert float((g_hat - true_g).norm() / true_g.norm()) < 0.02


def test_smoothing_estimates_by_hand() -> None:
    """Eqs. 4.12-4.13 on two samples in one dimension: p̂ = (1/N) Σ z_j ΔF_j and ĥ = (1/2N) Σ (z_j² − 1) ΔF_j
    with ΔF_j = F(x_j) − F(μ): z = (1, 2), F(x) = (3, 1), F(μ) = 2 give ΔF = (1, −1), p̂ = −½ and ĥ = −¾."""
    p_hat, h_hat = smoothing_estimates(torch.tensor([[1.0], [2.0]]), torch.tensor([[3.0], [1.0]]), torch.tensor([2.0]))
    assert (p_hat.tolist(), h_hat.tolist()) == ([[-0.5]], [[-0.75]])


def test_lambda_is_the_min_norm_point_of_eq_4_10() -> None:
    gen = torch.Generator().manual_seed(3)
    p_hat, h_hat = torch.randn(2, 7, generator=gen, dtype=torch.float64), torch.randn(2, 7, generator=gen,
                                                                                     dtype=torch.float64)
    lam = asmg_lambda(p_hat, h_hat)
    grid = torch.linspace(0, 1, 20001, dtype=torch.float64)
    weights = torch.stack([grid, 1 - grid], dim=1)
    objective = (weights @ p_hat).pow(2).sum(1) + 2 * (weights @ h_hat).pow(2).sum(1)
    best = weights[int(objective.argmin())]
    assert float(lam.sum()) == pytest.approx(1.0)
    torch.testing.assert_close(lam, best, atol=1e-4, rtol=0)


def test_momentum_and_equal_weights() -> None:
    x0 = start_point(10, 0)
    adaptive = ASMG(x0, 2, ASMGConfig(beta=0.1, n_samples=10), seed=1)
    samples = adaptive.ask()
    step = adaptive.tell(shift_l1_ellipsoid(samples), shift_l1_ellipsoid(x0.reshape(1, -1))[0])
    torch.testing.assert_close(step.lam, step.lam_solved)                 # γ_0 = 1: λ^0 = λ̃^0
    equal = minimize(shift_l1_ellipsoid, x0, 5, ASMGConfig(beta=0.1, n_samples=10, weighting="equal"))
    torch.testing.assert_close(equal.lam, torch.full((2,), 0.5, dtype=torch.float64))


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_asmg_reaches_high_precision_on_the_synthetic_problems(problem: str) -> None:
    spec = PROBLEMS[problem]
    optimizer = minimize(spec.objectives, start_point(5, 0), 1500, ASMGConfig(beta=0.1, n_samples=10), seed=0,
                         callback=lambda t, opt, step: float(spec.distance(opt.mean)) <= 1e-5)
    assert float(spec.distance(optimizer.mean)) <= 1e-5, optimizer.t
    assert optimizer.clipped == 0


@pytest.mark.parametrize("seed", [0, 3])
def test_minimize_is_ask_and_tell_from_the_seeded_sampler(seed: int) -> None:
    """minimize's loop written out by hand: the same seed gives the same search, bit for bit."""
    config = ASMGConfig(beta=0.1, n_samples=10)
    by_hand = ASMG(start_point(10, 0), 2, config, seed=seed)
    for _ in range(4):
        samples = by_hand.ask()
        by_hand.tell(shift_l1_ellipsoid(samples), shift_l1_ellipsoid(by_hand.mean.reshape(1, -1))[0])
    run = minimize(shift_l1_ellipsoid, start_point(10, 0), 4, config, seed=seed)
    assert run.t == 4
    torch.testing.assert_close(run.mean, by_hand.mean, rtol=0, atol=0)
    other = minimize(shift_l1_ellipsoid, start_point(10, 0), 4, config, seed=seed + 1)
    assert not torch.equal(other.mean, run.mean)


def test_minimize_calls_back_after_each_iteration_and_stops_when_told() -> None:
    seen: list[tuple[int, int, bool]] = []

    def callback(t: int, optimizer: ASMG, step) -> bool:
        seen.append((t, optimizer.t, torch.equal(step.lam, optimizer.lam)))
        return t == 2

    run = minimize(shift_l1_ellipsoid, start_point(10, 0), 10, ASMGConfig(beta=0.1, n_samples=10), callback=callback)
    assert seen == [(0, 1, True), (1, 2, True), (2, 3, True)] and run.t == 3


def test_the_raw_update_is_eq_4_14_from_the_initial_variance_sigma0() -> None:
    """Eq. 4.14 on the smoothing estimates of the step's own samples: μ ← μ − β Σ Σ_i λ_i ĝ_i and
    Σ⁻¹ ← Σ⁻¹ ⊙ (1 + 2β Σ_i λ_i ĥ_i), from Σ_0 = sigma0 · I."""
    config = ASMGConfig(beta=1e-3, n_samples=10, update="raw", sigma0=0.5, min_precision_ratio=0.0)
    search = ASMG(start_point(4, 0), 2, config, seed=3)
    assert torch.equal(search.sigma, torch.full((4,), 0.5, dtype=torch.float64))
    mean, sigma = search.mean.clone(), search.sigma.clone()
    samples = search.ask()
    values, center = shift_l1_ellipsoid(samples), shift_l1_ellipsoid(mean.reshape(1, -1))[0]
    step = search.tell(values, center)
    p_hat, h_hat = smoothing_estimates((samples - mean) / sigma.sqrt(), values, center)
    torch.testing.assert_close(step.lam, asmg_lambda(p_hat, h_hat))            # γ_0 = 1: this step's λ
    torch.testing.assert_close(search.mean, mean - 1e-3 * sigma * (step.lam @ mean_gradient(p_hat, sigma)))
    torch.testing.assert_close(search.precision, (1.0 / sigma) * (1.0 + 2e-3 * (step.lam @ h_hat)))


def test_the_normalized_update_is_a_152_a_153_with_the_floor_counted_per_coordinate() -> None:
    """App. A.2.5 written out in NumPy for N = 5 samples in d = 3: fitness h = standardised λᵀF(x_j),
    μ ← μ − β σ^{1/2} ⊙ (1/N) Σ_j h_j z_j and Σ⁻¹ ← Σ⁻¹ ⊙ max(1 + β (1/N) Σ_j h_j z_j², floor); the
    coordinates below the floor are counted, per step and over the run."""
    beta, floor = 0.5, 0.99
    search = ASMG(start_point(3, 1), 2, ASMGConfig(beta=beta, n_samples=5, min_precision_ratio=floor), seed=3)
    clipped_so_far = 0
    for t in range(2):
        mean, sigma, precision = (v.numpy().copy() for v in (search.mean, search.sigma, search.precision))
        samples = search.ask()
        z = (samples.numpy() - mean) / np.sqrt(sigma)
        values, center = shift_l1_ellipsoid(samples), shift_l1_ellipsoid(search.mean.reshape(1, -1))[0]
        step = search.tell(values, center)
        aggregated = values.numpy() @ step.lam.numpy()
        fitness = (aggregated - aggregated.mean()) / aggregated.std(ddof=1)
        ratio = 1.0 + beta * (fitness @ (z * z)) / 5
        np.testing.assert_allclose(search.mean.numpy(), mean - beta * np.sqrt(sigma) * (fitness @ z) / 5, rtol=1e-12)
        np.testing.assert_allclose(search.precision.numpy(), precision * np.maximum(ratio, floor), rtol=1e-12)
        clipped_so_far += int((ratio < floor).sum())
        assert step.extra == {"clipped": int((ratio < floor).sum())} and torch.equal(step.center, center)
        assert (search.t, search.clipped) == (t + 1, clipped_so_far)
    assert clipped_so_far == 3                  # 1, then 2 coordinates at the floor


def test_a_flat_objective_leaves_the_normalized_search_where_it_is() -> None:
    """Equal values at every sample carry no ranking: the fitness is 0, so μ and Σ stay (never 0/0)."""
    search = ASMG(start_point(4, 0), 2, ASMGConfig(n_samples=5))
    mean, precision = search.mean.clone(), search.precision.clone()
    search.ask()
    search.tell(torch.ones(5, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    assert torch.equal(search.mean, mean) and torch.equal(search.precision, precision)


def test_tell_refuses_a_call_without_ask_and_a_non_finite_value_in_one_line() -> None:
    search = ASMG(start_point(4, 0), 2, ASMGConfig(n_samples=3))
    with pytest.raises(RuntimeError) as error:
        search.tell(torch.ones(3, 2), torch.ones(2))
    assert str(error.value) == "ASMG.tell() called without ask()"
    search.ask()
    with pytest.raises(NonFiniteLossError) as error:
        search.tell(torch.ones(3, 2), torch.tensor([1.0, float("nan")]))   # the centre's value alone
    assert str(error.value) == "asmg: an objective value is NaN or Inf; lower sigma0 or beta"


def test_raw_update_overshoot_is_an_error_without_the_guard() -> None:
    config = ASMGConfig(beta=0.1, n_samples=10, update="raw", min_precision_ratio=0.0)
    with pytest.raises(NonFiniteLossError) as error:
        minimize(mixed_ellipsoid_rastrigin, start_point(100, 0), 3, config)
    assert str(error.value) == ("asmg: the covariance update made Σ⁻¹ non-positive at iteration 0; lower beta, use "
                                "update=normalized or set min_precision_ratio > 0")


def test_state_dict_continues_exactly() -> None:
    config = ASMGConfig(beta=0.1, n_samples=10)
    a = minimize(shift_l1_ellipsoid, start_point(10, 0), 5, config, seed=4)
    b = ASMG(start_point(10, 0), 2, config)
    b.load_state_dict(a.state_dict())
    for opt in (a, b):
        x = opt.ask()
        opt.tell(shift_l1_ellipsoid(x), shift_l1_ellipsoid(opt.mean.reshape(1, -1))[0])
    torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=0)
    torch.testing.assert_close(a.precision, b.precision, rtol=0, atol=0)


def test_trainer_method_uses_loss_evaluations_only(multimnist_small: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    seed_run = tmp_path / "ls"
    jobs.train(multimnist_small, seed_run, method="ls", epochs=1, batch_size=64, max_steps_per_epoch=2, progress=False)

    def no_autograd(*args, **kwargs):
        raise AssertionError("ASMG must not differentiate the model")

    bench, data = jobs.load_prepared(multimnist_small)
    config = RunConfig(method="asmg", epochs=1, batch_size=32, max_steps_per_epoch=2,
                         hparams={"params": "head-last", "init_from": str(seed_run / "model.pt"), "reinit": True,
                                  "n_samples": 6, "sigma0": 0.01})
    trainer = Trainer(bench, data, config, tmp_path / "asmg", progress=False)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trained = torch.load(seed_run / "model.pt", weights_only=False)["state_dict"]
    monkeypatch.setattr(torch.Tensor, "backward", no_autograd)
    monkeypatch.setattr(torch.autograd, "grad", no_autograd)
    trainer.fit()
    monkeypatch.undo()
    assert all(p.grad is None for p in trainer.model.parameters())
    end = trainer.model.state_dict()
    for key in end:
        if key.startswith("trunk."):  # the frozen trunk is the trained one, untouched
            assert torch.equal(end[key], trained[key]) and torch.equal(start[key], trained[key]), key
    last = [k for k in end if k.startswith("heads.") and k.split(".")[2] == "2"]   # head = Linear, ReLU, Linear
    assert last and all(not torch.equal(end[k], start[k]) for k in last)           # the tuned layers moved
    assert all(torch.equal(end[k], start[k]) for k in end if k.startswith("heads.") and k not in last)
    assert not torch.equal(start[last[0]], trained[last[0]])                       # reinit happened
    metrics = json.loads((tmp_path / "asmg" / "metrics.json").read_text())
    assert all(math.isfinite(v) for v in metrics["epochs"][0]["train_loss"].values())


def test_synthetic_benchmark_trains_with_asmg(tmp_path: Path) -> None:
    data = tmp_path / "data"
    jobs.prepare("asmg-synthetic", data, problem="lhalf-ellipsoid", dim=10, steps_per_epoch=60)
    bench = benchmarks.build("asmg-synthetic", problem="lhalf-ellipsoid", dim=10)
    assert bench.method_defaults("asmg") == {"beta": 0.1, "n_samples": 50}
    jobs.train(data, tmp_path / "run", method="asmg", epochs=1, progress=False)
    x = torch.load(tmp_path / "run" / "model.pt", weights_only=False)["state_dict"]["trunk.x"]
    assert float(PROBLEMS["lhalf-ellipsoid"].distance(x)) < 0.25 * float(
        PROBLEMS["lhalf-ellipsoid"].distance(start_point(10, 0)))


def test_asmg_synthetic_command_writes_plot_and_table(tmp_path: Path) -> None:
    out = tmp_path / "syn"
    code = main(["asmg-synthetic", "--problems", "l1-ellipsoid,lhalf-ellipsoid", "--n", "10,20", "--seeds", "0",
                 "--methods", "asmg,asmg-ew", "--dim", "4", "--iterations", "800", "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "results.json").read_text())
    assert len(summary["cells"]) == 2 * 2 * 2 and len(summary["runs"]) == 8
    assert (out / "convergence.png").stat().st_size > 10_000
    table = (out / "results.md").read_text()
    assert "| problem | method | N | final ℰ (mean) |" in table and "| l1-ellipsoid | asmg-ew | 20 |" in table
    asmg_cells = [c for c in summary["cells"] if c["method"] == "asmg"]
    assert all(c["seeds_reaching_target"] == 1 for c in asmg_cells)
    assert all(c["evaluations_to_target"] == c["iterations_to_target"] * (c["n_samples"] + 1) for c in asmg_cells)


def test_asmg_synthetic_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["asmg-synthetic", "--problems", "sphere", "--out", str(tmp_path / "a")]) == 2
    assert "unknown problem(s) sphere" in capsys.readouterr().err
    assert main(["asmg-synthetic", "--n", "10,x", "--out", str(tmp_path / "b")]) == 2
    assert "--n must be a comma-separated list of integers" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_reinit_resets_every_head_layer_and_names_a_layer_without_reset_parameters(
        multimnist_small: Path, tmp_path: Path) -> None:
    """params=heads with reinit re-initialises every layer of every head (the trunk as it was); a layer that
    cannot re-initialise itself is named."""

    class Scale(nn.Module):   # a parameter-owning module without reset_parameters
        def __init__(self) -> None:
            super().__init__()
            self.factor = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return x * self.factor

    bench, data = jobs.load_prepared(multimnist_small)
    config = RunConfig(method="asmg", epochs=1, batch_size=8,
                       hparams={**jobs.resolved_hparams(bench, "asmg", {}), "params": "heads", "reinit": True})
    torch.manual_seed(0)
    before = bench.make_model().state_dict()
    torch.manual_seed(0)
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    after = trainer.model.state_dict()
    heads = [k for k in before if k.startswith("heads.")]
    assert len(heads) > 2 and all(not torch.equal(before[k], after[k]) for k in heads if k.endswith("weight"))
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("heads."))
    trainer.model.heads[0] = nn.Sequential(Scale(), nn.Linear(2, 2))
    with pytest.raises(InvalidParameterError) as error:
        trainer.method.setup(trainer)
    assert str(error.value) == ("asmg: cannot re-initialise Scale (it has no reset_parameters); "
                                "choose params=head-last")


@pytest.mark.parametrize("name,weighting", [("asmg", "adaptive"), ("asmg-ew", "equal")])
def test_setup_hands_every_hyper_parameter_to_the_search(name: str, weighting: str, multimnist_small: Path,
                                                        tmp_path: Path) -> None:
    bench, data = jobs.load_prepared(multimnist_small)
    hparams = {"beta": 0.3, "n_samples": 7, "sigma0": 0.2, "update": "raw", "min_precision_ratio": 0.05,
               "params": "heads"}
    config = RunConfig(method=name, epochs=1, batch_size=8, hparams=hparams)
    search = Trainer(bench, data, config, tmp_path / "run", progress=False).method.optimizer
    assert search.config == ASMGConfig(beta=0.3, n_samples=7, sigma0=0.2, update="raw", weighting=weighting,
                                       min_precision_ratio=0.05)


def test_the_search_draws_from_the_run_seed_and_the_method_name(multimnist_small: Path, tmp_path: Path) -> None:
    bench, data = jobs.load_prepared(multimnist_small)

    def first_samples(name: str, seed: int) -> torch.Tensor:
        config = RunConfig(method=name, epochs=1, batch_size=8, seed=seed, hparams={"params": "head-last"})
        return Trainer(bench, data, config, tmp_path / f"{name}-{seed}", progress=False).method.optimizer.ask()

    same = first_samples("asmg", 1)
    assert torch.equal(same, first_samples("asmg", 1))
    assert not torch.equal(same, first_samples("asmg", 2)) and not torch.equal(same, first_samples("asmg-ew", 1))


def test_head_last_tunes_the_last_parameter_owning_layer_of_each_head() -> None:
    heads = nn.ModuleList([nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 3), nn.Linear(3, 1), nn.ReLU())
                           for _ in range(2)])
    model = nn.Module()
    model.heads = heads
    expected = [p for head in heads for p in head[3].parameters()]
    assert [id(p) for p in tuned_parameters(model, "head-last")] == [id(p) for p in expected]
    assert len(tuned_parameters(model, "heads")) == 12


@pytest.mark.parametrize("field,value,message", [
    ("beta", 0.0, "beta=0.0 must be > 0"),
    ("n_samples", 1, "n_samples=1 must be an integer >= 2"),
    ("n_samples", 2.0, "n_samples=2.0 must be an integer >= 2"),
    ("sigma0", 0.0, "sigma0=0.0 must be > 0"),
    ("update", "adam", "update='adam' must be one of normalized, raw"),
    ("min_precision_ratio", 1.0, "min_precision_ratio=1.0 must be in [0, 1)"),
    ("weighting", "fixed", "weighting='fixed' must be one of adaptive, equal"),
])
def test_the_search_configuration_refuses_each_bad_field_in_one_line(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidParameterError) as error:
        ASMG(torch.zeros(3), 2, ASMGConfig(**{field: value}))
    assert str(error.value) == f"asmg: {message}"
    ASMG(torch.zeros(3), 2, ASMGConfig(n_samples=2, min_precision_ratio=0.0))   # the boundaries are accepted


def test_reinit_of_the_whole_model_is_refused_in_one_line() -> None:
    with pytest.raises(InvalidParameterError) as error:
        methods.build("asmg", 2, reinit=True, params="all")
    assert str(error.value) == ("asmg: reinit=true with params=all re-initialises the whole model; choose "
                                "params=heads or head-last")


def test_a_parameter_subset_without_trainable_parameters_is_refused_in_one_line() -> None:
    model = MultiTaskModel(nn.Linear(3, 4), [nn.Linear(4, 1), nn.Linear(4, 1)], ["t0", "t1"])
    model.heads.requires_grad_(False)
    assert tuned_parameters(model, "all") == list(model.trunk.parameters())
    with pytest.raises(InvalidParameterError) as error:
        tuned_parameters(model, "heads")
    assert str(error.value) == ("asmg: params='heads' selects no trainable parameter of this model; "
                                "use params=all")


def test_init_from_a_model_of_other_shapes_is_refused_in_one_line(tmp_path: Path) -> None:
    from mtlflow import methods

    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"weight": torch.zeros(3, 3), "bias": torch.zeros(3)}}, path)
    method = methods.build("asmg", 2)
    with pytest.raises(InvalidParameterError) as error:
        method._load_weights(nn.Linear(2, 2), path, torch.device("cpu"))
    assert str(error.value) == (f"asmg: {path} does not match this model (RuntimeError); train it on the same "
                                "benchmark and tasks")


def test_init_from_reads_a_run_model_or_a_bare_state_dict_and_names_a_missing_file(tmp_path: Path) -> None:
    from mtlflow import methods

    source = nn.Linear(2, 2)
    run_model, bare = tmp_path / "model.pt", tmp_path / "weights.pt"
    torch.save({"state_dict": source.state_dict(), "benchmark": "b"}, run_model)   # a run's model.pt
    torch.save(source.state_dict(), bare)                                          # torch.save(model.state_dict())
    method = methods.build("asmg", 2)
    for path in (run_model, bare):
        target = nn.Linear(2, 2)
        method._load_weights(target, path, torch.device("cpu"))
        assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    missing = tmp_path / "none.pt"
    with pytest.raises(DataError) as error:
        method._load_weights(nn.Linear(2, 2), missing, torch.device("cpu"))
    assert str(error.value) == f"asmg: init_from file not found: {missing}; give a run's model.pt"


def test_the_search_state_is_float64_from_a_float32_start() -> None:
    """The trainer hands ASMG float32 parameters: μ and Σ⁻¹ are float64 from the start, so Σ_0 is sigma0
    itself, not its float32 rounding (0.2f = 0.20000000298...)."""
    search = ASMG(torch.zeros(3), 2, ASMGConfig(sigma0=0.2))
    assert search.mean.dtype == search.precision.dtype == torch.float64
    assert torch.equal(search.sigma, torch.full((3,), 0.2, dtype=torch.float64))


def test_equal_weighting_is_one_over_m_in_float64() -> None:
    """ASMG-EW's λ̃ = 1/m: for m = 3 it is 1/3 to double precision (float32 would give 0.33333334)."""
    search = ASMG(torch.zeros(2, dtype=torch.float64), 3, ASMGConfig(n_samples=4, weighting="equal"))
    search.ask()
    step = search.tell(torch.arange(12, dtype=torch.float64).reshape(4, 3), torch.zeros(3, dtype=torch.float64))
    third = torch.full((3,), 1.0 / 3.0, dtype=torch.float64)
    assert torch.equal(step.lam_solved, third) and torch.equal(step.lam, third)


def _one_raw_step(floor: float, delta: list[float]) -> tuple[ASMG, Any]:
    """One raw step with m = 1, β = ½, σ_0 = 1 and the noise set to z = (2, 0) in d = 1: ĥ = ((2² − 1) ΔF_1 +
    (0² − 1) ΔF_2) / 4, so ΔF = (0, 2d) gives ĥ = −d/2 and the precision ratio 1 + 2β ĥ = 1 − d/2, exactly."""
    search = ASMG(torch.zeros(1, dtype=torch.float64), 1,
                  ASMGConfig(beta=0.5, n_samples=2, update="raw", weighting="equal", min_precision_ratio=floor))
    search.ask()
    search._noise = torch.tensor([[2.0], [0.0]], dtype=torch.float64)
    return search, search.tell(torch.tensor(delta, dtype=torch.float64).reshape(2, 1), torch.zeros(1))


def test_a_precision_ratio_at_the_floor_is_kept_and_one_of_zero_is_an_error_without_it() -> None:
    """The floor acts below it: a ratio of exactly 0.5 with floor 0.5 is applied, not counted as clipped. With
    the floor off, a ratio of exactly 0 would make Σ⁻¹ = 0 (an infinite variance): refused, not applied."""
    search, step = _one_raw_step(0.5, [0.0, 2.0])                  # ratio 1 − 1/2
    assert step.extra == {"clipped": 0} and search.clipped == 0
    assert torch.equal(search.precision, torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(NonFiniteLossError) as error:
        _one_raw_step(0.0, [0.0, 4.0])                             # ratio 1 − 2/2 = 0
    assert str(error.value) == ("asmg: the covariance update made Σ⁻¹ non-positive at iteration 0; lower beta, use "
                                "update=normalized or set min_precision_ratio > 0")


def test_a_frozen_trunk_runs_once_per_step_so_its_batch_norm_counts_one_batch(
        multimnist_small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With params=heads the shared features are computed once and only the heads see the N + 1 points: a
    BatchNorm in the trunk updates its running statistics once, as one training-mode pass on the batch (a
    twin), not N + 1 times."""
    bench, data = jobs.load_prepared(multimnist_small)
    make_model = bench.make_model

    def with_batch_norm(names=None):
        model = make_model(names)
        model.trunk = nn.Sequential(model.trunk, nn.BatchNorm1d(model.trunk.out_features))
        return model

    monkeypatch.setattr(bench, "make_model", with_batch_norm)
    config = RunConfig(method="asmg", epochs=1, batch_size=8, hparams={"params": "heads", "n_samples": 3})
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    batch = next(iter(trainer._loader(1)))
    twin = copy.deepcopy(trainer.model.trunk).train()
    with torch.no_grad():
        twin(bench.unpack(batch)[0])
    trainer.train_step(batch, 1)
    buffers = dict(trainer.model.trunk.named_buffers())
    assert int(buffers["1.num_batches_tracked"]) == 1
    for name, expected in twin.named_buffers():
        torch.testing.assert_close(buffers[name], expected, rtol=1e-6, atol=1e-7, msg=name)
