"""Library mode (`mtlflow.engine.library`): the `.grad` one call writes, checked against independent
computations in float64 -- per-task gradients by `torch.autograd.grad` and each method's rule written
out here (PCGrad's projections, MGDA's min-norm conditions, DWA's and FAMO's weights), TorchJD's
`mtl_backward` + `UPGrad()` for UPGrad, and the trainer's own step on the same model and batch --
plus accumulation, checkpoint round trips and the refusals."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from mtlflow import jobs, methods
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.engine import MTLBackward, mtl_backward
from mtlflow.engine.trainer import Trainer
from mtlflow.methods._support import MethodGenerator

K = 3
SEED = 7


class Problem:
    """A 2-layer trunk and K linear heads in float64, on targets chosen so that the task gradients
    conflict (tasks 0 and 1 want opposite outputs from the same head initialisation): the methods'
    weights are then far from uniform."""

    def __init__(self, init_seed: int = 0):
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(init_seed)
        self.trunk = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh()).double()
        self.heads = nn.ModuleList([nn.Linear(6, 1) for _ in range(K)]).double()
        with torch.no_grad():
            self.heads[1].load_state_dict(self.heads[0].state_dict())
        self.batches = []
        for _ in range(4):
            x = torch.randn(16, 5, dtype=torch.float64, generator=generator)
            base = torch.randn(16, dtype=torch.float64, generator=generator)
            y = torch.stack([3 * base, -3 * base, torch.randn(16, dtype=torch.float64, generator=generator)], 1)
            self.batches.append((x, y))

    def forward(self, batch: int = 0) -> tuple[Tensor, list[Tensor]]:
        x, y = self.batches[batch]
        z = self.trunk(x)
        return z, [((head(z).squeeze(1) - y[:, i]) ** 2).mean() for i, head in enumerate(self.heads)]

    def losses(self, batch: int = 0) -> list[Tensor]:
        return self.forward(batch)[1]

    @property
    def shared(self) -> list[Tensor]:
        return list(self.trunk.parameters())

    def head_params(self) -> list[list[Tensor]]:
        return [list(head.parameters()) for head in self.heads]

    def all_params(self) -> list[Tensor]:
        return [*self.trunk.parameters(), *self.heads.parameters()]

    def grads(self) -> list[Tensor]:
        return [p.grad.clone() for p in self.all_params()]

    def mtl(self, method: str, **kwargs: Any) -> MTLBackward:
        return MTLBackward(method, self.trunk, list(self.heads), **kwargs)


def hand_jacobian(losses: list[Tensor], params: list[Tensor]) -> Tensor:
    """[K, P]: row i is ∇_params L_i, one autograd.grad call per task."""
    rows = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])
            for loss in losses]
    return torch.stack(rows)


def hand_head_grads(problem: Problem, losses: list[Tensor]) -> list[Tensor]:
    """Head i's plain gradient ∇L_i, in the order of problem.heads.parameters()."""
    return [g for loss, head in zip(losses, problem.head_params(), strict=True)
            for g in torch.autograd.grad(loss, head, retain_graph=True)]


def flat(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def shared_grad(problem: Problem) -> Tensor:
    return flat([p.grad for p in problem.shared])


def head_grads(problem: Problem) -> list[Tensor]:
    return [p.grad for p in problem.heads.parameters()]


def weighted_grads(problem: Problem, weights: Tensor, batch: int = 0) -> list[Tensor]:
    """∇ Σ_i w_i L_i of every parameter (trunk, then heads), by autograd on the problem's current weights."""
    losses = problem.losses(batch)
    total = sum(w * loss for w, loss in zip(weights, losses, strict=True))
    return list(torch.autograd.grad(total, problem.all_params()))


def assert_grads(problem: Problem, expected: list[Tensor], rtol: float = 1e-12, atol: float = 1e-14) -> None:
    for param, want in zip(problem.all_params(), expected, strict=True):
        torch.testing.assert_close(param.grad, want, rtol=rtol, atol=atol)


# -- gradient methods ------------------------------------------------------------------------------

def test_upgrad_writes_what_torchjd_mtl_backward_with_upgrad_writes():
    from torchjd.aggregation import UPGrad
    from torchjd.autojac import jac_to_grad
    from torchjd.autojac import mtl_backward as torchjd_mtl_backward

    ours, theirs = Problem(), Problem()
    result = mtl_backward(ours.losses(), ours.trunk, list(ours.heads), "upgrad", solver="quadprog", rescale=False)
    features, losses = theirs.forward()
    torchjd_mtl_backward(losses, features=features)
    torchjd_weights = jac_to_grad(theirs.shared, UPGrad())

    assert float((result.weights - 1 / K).abs().max()) > 0.1  # the tasks conflict: not the mean
    torch.testing.assert_close(result.weights, torchjd_weights, rtol=1e-7, atol=1e-9)
    assert_grads(ours, theirs.grads(), rtol=1e-7, atol=1e-9)


def pcgrad_by_hand(jacobian: Tensor, orders: list[list[int]]) -> Tensor:
    """Yu et al. 2020, Alg. 1: project g_i onto the normal plane of every conflicting g_j in order; sum."""
    projected = []
    for i, order in enumerate(orders):
        g = jacobian[i].clone()
        for j in order:
            dot = g @ jacobian[j]
            if dot < 0:
                g = g - dot / (jacobian[j] @ jacobian[j]) * jacobian[j]
        projected.append(g)
    return torch.stack(projected).sum(0)


def test_method_generators_start_at_seed_0_and_distinct_run_seeds_give_distinct_streams():
    bare, at_zero = MethodGenerator("pcgrad"), MethodGenerator("pcgrad", 0)
    assert bare.permutation(20) == at_zero.permutation(20)
    firsts = set()
    for seed in range(300):
        generator = MethodGenerator("pcgrad", seed)
        firsts.add(tuple(generator.permutation(20)))
    assert len(firsts) == 300


def test_pcgrad_projects_the_hand_computed_gradients_in_the_orders_of_its_seeded_generator():
    problem = Problem()
    mtl = problem.mtl("pcgrad", seed=SEED)
    orders = MethodGenerator("pcgrad", SEED)
    for batch in range(2):  # the second step draws new orders from the same generator
        losses = problem.losses(batch)
        jacobian = hand_jacobian(losses, problem.shared)
        heads = hand_head_grads(problem, losses)
        for p in problem.all_params():
            p.grad = None
        mtl(losses)
        mtl.after_optimizer_step()
        torch.testing.assert_close(shared_grad(problem), pcgrad_by_hand(jacobian, orders.visiting_orders(K)),
                                   rtol=1e-12, atol=1e-14)
        for seen, want in zip(head_grads(problem), heads, strict=True):
            torch.testing.assert_close(seen, want, rtol=0, atol=0)


@pytest.mark.parametrize("rescale", [True, False])
def test_mgda_direction_is_the_min_norm_point_of_the_hand_gradients_times_k(rescale):
    """Désidéri 2012 / Sener & Koltun 2018: d = Σ α_i g_i, α on the simplex, with g_i·d ≥ ‖d‖² for every i
    and equality where α_i > 0 (the optimality conditions of min ‖Σ α_i g_i‖²); x K with rescale."""
    problem = Problem()
    losses = problem.losses()
    jacobian = hand_jacobian(losses, problem.shared)
    result = problem.mtl("mgda", rescale=rescale)(losses)
    alpha = result.weights
    assert result.scale == (K if rescale else 1)
    direction = shared_grad(problem) / result.scale
    torch.testing.assert_close(direction, alpha @ jacobian, rtol=1e-12, atol=1e-14)
    assert float(alpha.min()) >= 0 and float(alpha.sum()) == pytest.approx(1.0, abs=1e-12)
    sq_norm = float(direction @ direction)
    dots = jacobian @ direction
    assert bool((dots >= sq_norm - 1e-9).all())
    active = alpha > 1e-8
    torch.testing.assert_close(dots[active], torch.full_like(dots[active], sq_norm), rtol=1e-6, atol=1e-9)


def test_mgdaub_differentiates_through_the_features_then_back_propagates_the_combination():
    """Sener & Koltun 2018, Sec. 3.3: the min-norm weights of the gradients w.r.t. z, then Σ α_i ∇L_i."""
    problem = Problem()
    features, losses = problem.forward()
    rows = torch.stack([torch.autograd.grad(loss, features, retain_graph=True)[0].reshape(-1) for loss in losses])
    heads = hand_head_grads(problem, losses)
    result = problem.mtl("mgdaub")(losses, features=features)
    alpha = result.weights
    torch.testing.assert_close(alpha, methods.build("mgda", K).weights_from_gramian(rows @ rows.T, None).to(alpha),
                               rtol=1e-9, atol=1e-12)
    expected = weighted_grads(problem, alpha * K)[:len(problem.shared)]
    torch.testing.assert_close(shared_grad(problem), flat(expected), rtol=1e-12, atol=1e-14)
    for seen, want in zip(head_grads(problem), heads, strict=True):
        torch.testing.assert_close(seen, want, rtol=0, atol=0)


# -- loss weighting --------------------------------------------------------------------------------

def test_ls_is_the_plain_backward_of_the_sum():
    ours, plain = Problem(), Problem()
    ours.mtl("ls")(ours.losses())
    sum(plain.losses()).backward()
    assert_grads(ours, plain.grads(), rtol=0, atol=0)


def test_dwa_weights_come_from_the_mean_losses_of_the_last_two_epochs():
    """Liu et al. 2019: w = K softmax(r / T), r_i = L_i(t-1) / L_i(t-2) over epochs; w = 1 before."""
    problem = Problem()
    mtl = problem.mtl("dwa")
    epoch_means = []
    for _ in range(2):
        seen = []
        for batch in (0, 1):
            losses = problem.losses(batch)
            seen.append(torch.stack(losses).detach())
            assert torch.equal(mtl(losses).weights, torch.ones(K, dtype=torch.float64))
            mtl.after_optimizer_step()
        mtl.epoch_end()
        epoch_means.append(torch.stack(seen).mean(0))
        with torch.no_grad():  # another epoch, other losses
            for p in problem.trunk.parameters():
                p.mul_(0.9)
    expected = K * torch.softmax(epoch_means[1] / epoch_means[0] / 2.0, dim=0)
    for p in problem.all_params():
        p.grad = None
    result = mtl(problem.losses(2))
    torch.testing.assert_close(result.weights, expected, rtol=1e-12, atol=1e-14)
    assert_grads(problem, weighted_grads(problem, expected, batch=2))


def test_famo_weights_then_the_logit_update_from_the_losses_after_the_step():
    """Liu, Liu & Stone 2023, Alg. 1: w_i = z_i/(L_i + ε) / Σ_j z_j/(L_j + ε), z = softmax(ξ), x K; after the
    step ξ takes an Adam step on J_softmax(ξ)ᵀ δ, δ = log L(before) - log L(after)."""
    problem = Problem()
    mtl = problem.mtl("famo")
    optimizer = torch.optim.SGD(problem.all_params(), lr=0.05)
    losses = problem.losses()
    before = torch.stack(losses).detach()
    inverse = (1 / K) / (before + 1e-8)
    weights = inverse / inverse.sum()
    result = mtl(losses)
    torch.testing.assert_close(result.weights, weights, rtol=1e-12, atol=1e-14)
    assert_grads(problem, weighted_grads(problem, K * weights))
    optimizer.step()
    with pytest.raises(InvalidParameterError, match="famo compares the losses before and after"):
        mtl.after_optimizer_step()
    after = torch.stack(problem.losses()).detach()
    mtl.after_optimizer_step(recompute_losses=lambda: problem.losses())

    logits = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([logits], lr=0.025, weight_decay=1e-3)
    torch.autograd.backward(torch.softmax(logits, 0), grad_tensors=(before + 1e-8).log() - (after + 1e-8).log())
    adam.step()
    torch.testing.assert_close(mtl.method.logits.detach().double(), logits.detach(), rtol=1e-6, atol=1e-7)


def test_gradnorm_needs_the_trunk_module_and_gets_its_learned_weights_renormalised():
    problem = Problem()
    with pytest.raises(InvalidParameterError, match="gradnorm reads the layers .* shared_params=model.trunk"):
        MTLBackward("gradnorm", problem.shared, list(problem.heads))
    mtl = problem.mtl("gradnorm")
    optimizer = torch.optim.SGD([*problem.all_params(), *mtl.parameters()], lr=0.5)
    mtl(problem.losses())
    assert mtl.parameters()[0].grad is not None  # GradNorm's L_grad gradient (Chen et al. 2018, Eq. 2)
    optimizer.step()
    mtl.after_optimizer_step()
    assert float(mtl.parameters()[0].detach().sum()) == pytest.approx(K)


# -- the same step as the trainer ------------------------------------------------------------------

class GradRecorder(Callback):
    def __init__(self):
        self.grads: list[Tensor] = []

    def before_optimizer_step(self, trainer, state) -> None:
        self.grads = [p.grad.clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("method", ["upgrad", "pcgrad", "imtl", "dwa", "uw"])
def test_the_call_writes_what_the_trainer_applies_in_one_step(method, multimnist_small: Path, tmp_path: Path,
                                                             one_torch_thread):
    bench, data = jobs.load_prepared(multimnist_small)
    hparams = jobs.resolved_hparams(bench, method, {})
    config = RunConfig(method=method, epochs=1, batch_size=8, seed=SEED, optimizer="sgd", hparams=hparams)
    recorder = GradRecorder()
    trainer = Trainer(bench, data, config, tmp_path, callbacks=[recorder], progress=False)
    batch = next(iter(trainer._loader(1)))
    mtl = MTLBackward(method, trainer.shared, trainer.task_params, seed=SEED, **hparams)

    trainer.model.train()
    torch.manual_seed(0)  # the same dropout masks in both forward passes
    mtl(trainer.forward_pass(batch).losses)
    ours = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    trainer.train_step(batch, 1)

    for seen, want in zip(ours, recorder.grads, strict=True):
        torch.testing.assert_close(seen, want, rtol=1e-6, atol=1e-7)
    assert any(float(g.abs().max()) > 0 for g in ours)


# -- accumulation, checkpoints ---------------------------------------------------------------------

@pytest.mark.parametrize("method", ["upgrad", "imtl", "uw"])
def test_grad_accumulates_like_autograd(method):
    """Two calls without zero_grad give the sum of the two calls' gradients (IMTL rescales the heads'
    gradients in place: only the new part)."""
    problem = Problem()
    separate = []
    for batch in (0, 1):
        mtl = problem.mtl(method)
        for p in problem.all_params():
            p.grad = None
        mtl(problem.losses(batch))
        separate.append(problem.grads())
    for p in problem.all_params():
        p.grad = None
    mtl = problem.mtl(method)
    mtl(problem.losses(0))
    mtl(problem.losses(1))
    assert_grads(problem, [a + b for a, b in zip(*separate, strict=True)])


def train(problem: Problem, mtl: MTLBackward, optimizer: torch.optim.Optimizer, batches: range) -> None:
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        mtl(problem.losses(batch))
        mtl.clip_gradients(10.0)
        optimizer.step()
        mtl.after_optimizer_step(recompute_losses=functools.partial(problem.losses, batch))
        if batch % 2:
            mtl.epoch_end()


@pytest.mark.parametrize("method,hparams", [("pcgrad", {}), ("famo", {}), ("dwa", {}), ("uw", {}),
                                            ("nashmtl", {"update_weights_every": 2}), ("nashmtl", {})])
def test_state_dict_round_trip_continues_bit_for_bit(method, hparams):
    def build(problem: Problem) -> tuple[MTLBackward, torch.optim.Optimizer]:
        mtl = problem.mtl(method, seed=SEED, **hparams)
        return mtl, torch.optim.Adam([*problem.all_params(), *mtl.parameters()], lr=0.01)

    straight = Problem()
    mtl, optimizer = build(straight)
    train(straight, mtl, optimizer, range(4))

    first = Problem()
    mtl, optimizer = build(first)
    train(first, mtl, optimizer, range(2))
    saved = copy.deepcopy({"model": [first.trunk.state_dict(), first.heads.state_dict()],
                           "optimizer": optimizer.state_dict(), "mtl": mtl.state_dict()})
    resumed = Problem(init_seed=1)  # other initial weights: everything must come from the checkpoint
    mtl, optimizer = build(resumed)
    resumed.trunk.load_state_dict(saved["model"][0])
    resumed.heads.load_state_dict(saved["model"][1])
    optimizer.load_state_dict(saved["optimizer"])
    mtl.load_state_dict(saved["mtl"])
    train(resumed, mtl, optimizer, range(2, 4))

    for a, b in zip(straight.all_params(), resumed.all_params(), strict=True):
        assert torch.equal(a, b)


def test_update_weights_every_reuses_the_solved_weights_between_solves():
    problem = Problem()
    mtl = problem.mtl("nashmtl", update_weights_every=2)
    solved = mtl(problem.losses(0)).weights
    mtl.after_optimizer_step()
    for p in problem.all_params():
        p.grad = None
    reused = mtl(problem.losses(1))
    assert torch.equal(reused.weights, solved) and reused.direction is None
    assert_grads(problem, weighted_grads(problem, solved, batch=1)[:len(problem.shared)]
                 + hand_head_grads(problem, problem.losses(1)))


def test_the_function_form_equals_one_call_and_refuses_stateful_methods():
    a, b = Problem(), Problem()
    mtl_backward(a.losses(), a.trunk, list(a.heads), "imtlg")
    b.mtl("imtlg")(b.losses())
    assert_grads(a, b.grads(), rtol=0, atol=0)
    with pytest.raises(InvalidParameterError, match="pcgrad keeps state between steps; build MTLBackward"):
        mtl_backward(a.losses(), a.trunk, list(a.heads), "pcgrad")


def test_losses_may_come_as_one_stacked_tensor():
    a, b = Problem(), Problem()
    a.mtl("upgrad")(a.losses())
    b.mtl("upgrad")(torch.stack(b.losses()))
    assert_grads(a, b.grads(), rtol=0, atol=0)


# -- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,why", [("moml", "bilevel"), ("forum", "bilevel"), ("asmg", "black-box"),
                                        ("asmg-ew", "black-box"), ("palora", "Pareto-front"),
                                        ("ldcmtl", "router")])
def test_methods_that_need_the_trainer_are_refused_with_the_reason(method, why):
    problem = Problem()
    with pytest.raises(InvalidParameterError, match=f"^{method} cannot run in library mode: .*{why}.*mtlflow train"):
        problem.mtl(method)


def test_bad_input_is_refused_with_one_line_and_leaves_grad_untouched():
    problem = Problem()
    mtl = problem.mtl("upgrad")
    losses = problem.losses()
    for p in problem.all_params():
        p.grad = torch.ones_like(p)
    with pytest.raises(InvalidParameterError, match="got 2 losses for 3 tasks"):
        mtl(losses[:2])
    with pytest.raises(InvalidParameterError, match=r"loss 1 is \(16,\), not a scalar tensor"):
        mtl([losses[0], losses[1].expand(16), losses[2]])
    with pytest.raises(InvalidParameterError, match="loss 2 does not require grad"):
        mtl([*losses[:2], losses[2].detach()])
    with pytest.raises(NonFiniteLossError, match="non-finite loss 0=nan"):
        mtl([losses[0] * float("nan"), *losses[1:]])
    with pytest.raises(InvalidParameterError, match="after_optimizer_step was called without a call"):
        mtl.after_optimizer_step()
    with pytest.raises(InvalidParameterError, match="mgdaub takes per-task gradients w.r.t. the shared features"):
        problem.mtl("mgdaub")(losses)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in problem.all_params())


def test_bad_construction_is_refused():
    problem = Problem()
    with pytest.raises(InvalidParameterError, match="shared_params holds no tensor that requires grad"):
        MTLBackward("upgrad", [], list(problem.heads))
    with pytest.raises(InvalidParameterError, match="task_params is empty"):
        MTLBackward("upgrad", problem.trunk, [])
    with pytest.raises(InvalidParameterError, match="both shared_params and task_params"):
        MTLBackward("upgrad", problem.trunk, [problem.heads[0], problem.heads[1], problem.trunk])
    with pytest.raises(InvalidParameterError, match="upgrad was built for 2 tasks but task_params has 3"):
        MTLBackward(methods.build("upgrad", 2), problem.trunk, list(problem.heads))
    with pytest.raises(InvalidParameterError, match="hyper-parameters .* given with a built method"):
        MTLBackward(methods.build("upgrad", K), problem.trunk, list(problem.heads), solver="nnls")
    with pytest.raises(InvalidParameterError, match="grad_backend 'func' runs the model's forward pass itself"):
        problem.mtl("upgrad", grad_backend="func")
    with pytest.raises(InvalidParameterError, match="upgrad: unknown hyper-parameter"):
        problem.mtl("upgrad", step_size=1.0)
