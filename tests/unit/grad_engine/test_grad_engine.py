"""The gradient engine: backends agree, Gramian-only and representation paths, heads keep plain
gradients, amortised weights skip the Jacobian, and bad backend names are rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import run_cli, stderr_lines
from mtlflow import jobs
from mtlflow import methods as method_registry
from mtlflow.config.run import RunConfig
from mtlflow.core.errors import InvalidParameterError, UnknownNameError
from mtlflow.grad_engine import (
    JACOBIAN_BACKENDS,
    AutogramGramian,
    ForwardPass,
    LoopBackend,
    StepProblem,
    backward_heads,
    backward_shared_weighted,
    jacobian_backend,
    representation_jacobian,
    resolve_backend,
)
from mtlflow.methods.base import UPDATE_WEIGHTS_EVERY, GradientMethod, GramianWeighting
from mtlflow.methods.mgdaub import MGDAUB
from mtlflow.methods.solvers import min_norm_weights_qp
from mtlflow.models.base import MultiTaskModel

K = 3


def small_problem(seed: int = 0) -> tuple[MultiTaskModel, StepProblem]:
    """A float64 conv trunk with BatchNorm and 3 two-layer heads on a fixed random batch."""
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8),
                          nn.Tanh())
    heads = [nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 1)) for _ in range(K)]
    model = MultiTaskModel(trunk, heads, [f"t{i}" for i in range(K)]).double()
    x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    y = torch.randn(K, 6, 1, dtype=torch.float64)

    def losses_of(preds: list[torch.Tensor]) -> list[torch.Tensor]:
        return [((p - t) ** 2).mean() * (i + 1) for i, (p, t) in enumerate(zip(preds, y, strict=True))]

    def forward() -> ForwardPass:
        z = model.features(x)
        return ForwardPass(losses_of(model.forward_heads(z)), z)

    def functional(overrides: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack(losses_of(torch.func.functional_call(model, overrides, (x,))))

    shared = model.shared_parameters()
    heads_params = [model.task_parameters(i) for i in range(K)]
    return model, StepProblem(model, shared, heads_params, forward, functional)


def reference(problem: StepProblem) -> tuple[torch.Tensor, list[list[torch.Tensor]], torch.Tensor]:
    """J by one autograd call per (task, parameter set), the plain head gradients, and ∂L_i/∂z."""
    fwd = problem.forward()
    rows, heads, reps = [], [], []
    for i, loss in enumerate(fwd.losses):
        g = torch.autograd.grad(loss, problem.shared, retain_graph=True)
        rows.append(torch.cat([t.reshape(-1) for t in g]))
        heads.append([t.clone() for t in torch.autograd.grad(loss, problem.task_params[i], retain_graph=True)])
        reps.append(torch.autograd.grad(loss, fwd.features, retain_graph=True)[0].reshape(-1))
    return torch.stack(rows), heads, torch.stack(reps)


def head_grads(problem: StepProblem) -> list[list[torch.Tensor]]:
    return [[p.grad.clone() for p in params] for params in problem.task_params]


@pytest.mark.parametrize("backend", sorted(JACOBIAN_BACKENDS))
def test_jacobian_backends_agree_and_heads_get_plain_gradients(backend: str) -> None:
    model, problem = small_problem()
    expected_j, expected_heads, _ = reference(problem)
    model.zero_grad(set_to_none=True)
    forward, jac = jacobian_backend(backend).jacobian(problem)
    assert jac.shape == (K, sum(p.numel() for p in problem.shared))
    torch.testing.assert_close(jac, expected_j, rtol=1e-10, atol=1e-12)
    for got, want in zip(head_grads(problem), expected_heads, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert all(p.grad is None for p in problem.shared)  # the engine never touches the shared .grad
    assert all(not hasattr(p, "jac") for p in problem.shared)  # autojac's .jac is consumed
    torch.testing.assert_close(forward.stacked.detach(), problem.forward().stacked.detach())


def test_autogram_gramian_equals_jacobian_gramian_and_ignores_unhooked_passes() -> None:
    model, problem = small_problem()
    expected_j, _, _ = reference(problem)
    autogram = AutogramGramian(model.trunk)
    problem.forward()  # a pass with gradients outside the hooked block must not disturb the engine
    with autogram.hooked(model):
        forward = problem.forward()
    assert model.trunk is autogram.trunk  # restored after the block
    gramian = autogram.gramian(forward.stacked)
    torch.testing.assert_close(gramian, expected_j @ expected_j.T, rtol=1e-9, atol=1e-12)
    with autogram.hooked(model):  # and it works again on the next step
        second = autogram.gramian(problem.forward().stacked)
    torch.testing.assert_close(second, gramian)


def test_weighted_backward_gives_shared_combination_and_plain_heads() -> None:
    model, problem = small_problem()
    expected_j, expected_heads, _ = reference(problem)
    weights = torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64)  # a zero weight must not zero a head
    model.zero_grad(set_to_none=True)
    forward = problem.forward()
    backward_heads(forward.losses, problem.task_params)
    backward_shared_weighted(forward.losses, weights, problem.shared)
    shared = torch.cat([p.grad.reshape(-1) for p in problem.shared])
    torch.testing.assert_close(shared, weights @ expected_j, rtol=1e-10, atol=1e-12)
    for got, want in zip(head_grads(problem), expected_heads, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_representation_gradients_are_per_task_feature_gradients() -> None:
    model, problem = small_problem()
    _, expected_heads, expected_rep = reference(problem)
    model.zero_grad(set_to_none=True)
    forward = problem.forward()
    rep = representation_jacobian(forward, problem.task_params)
    torch.testing.assert_close(rep, expected_rep, rtol=1e-10, atol=1e-12)
    for got, want in zip(head_grads(problem), expected_heads, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert all(p.grad is None for p in problem.shared)  # the trunk is not differentiated yet


def test_representation_gradients_through_a_shared_head_node_an_unused_task_and_no_features() -> None:
    """Hand-checked rows: both losses go through one node after z (tanh: a second pass through it needs the
    graph kept), a third loss does not depend on z (its row is 0, its head still gets its gradient), and the
    trunk can be differentiated afterwards; a pass without features is refused in words."""
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)  # the trunk
    x = torch.tensor([1.0, 0.25, -0.5], dtype=torch.float64)
    z = w * x
    shared = torch.tanh(z)  # after z, used by tasks 0 and 1
    a = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True)
    c = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    losses = [a * shared.sum(), b * (shared ** 2).sum(), c ** 2]
    rows = representation_jacobian(ForwardPass(losses, z), [[a], [b], [c]])
    sech2 = 1 - torch.tanh(z.detach()) ** 2
    expected = torch.stack([2.0 * sech2, -3.0 * 2 * torch.tanh(z.detach()) * sech2, torch.zeros(3, dtype=torch.float64)])
    torch.testing.assert_close(rows, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.grad, torch.tanh(z.detach()).sum())
    torch.testing.assert_close(b.grad, (torch.tanh(z.detach()) ** 2).sum())
    torch.testing.assert_close(c.grad, torch.tensor(1.4, dtype=torch.float64))
    z.backward(rows.sum(0))  # the trunk's backward pass still has its graph
    torch.testing.assert_close(w.grad, rows.sum(0) * x)
    with pytest.raises(ValueError, match=r"^representation gradients need the shared features of the forward pass$"):
        representation_jacobian(ForwardPass(losses, None), [[a], [b], [c]])


def test_mgdaub_weights_are_the_min_norm_point_of_the_representation_gradients() -> None:
    # MGDA-UB (Sener & Koltun 2018, Sec. 3.3): α* = argmin_{α∈Δ} ||Σ α_i ∇_Z L_i||²; at the min-norm
    # point d every gradient has <g_i, d> >= ||d||² (optimality on the simplex), so -d decreases all tasks
    torch.manual_seed(1)
    rep = torch.randn(4, 50, dtype=torch.float64)
    rep[3] = -0.5 * rep[0] + 0.1 * rep[1]  # a conflicting task
    method = MGDAUB(4)
    alpha = method.weights_from_gramian(rep @ rep.T, torch.ones(4, dtype=torch.float64))
    assert alpha.min() >= 0 and float(alpha.sum()) == pytest.approx(1.0)
    d = alpha @ rep
    assert torch.all(rep @ d >= d @ d - 1e-9)
    torch.testing.assert_close(alpha, min_norm_weights_qp(rep @ rep.T))
    # 'l2' normalisation: the solver sees unit gradients, the weights apply to the raw ones
    scaled = rep * torch.tensor([[1.0], [10.0], [0.1], [1.0]], dtype=torch.float64)
    unit = MGDAUB(4, normalization="l2").weights_from_gramian(scaled @ scaled.T, torch.ones(4, dtype=torch.float64))
    norms = scaled.norm(dim=1)
    torch.testing.assert_close(unit, min_norm_weights_qp((scaled / norms[:, None]) @ (scaled / norms[:, None]).T))


def final_state(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "model.pt", weights_only=False)["state_dict"]


TRAJECTORY = dict(epochs=1, batch_size=16, max_steps_per_epoch=2, optimizer="sgd", lr=0.05, progress=False)


def test_gramian_method_trajectory_is_the_same_for_every_backend(multimnist_small: Path, tmp_path: Path) -> None:
    # MGDA on the loop's Jacobian, on every other Jacobian backend and on autogram's Gramian only
    # (weighted backward): the same steps to float32 accuracy (SGD: updates linear in the gradients)
    from mtlflow.engine.trainer import Trainer

    bench, data = jobs.load_prepared(multimnist_small)
    initial = Trainer(bench, data, RunConfig(method="mgda"), tmp_path / "init", progress=False).model.state_dict()
    states = {}
    for backend in ["loop", "batched", "func", "autojac", "autogram"]:
        jobs.train(multimnist_small, tmp_path / backend, method="mgda", grad_backend=backend, **TRAJECTORY)
        states[backend] = final_state(tmp_path / backend)
    moved = max(float((states["loop"][k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-3  # the runs did move
    for backend, state in states.items():
        for key in state:
            torch.testing.assert_close(state[key], states["loop"][key], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, b=backend, k=key: f"{b}/{k}: {m}")


def test_autojac_is_refused_on_a_model_with_task_specific_trunk_parameters(multimnist_small: Path, tmp_path: Path,
                                                                           monkeypatch) -> None:
    # like SegNet-MTAN's attention masks: TorchJD's mtl_backward splits the graph at the shared features, which
    # such parameters bypass; the other Jacobian backends differentiate the losses directly and are accepted
    from mtlflow.engine.trainer import Trainer

    bench, data = jobs.load_prepared(multimnist_small)
    make_model = bench.make_model

    def with_task_trunk_parameter(names=None):
        model = make_model(names)
        first = next(model.trunk.parameters())
        model.trunk_task_parameters = lambda index: [first] if index == 0 else []
        return model

    monkeypatch.setattr(bench, "make_model", with_task_trunk_parameter)
    with pytest.raises(InvalidParameterError) as error:
        Trainer(bench, data, RunConfig(method="mgda", grad_backend="autojac"), tmp_path / "a", progress=False)
    assert str(error.value) == ("grad_backend 'autojac' needs every trunk parameter shared; multimnist's model has "
                                "task-specific parameters inside its trunk (attention masks); use --grad-backend "
                                "loop, batched or func")
    Trainer(bench, data, RunConfig(method="mgda", grad_backend="func"), tmp_path / "f", progress=False)


def test_representation_mode_trains_and_matches_mgdaub(multimnist_small: Path, tmp_path: Path) -> None:
    # MGDA with grad_wrt=representation is MGDA-UB: identical runs
    jobs.train(multimnist_small, tmp_path / "ub", method="mgdaub", **TRAJECTORY)
    jobs.train(multimnist_small, tmp_path / "rep", method="mgda", grad_wrt="representation", **TRAJECTORY)
    a, b = final_state(tmp_path / "ub"), final_state(tmp_path / "rep")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    metrics = jobs.read_run(tmp_path / "ub")["metrics"]["epochs"][-1]
    assert metrics["engine_seconds_median"] > 0 and metrics["solver_seconds_median"] > 0
    assert all(torch.isfinite(v).all() for v in a.values())


class CountingMinNorm(GramianWeighting):
    """A test-only Gramian method that counts its solves and declares ``update_weights_every``."""

    name = "counting-min-norm"
    family = "gradient-manipulation"
    cost = "O(K)"
    paper = "test"
    natural_scale = "mean"
    hparams = {"update_weights_every": UPDATE_WEIGHTS_EVERY}
    solves = 0

    def weights_from_gramian(self, gramian: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        type(self).solves += 1
        return min_norm_weights_qp(gramian)


class NeedsJacobian(GradientMethod):
    name = "needs-jacobian"
    family = "gradient-manipulation"
    cost = "O(K)"
    paper = "test"

    def combine(self, grads: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        return grads.sum(0)


@pytest.fixture
def test_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    builtins = {**method_registry.REGISTRY.builtins(), CountingMinNorm.name: CountingMinNorm,
                NeedsJacobian.name: NeedsJacobian}
    monkeypatch.setattr(method_registry.REGISTRY, "_builtins", builtins)
    CountingMinNorm.solves = 0


def test_amortised_steps_reuse_weights_and_skip_the_jacobian(test_methods: Any, multimnist_small: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mtlflow.engine.trainer import Trainer

    jacobians = []
    original = LoopBackend.differentiate

    def counting(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        jacobians.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LoopBackend, "differentiate", counting)
    weights_seen: list[torch.Tensor] = []
    step = Trainer.train_step

    def recording(self, batch: Any, epoch: int) -> dict[str, Any]:
        info = step(self, batch, epoch)
        weights_seen.append(info["weights"])
        return info

    monkeypatch.setattr(Trainer, "train_step", recording)
    opts = dict(method="counting-min-norm", hparams={"update_weights_every": 3}, batch_size=32,
                max_steps_per_epoch=4, progress=False)
    jobs.train(multimnist_small, tmp_path / "A", epochs=2, **opts)  # 8 steps: solves at steps 0, 3, 6
    assert CountingMinNorm.solves == 3 and len(jacobians) == 3
    for reused in (1, 2, 4, 5, 7):
        assert torch.equal(weights_seen[reused], weights_seen[(reused // 3) * 3])
    assert not torch.equal(weights_seen[0], weights_seen[3])
    metrics = jobs.read_run(tmp_path / "A")["metrics"]["epochs"]
    assert [e["weight_solves"] for e in metrics] == [2, 1]
    # the reused weights are checkpointed: a resume across the epoch boundary (step 4 reuses step 3's
    # weights) ends bit-identical to the uninterrupted run
    jobs.train(multimnist_small, tmp_path / "B", epochs=1, **opts)
    jobs.train(multimnist_small, tmp_path / "B", epochs=2, resume=True, **opts)
    a, b = final_state(tmp_path / "A"), final_state(tmp_path / "B")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_reuse_step_back_propagates_the_reused_weights(test_methods: Any, multimnist_small: Path,
                                                      tmp_path: Path) -> None:
    # on a reuse step the shared gradient is K Σ w_i ∇L_i with the stored w, heads keep ∇L_i
    bench, data = jobs.load_prepared(multimnist_small)
    from mtlflow.engine.trainer import Trainer

    config = RunConfig(method="counting-min-norm", hparams={"update_weights_every": 2}, batch_size=16)
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    batch = next(iter(trainer._loader(1)))
    trainer.train_step(batch, 1)
    w = trainer.reused_weights.clone()
    trainer.optimizer.step = lambda: None  # keep .grad and the parameters as they are after the update
    trainer.train_step(batch, 1)
    assert CountingMinNorm.solves == 1
    forward = trainer.forward_pass(batch)
    jac = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(l, trainer.shared, retain_graph=True)])
                       for l in forward.losses])
    shared = torch.cat([p.grad.reshape(-1) for p in trainer.shared])
    torch.testing.assert_close(shared, 2 * w.to(jac) @ jac, rtol=1e-4, atol=1e-6)
    for i, loss in enumerate(forward.losses):
        grads = torch.autograd.grad(loss, trainer.task_params[i], retain_graph=True)
        for p, g in zip(trainer.task_params[i], grads, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_backend_selection_errors(test_methods: Any) -> None:
    assert resolve_backend("auto") == "loop"
    with pytest.raises(UnknownNameError) as error:
        resolve_backend("vmap")
    assert str(error.value) == ("unknown gradient backend 'vmap'; valid gradient backends: auto, loop, batched, func, "
                                "autojac, autogram")
    with pytest.raises(InvalidParameterError, match="unknown gradient backend 'vmap'; valid gradient backends: auto"):
        RunConfig(method="mgda", grad_backend="vmap").validate()
    with pytest.raises(InvalidParameterError, match="computes only the Gramian but method 'needs-jacobian' needs"):
        RunConfig(method="needs-jacobian", grad_backend="autogram").validate()
    with pytest.raises(InvalidParameterError, match="grad_wrt 'representation' applies to Gramian-weighting methods"):
        RunConfig(method="needs-jacobian", grad_wrt="representation").validate()
    RunConfig(method="ls", grad_backend="autogram", grad_wrt="representation").validate()  # nothing per task
    with pytest.raises(InvalidParameterError, match="grad_wrt must be one of parameters, representation"):
        RunConfig(grad_wrt="features").validate()
    with pytest.raises(InvalidParameterError, match="update_weights_every=0 is invalid"):
        method_registry.build("counting-min-norm", 2, update_weights_every=0)


def test_cli_rejects_unknown_backend_before_preparing_data(tmp_path: Path) -> None:
    proc = run_cli("train", "--benchmark", "toy", "--method", "mgda", "--grad-backend", "vmap", "--out",
                   str(tmp_path / "run"), env={"MTLFLOW_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2
    assert stderr_lines(proc) == ["mtlflow: error: unknown gradient backend 'vmap'; valid gradient backends: "
                                  "auto, loop, batched, func, autojac, autogram"]
    assert not (tmp_path / "cache").exists()


def test_gradients_accumulate_into_existing_grads_and_skip_parameters_without_one():
    from mtlflow.grad_engine._flat import accumulate_grads

    first, second, third = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    first.grad = torch.tensor([1.0, 2.0])
    accumulate_grads([first, second, third], [torch.tensor([0.5, 0.5]), None, torch.tensor([3.0, 4.0])])
    assert torch.equal(first.grad, torch.tensor([1.5, 2.5]))  # added to the existing gradient
    assert second.grad is None  # no gradient: left alone, and the later parameters still get theirs
    assert torch.equal(third.grad, torch.tensor([3.0, 4.0]))


def test_the_loop_backend_without_shared_parameters_gives_an_empty_k_row_jacobian():
    from mtlflow.grad_engine.backends import ForwardPass, LoopBackend

    head = torch.nn.Parameter(torch.tensor([2.0]))
    losses = [(head * 3.0).sum(), (head ** 2).sum()]
    jac = LoopBackend().differentiate(ForwardPass(losses=losses, features=None), [], None, retain_graph=False)
    assert jac.shape == (2, 0)
