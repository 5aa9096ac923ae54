"""LDC-MTL: the discrepancy and penalty of Eq. 1, the normalisations of App. A.1, one backward pass for the
model and the router (Alg. 1), the double loop (Alg. 2), Table 5 defaults, training on MultiMNIST."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from method_helpers import small_model

from mtlflow import benchmarks, jobs, methods
from mtlflow.config.run import RunConfig
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.methods.base import StepContext
from mtlflow.methods.ldcmtl import LDCMTL, discrepancy, penalty

RUN = {"batch_size": 32, "max_steps_per_epoch": 3, "progress": False}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def vector_method(logits: list[float], **hp) -> LDCMTL:
    method = methods.build("ldcmtl", len(logits), router="vector", **hp)
    method.setup(SimpleNamespace(config=SimpleNamespace(seed=0, lr=1e-3, optimizer="adam"), model=None))
    with torch.no_grad():
        method.router.logits.copy_(torch.tensor(logits))
    return method


def context(losses: torch.Tensor, epoch: int = 1, step: int = 0) -> StepContext:
    return StepContext(step=step, epoch=epoch, losses=losses.detach(), recompute_losses=lambda: losses.detach())


@pytest.mark.parametrize("tau,form", [("sigma", "paper"), ("one", "paper"), ("sigma", "code")])
def test_objective_is_discrepancy_plus_penalty_with_its_closed_form_gradient(tau: str, form: str) -> None:
    logits, lam = [0.3, -0.2, 0.5], 0.07
    losses = torch.tensor([2.0, 0.4, 1.1], dtype=torch.float64, requires_grad=True)
    method = vector_method(logits, penalty=lam, tau=tau, form=form)
    c_f, c_g = (1.0, lam) if form == "paper" else (lam, 1.0)  # f + λg (Eq. 2) or g + λf (official code)
    method.before_backward(context(losses))
    value = method.objective(losses)

    sigma = np.exp(logits) / np.exp(logits).sum()
    t = sigma if tau == "sigma" else np.ones(3)
    l = losses.detach().numpy()
    gaps = t[:-1] * l[:-1] - t[1:] * l[1:]
    assert float(value.detach()) == pytest.approx(c_f * np.abs(gaps).sum() + c_g * (sigma * l).sum(), rel=1e-6)
    # ∂/∂l_i = c_f τ_i (sign(gap_i) − sign(gap_{i−1})) + c_g σ_i, with gap_0 = gap_K = 0
    signs = np.concatenate([[0.0], np.sign(gaps), [0.0]])
    expected = c_f * t * (signs[1:] - signs[:-1]) + c_g * sigma
    (grad,) = torch.autograd.grad(value, losses)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(method.last_weights.numpy(), sigma, rtol=1e-6)


def test_the_objective_smooths_the_discrepancy_by_its_smooth_abs() -> None:
    logits, lam, smooth = [0.3, -0.2, 0.5], 0.07, 0.01
    losses = torch.tensor([2.0, 0.4, 1.1], dtype=torch.float64)
    method = vector_method(logits, penalty=lam, tau="sigma", form="paper", smooth_abs=smooth)
    method.before_backward(context(losses))
    sigma = np.exp(logits) / np.exp(logits).sum()
    l = losses.numpy()
    gaps = sigma[:-1] * l[:-1] - sigma[1:] * l[1:]
    expected = np.sqrt(gaps ** 2 + smooth).sum() + lam * (sigma * l).sum()   # f + λ g with |x| ~ √(x² + ε)
    assert float(method.objective(losses).detach()) == pytest.approx(expected, rel=1e-6)


def test_discrepancy_uses_consecutive_pairs_and_the_smoothed_absolute_value() -> None:
    values, tau = torch.tensor([1.0, 3.0, 0.5, 0.5]), torch.tensor([0.5, 0.25, 1.0, 2.0])
    # weighted: 0.5, 0.75, 0.5, 1.0 -> gaps -0.25, 0.25, -0.5
    assert float(discrepancy(values, tau)) == pytest.approx(1.0)
    smooth = float(discrepancy(values, tau, smooth_abs=0.01))
    assert smooth == pytest.approx(2 * (0.0625 + 0.01) ** 0.5 + (0.25 + 0.01) ** 0.5)
    assert float(penalty(values, tau)) == pytest.approx(0.5 + 0.75 + 0.5 + 1.0)
    assert float(discrepancy(torch.tensor([4.0]), torch.tensor([1.0]))) == 0.0  # one task: nothing to balance


def test_log_reference_is_renewed_every_epoch_and_rescale_keeps_the_first_step() -> None:
    log = vector_method([0.0, 0.0], normalization="log")
    rescale = vector_method([0.0, 0.0], normalization="rescale")
    references = []
    for epoch, losses in ((1, [2.0, 4.0]), (1, [1.0, 1.0]), (2, [0.5, 0.8]), (2, [0.25, 0.4])):
        current = torch.tensor(losses, dtype=torch.float64)
        for m in (log, rescale):
            m.before_backward(context(current, epoch=epoch))
        references.append((log.reference_losses.tolist(), log.reference_epoch, rescale.reference_losses.tolist()))
    # l_{i,0} of log: the first step of each epoch; l'_i of rescale: the first step of the run
    assert references == [([2.0, 4.0], 1, [2.0, 4.0]), ([2.0, 4.0], 1, [2.0, 4.0]),
                          ([0.5, 0.8], 2, [2.0, 4.0]), ([0.5, 0.8], 2, [2.0, 4.0])]
    probe = torch.tensor([1.0, 2.0], dtype=torch.float64)
    np.testing.assert_allclose(log._normalized(probe).numpy(), np.log([1 / 0.5, 2 / 0.8]), rtol=1e-6)
    np.testing.assert_allclose(rescale._normalized(probe).numpy(), [0.5, 0.5], rtol=1e-6)
    with pytest.raises(InvalidParameterError) as error:
        log._normalized(torch.tensor([1 / 3, -1.0], dtype=torch.float64))
    assert str(error.value) == ("ldcmtl: normalization=log needs losses above their lower bounds, got "
                                "[0.333333, -1.0] with min_losses [0.0, 0.0]; set --hp min_losses=[...] or "
                                "normalization=none")


def test_bad_hyper_parameters_are_rejected() -> None:
    for bad in ({"router": "attention"}, {"tau": "two"}, {"penalty": 0.0}, {"normalization": "sqrt"},
                {"loop": "triple"}, {"min_losses": [0.0]}):
        with pytest.raises(InvalidParameterError):
            methods.build("ldcmtl", 2, **bad)


@pytest.mark.parametrize("bounds,accepted", [({"sigma_min": 0.5}, True), ({"sigma_max": 0.5}, True),
                                             ({"sigma_min": 0.5, "sigma_max": 0.5}, False),
                                             ({"sigma_min": 0.51}, False), ({"sigma_max": 0.49}, False)])
def test_sigma_bounds_are_accepted_when_weights_of_1_over_k_fit_them(bounds: dict, accepted: bool) -> None:
    """With K = 2, σ = (½, ½) must lie within [sigma_min, sigma_max] (bounds at exactly ½ are fine) and the
    bounds must leave an interval (sigma_min < sigma_max)."""
    if accepted:
        methods.build("ldcmtl", 2, **bounds)
        return
    hp = {"sigma_min": 0.0, "sigma_max": 1.0, **bounds}
    with pytest.raises(InvalidParameterError) as error:
        methods.build("ldcmtl", 2, **bounds)
    assert str(error.value) == (f"ldcmtl: sigma_min={hp['sigma_min']} and sigma_max={hp['sigma_max']} leave no "
                                "weights summing to 1 for 2 tasks; use sigma_min <= 1/2 <= sigma_max")


@pytest.mark.parametrize("normalization,loss_reference,renewed", [("log", "auto", True), ("rescale", "auto", False),
                                                                  ("rescale", "epoch", True), ("log", "run", False)])
def test_an_explicit_loss_reference_overrides_the_normalizations_own(normalization: str, loss_reference: str,
                                                                     renewed: bool) -> None:
    method = vector_method([0.0, 0.0], normalization=normalization, loss_reference=loss_reference)
    for epoch, losses in ((1, [2.0, 4.0]), (2, [0.5, 0.8])):
        method.before_backward(context(torch.tensor(losses, dtype=torch.float64), epoch=epoch))
    assert method.reference_losses.tolist() == ([0.5, 0.8] if renewed else [2.0, 4.0])


@pytest.mark.parametrize("in_features,widths", [(12, [6, 3]), (3, [1, 1]), (1, [1, 1])])
def test_the_mlp_router_is_d_to_d_over_2_to_d_over_4_to_k_with_relus(in_features: int, widths: list[int]) -> None:
    """σ(W)(x) written out from the router's own weights: softmax(W3 relu(W2 relu(W1 x + b1) + b2) + b3) per
    sample, averaged over the batch; the hidden widths d/2 and d/4 are at least 1."""
    from mtlflow.methods.ldcmtl import Router

    torch.manual_seed(0)
    router = Router(3, "mlp", in_features, bias=True).double()
    layers = [module for module in router.mlp if isinstance(module, torch.nn.Linear)]
    assert [layer.out_features for layer in layers] == [*widths, 3]
    x = torch.randn(5, in_features, dtype=torch.float64)
    hidden = x
    for i, layer in enumerate(layers):
        hidden = hidden @ layer.weight.T + layer.bias
        if i < 2:
            hidden = hidden.clamp_min(0.0)
    expected = torch.softmax(hidden, dim=1).mean(dim=0)
    with torch.no_grad():
        torch.testing.assert_close(router(x), expected, rtol=1e-12, atol=1e-12)


class CallCounter:
    """Counts calls of ``torch.autograd.backward`` (what ``Tensor.backward`` calls) and ``torch.autograd.grad``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.backward = self.grad = 0
        real_backward, real_grad = torch.autograd.backward, torch.autograd.grad

        def backward(*args, **kwargs):
            self.backward += 1
            return real_backward(*args, **kwargs)

        def grad(*args, **kwargs):
            self.grad += 1
            return real_grad(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, "backward", backward)
        monkeypatch.setattr(torch.autograd, "grad", grad)


def trainer_for(data_dir: Path, tmp_path: Path, **hp):
    from mtlflow.config.run import RunConfig
    from mtlflow.engine.trainer import Trainer

    bench, data = jobs.load_prepared(data_dir)
    config = RunConfig(method="ldcmtl", hparams=hp, batch_size=32, seed=0)
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    batch = next(iter(trainer._loader(1)))
    return trainer, batch


def manual_gradients(trainer, batch, method: LDCMTL, snapshot_model: dict, snapshot_router: dict):
    """∇ of f + λ g w.r.t. (model, router) at the snapshot, written out from the formulas."""
    model = trainer.model
    model.load_state_dict(snapshot_model)
    method.router.load_state_dict(snapshot_router)
    forward = trainer.forward_pass(batch)
    losses = forward.stacked
    sigma = method.router(forward.features.detach())
    tau = sigma if method.hp["tau"] == "sigma" else torch.ones_like(sigma)
    value = discrepancy(losses, tau) + method.hp["penalty"] * penalty(losses, sigma)
    params = [p for p in model.parameters()] + list(method.router.parameters())
    return torch.autograd.grad(value, params)


def test_one_backward_pass_gives_model_and_router_the_bilevel_gradient(multimnist_small: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    trainer, batch = trainer_for(multimnist_small, tmp_path, router="mlp", penalty=0.1)
    method: LDCMTL = trainer.method
    trainer.train_step(batch, epoch=1)  # builds the MLP router from the feature width (128 -> 64 -> 32 -> 2)
    assert [m.weight.shape for m in method.router.mlp if isinstance(m, torch.nn.Linear)] == [
        (64, 128), (32, 64), (2, 32)]
    model_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    router_before = {k: v.clone() for k, v in method.router.state_dict().items()}

    counter = CallCounter(monkeypatch)
    trainer.train_step(batch, epoch=1)
    assert (counter.backward, counter.grad) == (1, 0)  # Alg. 1: one gradient computation for x and W

    got = [p.grad.clone() for p in trainer.model.parameters()] + [p.grad.clone() for p in method.router.parameters()]
    router_after = {k: v.clone() for k, v in method.router.state_dict().items()}
    monkeypatch.undo()
    expected = manual_gradients(trainer, batch, method, model_before, router_before)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(router_before[k], router_after[k]) for k in router_before)  # the router stepped


def test_double_loop_adds_only_the_router_correction(multimnist_small: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    single, batch = trainer_for(multimnist_small, tmp_path / "a", router="vector", penalty=0.5)
    double, _ = trainer_for(multimnist_small, tmp_path / "b", router="vector", penalty=0.5, loop="double",
                            inner_steps=3, inner_lr=1e-9)
    single.train_step(batch, epoch=1)
    with torch.no_grad():
        losses = double.forward_pass(batch).stacked
    counter = CallCounter(monkeypatch)
    double.train_step(batch, epoch=1)
    assert (counter.backward, counter.grad) == (1, 3)  # N inner gradient steps, then the one joint backward
    monkeypatch.undo()
    for a, b in zip(single.model.parameters(), double.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)  # x's update is Alg. 1's
    # with z_N = x (β -> 0) the correction −λ∇_W g(W, z_N) cancels λ∇_W g(W, x): only ∇_W f is left
    logits = torch.zeros(2, requires_grad=True)
    sigma = torch.softmax(logits, 0)
    (expected,) = torch.autograd.grad(discrepancy(losses, sigma), logits)
    torch.testing.assert_close(double.method.router.logits.grad, expected, rtol=1e-4, atol=1e-7)


def test_double_loop_inner_steps_are_gradient_descent_on_the_penalty_from_the_model(multimnist_small: Path,
                                                                                      tmp_path: Path) -> None:
    """Alg. 2's z_N: N steps z <- z - beta grad_z g(W, z) from z_0 = x, against torch's SGD on the model itself."""
    trainer, batch = trainer_for(multimnist_small, tmp_path, router="vector", penalty=0.5, loop="double",
                                 inner_steps=3, inner_lr=0.05, normalization="none")
    method: LDCMTL = trainer.method
    with torch.no_grad():
        start = trainer.forward_pass(batch).stacked
    method.before_backward(StepContext(step=0, epoch=1, losses=start, recompute_losses=lambda: start,
                                       extra={"batch": batch}))
    sigma = torch.softmax(method.router.logits.detach(), 0)
    optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        penalty(trainer.forward_pass(batch).stacked, sigma).backward()
        optimizer.step()
    with torch.no_grad():
        expected = trainer.forward_pass(batch).stacked
    torch.testing.assert_close(method._inner_losses, expected, rtol=1e-4, atol=1e-6)
    assert float(penalty(expected, sigma)) < float(penalty(start, sigma)) - 1e-3  # the steps went downhill


def test_table5_defaults_come_from_the_benchmarks() -> None:
    expected = {"celeba": (0.01, "sigma", "none", "vector"), "qm9": (0.05, "sigma", "log", "vector"),
                "cityscapes": (0.1, "one", "none", "mlp"), "nyuv2": (0.05, "one", "none", "mlp")}
    for name, (lam, tau, norm, router) in expected.items():
        hp = benchmarks.build(name).method_defaults("ldcmtl")
        assert (hp["penalty"], hp["tau"], hp["normalization"], hp["router"]) == (lam, tau, norm, router), name
        assert hp["form"] == "code"  # Table 5's λ is the discrepancy's coefficient in the authors' code
        methods.build("ldcmtl", 2, **hp)
    assert benchmarks.build("nyuv2").method_defaults("ldcmtl")["router_bias"] is False
    assert benchmarks.build("toy").method_defaults("ldcmtl")["normalization"] == "rescale"


def test_trains_on_multimnist_and_learns_router_weights(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = jobs.train(multimnist_small, run, method="ldcmtl", hparams={"normalization": "rescale"}, epochs=2,
                        **RUN)
    metrics = json.loads((run / "metrics.json").read_text())
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    first, last = metrics["epochs"][0]["train_loss"], metrics["epochs"][-1]["train_loss"]
    assert sum(last.values()) < sum(first.values())
    weights = metrics["epochs"][-1]["method_weights_mean"]
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-6) and weights["left"] != 0.5
    assert all(0.0 <= v["acc"] <= 1.0 for v in result["final"]["test"].values())


def test_bench_reports_the_ratio_to_ls_against_the_papers_claim(tmp_path: Path) -> None:
    from mtlflow.experiments.bench import run_bench

    summary = run_bench(tmp_path, ["ldcmtl"], task_counts=[3], steps=2, warmup=1, batch_size=4, width=2,
                        image_size=16, engine_rows=(), progress=False, hparams={"ldcmtl": {"router": "vector"}})
    row = next(r for r in summary["methods"] if r["method"] == "ldcmtl")
    assert row["status"] == "ok" and row["ratio_to_ls"] > 0
    check = next(t for t in summary["targets"] if t["target"].startswith("paper"))
    assert check["target"] == "paper: step <= 1.11x LS" and check["value"] == row["ratio_to_ls"]


@pytest.mark.parametrize("decay", [0.0, 0.1])
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
def test_router_step_is_sgd_on_the_objective_with_the_models_weight_decay(optimizer: str, decay: float) -> None:
    """One router step through the production path (objective -> backward -> after_optimizer_step) moves
    the logits by exactly what the hand-derived gradient of Eq. 2 predicts, with the model's optimizer kind
    and weight decay (0 in the paper's recipes: never torch's AdamW default of 0.01; 0.1 tells AdamW's
    decoupled decay from Adam's and SGD's L2 term)."""
    logits, lam, lr = [0.3, -0.2, 0.5], 0.07, 0.1
    method = methods.build("ldcmtl", 3, router="vector", penalty=lam, tau="sigma", form="paper")
    config = SimpleNamespace(seed=0, lr=lr, optimizer=optimizer, momentum=0.9, weight_decay=decay)
    method.setup(SimpleNamespace(config=config, model=None))
    with torch.no_grad():
        method.router.logits.copy_(torch.tensor(logits))
    assert all(g["weight_decay"] == decay for g in method.router_optimizer.param_groups)
    losses = torch.tensor([2.0, 0.4, 1.1])
    method.before_backward(context(losses))
    method.objective(losses).backward()
    method.after_optimizer_step(context(losses))

    # ∂/∂logits of Σ|σ_i l_i − σ_{i+1} l_{i+1}| + λ Σ σ_i l_i via the softmax Jacobian diag(σ) − σσᵀ
    w = np.array(logits)
    sigma = np.exp(w) / np.exp(w).sum()
    l = losses.numpy().astype(np.float64)
    signs = np.concatenate([[0.0], np.sign(sigma[:-1] * l[:-1] - sigma[1:] * l[1:]), [0.0]])
    d_sigma = l * (signs[1:] - signs[:-1]) + lam * l
    grad = (np.diag(sigma) - np.outer(sigma, sigma)) @ d_sigma
    # first step: SGD moves lr·g and Adam lr·g/(|g| + eps) (bias-corrected moments), both with the L2 term
    # g + decay·w; AdamW takes lr·g/(|g| + eps) from the decayed w·(1 − lr·decay)
    if optimizer == "sgd":
        expected = w - lr * (grad + decay * w)
    elif optimizer == "adam":
        coupled = grad + decay * w
        expected = w - lr * coupled / (np.abs(coupled) + 1e-8)
    else:
        expected = w * (1 - lr * decay) - lr * grad / (np.abs(grad) + 1e-8)
    np.testing.assert_allclose(method.router.logits.detach().numpy(), expected, rtol=1e-5, atol=1e-7)


def mlp_method(seed: int, **hp) -> LDCMTL:
    method = methods.build("ldcmtl", 2, router="mlp", penalty=0.5, **hp)
    method.setup(SimpleNamespace(config=SimpleNamespace(seed=seed, lr=0.01, optimizer="adam"), model=None))
    return method


def router_step(method: LDCMTL, features: torch.Tensor, losses: torch.Tensor, step: int) -> None:
    ctx = StepContext(step=step, epoch=1, losses=losses, recompute_losses=lambda: losses,
                      extra={"features": features})
    method.before_backward(ctx)
    method.objective(losses).backward()
    method.after_optimizer_step(ctx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mlp_router_restored_into_a_fresh_method_continues_exactly(dtype: torch.dtype) -> None:
    """A resumed run's method has no router yet (the MLP is built from the first batch's feature width):
    load_state_dict rebuilds it at the saved width and type, with the saved weights, Adam moments and the
    rescale reference (the first step's losses), so the next step is the one the uninterrupted run takes."""
    features = torch.randn(4, 12, generator=torch.Generator().manual_seed(0), dtype=dtype)

    def losses_at(step: int) -> torch.Tensor:
        return torch.tensor([0.9, 0.3], dtype=dtype) * (1 + 0.5 * step)

    original = mlp_method(seed=0, normalization="rescale")
    for step in range(2):
        router_step(original, features, losses_at(step), step)
    resumed = mlp_method(seed=1, normalization="rescale")  # another seed: its own router would start elsewhere
    assert resumed.router is None
    checkpoint = io.BytesIO()  # as checkpoint.pt: the live optimizer state is not shared with the resumed run
    torch.save(original.state_dict(), checkpoint)
    checkpoint.seek(0)
    resumed.load_state_dict(torch.load(checkpoint, weights_only=False))
    assert resumed.router.in_features == 12
    assert {p.dtype for p in resumed.router.parameters()} == {dtype}
    assert torch.equal(resumed.reference_losses, losses_at(0))
    router_step(original, features, losses_at(2), 2)
    router_step(resumed, features, losses_at(2), 2)
    for (name, a), b in zip(original.router.state_dict().items(), resumed.router.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_mlp_router_starts_from_the_run_seed_alone() -> None:
    """The MLP router is drawn from a private generator seeded by the run seed: the same seed gives the same
    router whatever the global generator's state (which it leaves as it was), and seed replicates start from
    different routers."""
    features, losses = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.3])

    def initial_router(seed: int, global_seed: int) -> dict[str, torch.Tensor]:
        method = mlp_method(seed)
        torch.manual_seed(global_seed)
        method.before_backward(StepContext(step=0, epoch=1, losses=losses, recompute_losses=lambda: losses,
                                           extra={"features": features}))
        assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(global_seed)))
        return method.router.state_dict()

    routers = [initial_router(seed, global_seed=seed + 100) for seed in range(4)]
    again = initial_router(0, global_seed=7)
    assert all(torch.equal(again[k], routers[0][k]) for k in again)
    for i in range(4):
        for j in range(i):
            assert not torch.equal(routers[i]["mlp.0.weight"], routers[j]["mlp.0.weight"]), (i, j)


@pytest.mark.parametrize("name,paper_count", [("cityscapes", 10_402), ("nyuv2", 23_184)])
def test_mlp_router_on_the_shipped_mtan_models_has_the_papers_parameter_count(name: str, paper_count: int) -> None:
    """App. A.1: the MLP router has 10,402 (CityScapes) / 23,184 (NYU-v2) parameters; built by the
    production path from the shipped SegNet-MTAN's features (the K task features side by side)."""
    bench = benchmarks.build(name)
    torch.manual_seed(0)
    model = bench.make_model()
    hp = bench.method_defaults("ldcmtl")
    method = methods.build("ldcmtl", len(bench.task_names), **hp)
    method.setup(SimpleNamespace(config=SimpleNamespace(seed=0, lr=1e-4, optimizer="adam"), model=model))
    with torch.no_grad():
        features = model.features(torch.randn(1, 3, 32, 32))
    losses = torch.ones(len(bench.task_names))
    method.before_backward(StepContext(step=0, epoch=1, losses=losses, recompute_losses=lambda: losses,
                                       extra={"features": features}))
    assert sum(p.numel() for p in method.router.parameters()) == paper_count
    assert method.router.in_features == 64 * len(bench.task_names)


def test_sigma_clamp_bounds_the_weights_and_stops_their_gradient_at_the_bound() -> None:
    method = vector_method([3.0, -3.0], sigma_min=0.2, sigma_max=0.8)
    losses = torch.tensor([1.0, 2.0], requires_grad=True)
    method.before_backward(context(losses))
    method.objective(losses).backward()
    sigma = np.exp([3.0, -3.0]) / np.exp([3.0, -3.0]).sum()  # 0.9975 / 0.0025: both outside the bounds
    assert sigma[0] > 0.8 and sigma[1] < 0.2
    np.testing.assert_allclose(method.last_weights.numpy(), [0.8, 0.2])
    assert float(method.router.logits.grad.abs().max()) == 0.0  # both clamped: no push towards collapse
    with pytest.raises(InvalidParameterError, match="sigma_min"):
        methods.build("ldcmtl", 3, sigma_min=0.4)
    for bounds, expected in (({"sigma_min": 0.2}, [sigma[0], 0.2]), ({"sigma_max": 0.8}, [0.8, sigma[1]])):
        one_sided = vector_method([3.0, -3.0], **bounds)   # either bound alone clamps too
        one_sided.before_backward(context(losses))
        one_sided.objective(losses)
        np.testing.assert_allclose(one_sided.last_weights.numpy(), expected, rtol=1e-6)


def test_the_mlp_router_averages_each_samples_softmax_over_the_batch() -> None:
    """σ(W) of the MLP router: the softmax over the K tasks of each sample's output, averaged over the batch
    (so it sums to 1), i.e. the mean of the routers of the single samples."""
    from mtlflow.methods.ldcmtl import Router

    torch.manual_seed(0)
    router = Router(3, "mlp", 6, bias=True)
    features = torch.randn(5, 6)
    sigma = router(features).detach()
    assert sigma.shape == (3,) and float(sigma.sum()) == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(sigma, torch.stack([router(features[i:i + 1]).detach() for i in range(5)]).mean(dim=0))


def test_table5_step_sizes_are_the_ldcmtl_training_defaults() -> None:
    """Table 5's step size α is the learning rate LDC-MTL trains with by default on each benchmark (the
    user's --lr still wins, and the other methods keep the benchmark's recipe)."""
    table5 = {"celeba": 1e-3, "qm9": 1e-3, "cityscapes": 3e-4, "nyuv2": 8e-5}
    for name, step in table5.items():
        bench = benchmarks.build(name)
        assert RunConfig.for_benchmark(bench.train_defaults, method="ldcmtl").lr == step, name
        assert RunConfig.for_benchmark(bench.train_defaults, method="ldcmtl", lr=0.5).lr == 0.5
        assert RunConfig.for_benchmark(bench.train_defaults, method="ls").lr == bench.train_defaults["lr"]


def test_the_router_reads_stacked_task_features_concatenated_or_averaged():
    from mtlflow.methods.ldcmtl import batch_features_reader
    from mtlflow.models.base import MultiTaskModel

    class StackedPerTask(MultiTaskModel):  # a model whose features are [K, B, C] (multi-input, MTAN)
        def forward_heads(self, z):
            return list(z)

    model = object.__new__(StackedPerTask)  # the reader only looks at the model's class
    z = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4)  # K = 2 tasks, B = 3, C = 4
    assert torch.equal(batch_features_reader(model, "mean")(z), (z[0] + z[1]) / 2)
    # concat: row b is task 0's channels of sample b, then task 1's
    assert torch.equal(batch_features_reader(model, "concat")(z), torch.cat([z[0], z[1]], dim=1))
    plain = object.__new__(MultiTaskModel)
    assert batch_features_reader(plain, "mean")(z) is z


def test_the_mlp_router_reads_features_with_their_spatial_dimensions_averaged():
    from mtlflow.methods.ldcmtl import router_input

    gen = torch.Generator().manual_seed(0)
    images, sequences, flat = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                               for shape in ((2, 3, 4, 5), (2, 3, 6), (2, 3)))
    torch.testing.assert_close(router_input(images), images.mean(dim=(2, 3)))      # [B, C, H, W] -> [B, C]
    torch.testing.assert_close(router_input(sequences), sequences.mean(dim=2))     # [B, C, L] -> [B, C]
    assert torch.equal(router_input(flat), flat)
    for features in (torch.ones(3), (images,)):   # a vector, and features that are not one tensor
        with pytest.raises(InvalidParameterError) as error:
            router_input(features)
        assert str(error.value) == ("ldcmtl: router=mlp needs shared features of shape [B, d] or [B, C, ...] "
                                    "(this model's features are not); use --hp router=vector")


def test_a_checkpoint_written_before_the_mlp_router_exists_restores_a_method_that_builds_it_later():
    """A run stopped before its first step: the MLP router (built from the first batch's width), its optimizer
    and the loss reference do not exist yet; the checkpoint says so and the restored method builds them later."""
    fresh = mlp_method(seed=0, normalization="rescale")
    state = fresh.state_dict()
    assert (state["router"], state["optimizer"], state["reference_losses"]) == (None, None, None)
    checkpoint = io.BytesIO()
    torch.save(state, checkpoint)
    checkpoint.seek(0)
    resumed = mlp_method(seed=0, normalization="rescale")
    resumed.load_state_dict(torch.load(checkpoint, weights_only=False))
    assert resumed.router is None and resumed.reference_losses is None
    features, losses = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.3])
    router_step(fresh, features, losses, 0)
    router_step(resumed, features, losses, 0)
    for (name, a), b in zip(fresh.router.state_dict().items(), resumed.router.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("router_lr", [None, 0.05])
def test_the_router_steps_with_the_models_current_learning_rate_unless_given_its_own(router_lr):
    """router_lr=None: the router's step size follows the model optimizer's current rate (a scheduler's too)."""
    method = mlp_method(seed=0, router_lr=router_lr)
    features, losses = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.3])
    router_step(method, features, losses, 0)
    method._trainer.optimizer = SimpleNamespace(param_groups=[{"lr": 0.003}])   # the scheduler lowered it
    router_step(method, features, losses, 1)
    assert [group["lr"] for group in method.router_optimizer.param_groups] == [router_lr or 0.003]


def test_without_a_trainer_the_router_steps_with_adam_at_1e_3():
    """A bare loss weighting (no trainer, so no model learning rate to follow) builds Adam at 1e-3."""
    method = methods.build("ldcmtl", 2)
    method.before_backward(context(torch.tensor([0.9, 0.3])))
    assert type(method.router_optimizer) is torch.optim.Adam
    assert [(group["lr"], group["weight_decay"]) for group in method.router_optimizer.param_groups] == [(1e-3, 0.0)]


@pytest.mark.parametrize("router_lr", [None, 0.05])
def test_an_sgd_router_takes_the_runs_momentum_and_its_own_or_the_models_rate(router_lr):
    method = methods.build("ldcmtl", 2, router_lr=router_lr)
    method.setup(SimpleNamespace(config=SimpleNamespace(seed=0, lr=0.1, optimizer="sgd", momentum=0.5,
                                                        weight_decay=0.0), model=None))
    assert type(method.router_optimizer) is torch.optim.SGD
    assert [(group["lr"], group["momentum"]) for group in method.router_optimizer.param_groups] == [
        (router_lr or 0.1, 0.5)]


def test_without_normalization_no_loss_reference_is_kept():
    method = vector_method([0.0, 0.0])
    method.before_backward(context(torch.tensor([0.9, 0.3])))
    assert method.reference_losses is None and method.state_dict()["reference_losses"] is None


def test_a_model_with_its_own_batch_features_is_read_through_them():
    """NORMAL's model names its router features itself (the mean ODE state): the reader is that method."""
    from mtlflow.methods.ldcmtl import batch_features_reader
    from mtlflow.models.base import MultiTaskModel

    class OwnFeatures(MultiTaskModel):
        def forward_heads(self, z):
            return list(z)

        def batch_features(self, z):
            return z.sum(dim=0)

    model = object.__new__(OwnFeatures)
    z = torch.arange(6.0).reshape(2, 3)
    for stacked in ("concat", "mean"):
        assert torch.equal(batch_features_reader(model, stacked)(z), torch.tensor([3.0, 5.0, 7.0]))


@pytest.mark.parametrize("router_features,width", [("concat", 8), ("mean", 4)])
def test_setup_reads_stacked_task_features_as_router_features_asks(router_features: str, width: int):
    """Through setup and the first step: K = 2 task features of C = 4 channels give the MLP router 8 inputs
    side by side or 4 averaged."""
    from mtlflow.models.base import MultiTaskModel

    class StackedPerTask(MultiTaskModel):  # a model whose features are [K, B, C] (multi-input, MTAN)
        def forward_heads(self, z):
            return list(z)

    method = methods.build("ldcmtl", 2, router="mlp", router_features=router_features)
    method.setup(SimpleNamespace(config=SimpleNamespace(seed=0, lr=0.01, optimizer="adam"),
                                 model=object.__new__(StackedPerTask)))
    losses = torch.tensor([0.9, 0.3])
    method.before_backward(StepContext(step=0, epoch=1, losses=losses, recompute_losses=lambda: losses,
                                       extra={"features": torch.randn(2, 3, 4)}))
    assert method.router.in_features == width


def test_the_router_optimizer_keeps_its_state_across_steps_and_skips_a_step_without_a_router_gradient():
    """Adam's moments carry over from step to step (one optimizer for the run), and a step whose objective
    was never backpropagated (the trainer skipped it) leaves the router where it was, moments or not."""
    method = vector_method([0.2, -0.1])
    losses = torch.tensor([0.9, 0.3])
    for step in range(2):
        ctx = context(losses, step=step)
        method.before_backward(ctx)
        method.objective(losses).backward()
        method.after_optimizer_step(ctx)
    (logits,) = method.router.parameters()
    assert method.router_optimizer.state[logits]["step"] == 2
    before = logits.detach().clone()
    skipped = context(losses, step=2)
    method.before_backward(skipped)
    method.after_optimizer_step(skipped)
    assert torch.equal(logits.detach(), before) and method.router_optimizer.state[logits]["step"] == 2


def test_the_router_gradient_is_averaged_over_ranks_under_a_process_group(tmp_path):
    """Under torchrun every rank takes the same router step: its gradients are all-reduced and divided by the
    world size. With one rank (a real gloo group) the step is the plain one."""
    import torch.distributed as dist

    features, losses = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.3])
    plain, grouped = mlp_method(seed=0), mlp_method(seed=0)
    router_step(plain, features, losses, 0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        router_step(grouped, features, losses, 0)
    finally:
        dist.destroy_process_group()
    for (name, a), b in zip(plain.router.state_dict().items(), grouped.router.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_router_refuses_an_objective_before_its_hook_and_a_non_finite_gradient_in_one_line():
    losses = torch.tensor([0.9, 0.3])
    with pytest.raises(InvalidParameterError) as error:
        mlp_method(seed=0).objective(losses)              # the MLP router is built by before_backward
    assert str(error.value) == "ldcmtl: objective called before before_backward; the trainer calls both"
    method = mlp_method(seed=0)
    features = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))
    ctx = StepContext(step=7, epoch=1, losses=losses, recompute_losses=lambda: losses, extra={"features": features})
    method.before_backward(ctx)
    method.objective(torch.tensor([float("inf"), 0.3], requires_grad=True)).backward()
    with pytest.raises(NonFiniteLossError) as error:
        method.after_optimizer_step(ctx)
    assert str(error.value) == "ldcmtl: non-finite router gradient at step 7; lower --lr"


def test_the_double_loop_refuses_a_step_without_the_trainers_batch_and_a_diverged_inner_loop(
        multimnist_small: Path, tmp_path: Path) -> None:
    losses = torch.tensor([0.9, 0.3], dtype=torch.float64)
    with pytest.raises(InvalidParameterError) as error:   # the toy runner hands no batch
        vector_method([0.0, 0.0], loop="double").before_backward(context(losses))
    assert str(error.value) == ("ldcmtl: loop=double needs the trainer's batch (mtlflow train); the toy runner "
                                "supports loop=single only")
    trainer, batch = trainer_for(multimnist_small, tmp_path, router="vector", loop="double", inner_steps=2,
                                 inner_lr=1e30)
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step(batch, epoch=1)
    assert str(error.value) == "ldcmtl: the inner loop diverged at step 0; lower --hp inner_lr"


def test_without_normalization_a_loss_at_its_lower_bound_enters_the_objective_as_it_is() -> None:
    # an unlabelled batch gives a segmentation loss of 0: normalization=none needs no positive loss
    logits, lam = [0.3, -0.2], 0.07
    losses = torch.tensor([1.0, 0.0], dtype=torch.float64)
    method = vector_method(logits, penalty=lam)
    method.before_backward(context(losses))
    sigma = np.exp(logits) / np.exp(logits).sum()
    expected = abs(sigma[0] * 1.0 - sigma[1] * 0.0) + lam * sigma[0] * 1.0   # f + λ g
    assert float(method.objective(losses).detach()) == pytest.approx(expected, rel=1e-6)


def test_log_normalization_refuses_a_loss_at_its_lower_bound() -> None:
    # log(0 / l_0) would be -inf (and 0 / 0 as the reference NaN): a loss equal to its bound is refused
    method = vector_method([0.0, 0.0], normalization="log")
    with pytest.raises(InvalidParameterError) as error:
        method.before_backward(context(torch.tensor([1.0, 0.0], dtype=torch.float64)))
    assert str(error.value) == ("ldcmtl: normalization=log needs losses above their lower bounds, got [1.0, 0.0] "
                                "with min_losses [0.0, 0.0]; set --hp min_losses=[...] or normalization=none")


def test_the_router_weights_are_given_in_the_losses_dtype() -> None:
    # the toy runner: a float32 vector router, float64 losses; σ is logged and returned in float64
    method = vector_method([0.3, -0.2, 0.5])
    losses = torch.tensor([2.0, 0.4, 1.1], dtype=torch.float64)
    method.before_backward(context(losses))
    method.objective(losses)
    expected = torch.softmax(torch.tensor([0.3, -0.2, 0.5]), dim=0).double()   # σ of the float32 logits
    torch.testing.assert_close(method.last_weights, expected)
    torch.testing.assert_close(method.weights(losses), expected)


def test_the_double_loop_steps_the_used_parameters_and_keeps_one_no_loss_reaches() -> None:
    """Alg. 2's z_N on a model with a trainable parameter outside every task's graph: it gets no inner gradient
    and stays; the others take N SGD steps on g, as torch's SGD on a copy of the model does."""
    model = small_model(2)
    model.spare = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))   # trainable, used by no loss
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    targets = [torch.randn(8, generator=gen, dtype=torch.float64) for _ in range(2)]

    def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((pred.squeeze(-1) - target) ** 2).mean()

    trainer = SimpleNamespace(model=model, bench=SimpleNamespace(unpack=lambda batch: batch), device="cpu",
                              tasks=[SimpleNamespace(loss=mse)] * 2, task_index=[0, 1],
                              config=SimpleNamespace(seed=0, lr=1e-3, optimizer="adam"))
    method = methods.build("ldcmtl", 2, router="vector", loop="double", inner_steps=3, inner_lr=0.05)
    method.setup(trainer)

    def losses_of(m: torch.nn.Module) -> torch.Tensor:
        return torch.stack([mse(p, t) for p, t in zip(m(x), targets, strict=True)])

    with torch.no_grad():
        start = losses_of(model)
    method.before_backward(StepContext(step=0, epoch=1, losses=start, recompute_losses=lambda: start,
                                       extra={"batch": (x, targets)}))
    clone = copy.deepcopy(model)
    optimizer = torch.optim.SGD(clone.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        penalty(losses_of(clone), torch.full((2,), 0.5, dtype=torch.float64)).backward()   # σ = softmax(0)
        optimizer.step()
    with torch.no_grad():
        expected = losses_of(clone)
    torch.testing.assert_close(method._inner_losses, expected, rtol=1e-12, atol=0)
    assert clone.spare.grad is None and torch.equal(model.spare, clone.spare)
