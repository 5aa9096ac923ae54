"""One COST teleport through the trainer, and the pieces it is made of, against independent computations:
the event's loss changes in float64, its telemetry keys and values (pairwise cosines by brute force, HTR's
σβ), the mode of the teleport's model copy (the invariance targets are the trigger batch's losses in that
mode), Eq. 11's sign, the bf16 autocast of ``--amp bf16``, PEFT's defaults and the merge's refusal.

Each test pins a behaviour that the mutation run (docs/development/mutation-testing.md) found unchecked.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from types import SimpleNamespace

import pytest
import torch
from cost_helpers import double_lenet_trainer
from torch import nn

from mtlflow.core.callbacks import Callback, StepState
from mtlflow.core.errors import InvalidParameterError
from mtlflow.engine.trainer import Trainer
from mtlflow.models.base import MultiTaskModel
from mtlflow.teleport import adapters, callback, objective
from mtlflow.teleport.callback import CostTeleport
from mtlflow.teleport.objective import TeleportProblem, adapter_objective, optimise_adapter
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import gradient_stats

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trainer(data_dir, tmp_path, **options) -> Trainer:
    """A float64 COST trainer teleporting on every step, its callbacks started for epoch 1."""
    trainer = double_lenet_trainer(data_dir, tmp_path / "run", "ls", {"trigger": "always", **options}, seed=3)
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
        cb.on_epoch_start(trainer, 1)
    return trainer


class _Recorder(Callback):
    """The per-task gradients the callbacks see before the teleport and at the redone step, and the betas
    the optimizer steps with (put after COST, whose ``before_optimizer_step`` applies HTR)."""

    name = "recorder"

    def __init__(self):
        self.grads: list[torch.Tensor] = []
        self.betas: list[list[float]] = []

    def after_gradients(self, trainer, state):
        self.grads.append(state.grads.detach().clone())
        return False

    def before_optimizer_step(self, trainer, state):
        self.grads.append(state.grads.detach().clone())
        self.betas = [list(g["betas"]) for g in trainer.optimizer.param_groups]


def test_a_loss_weighting_trainer_computes_task_gradients_only_on_the_steps_cost_checks_or_redoes(
        multimnist_small, tmp_path, monkeypatch):
    # LS needs no per-task gradients itself; COST checks every second step (0 and 2 of 4) and the cap of one
    # teleport redoes step 0: gradients on steps 0 (twice: checked, redone) and 2, none on 1 and 3
    from mtlflow.engine import trainer as trainer_module

    trainer = _trainer(multimnist_small, tmp_path, check_every=2, max_per_epoch=1, steps=1)
    steps: list[int] = []
    task_jacobian = trainer_module.task_jacobian

    def counting(*args, **kwargs):
        steps.append(trainer.callbacks[0]._epoch_step)
        return task_jacobian(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "task_jacobian", counting)
    for batch in itertools.islice(iter(trainer._loader(1)), 4):
        trainer.train_step(batch, 1)
    assert steps == [0, 0, 2]


@pytest.mark.parametrize("check_every", [1, 2])
def test_cost_is_refused_with_a_gramian_only_backend_whatever_its_check_period(multimnist_small, tmp_path,
                                                                              check_every):
    # autogram computes only the Gramian; COST asks for per-task gradients from its first step, whatever the period
    with pytest.raises(InvalidParameterError) as error:
        double_lenet_trainer(multimnist_small, tmp_path / "run", "mgda", {"check_every": check_every},
                             grad_backend="autogram")
    assert str(error.value) == ("callback(s) cost need per-task gradients w.r.t. the shared parameters, which the "
                                "gramian mode of 'mgda' does not compute; use grad_wrt=parameters and a Jacobian "
                                "backend (loop, batched, func, autojac)")


def test_the_teleport_problem_compares_bfloat16_losses_in_float32():
    # a bf16 model's losses (no autocast): the targets and the problem's losses are float32, not bf16
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g).bfloat16(), [torch.randn(8, 1, generator=g).bfloat16() for _ in range(2)]
    _, problem = _teleport_problem(_tiny_model().bfloat16(), [(x, y)])
    assert problem.targets.dtype == torch.float32
    assert problem.losses(0, None).dtype == torch.float32


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))


def test_a_teleport_that_does_not_move_changes_no_loss_in_float64(multimnist_small, tmp_path):
    # L_t alone from Δθ = 0 (Table 4's "w/o L_g") is at its minimum: the redone step sees the same float64
    # losses, so the recorded change is exactly 0 (not the float32 rounding of the losses before)
    trainer = _trainer(multimnist_small, tmp_path, use_sharpness=False, htr=False)
    trainer.train_step(next(iter(trainer._loader(1))), 1)
    (event,) = trainer.callbacks[0]._events
    assert event["displacement_norm"] == 0.0
    assert event["losses_after"] == event["losses_before"]
    assert all(v != float(torch.tensor(v, dtype=torch.float32)) for v in event["losses_before"].values())
    assert event["loss_change_max_abs"] == 0.0
    assert event["loss_change_max_relative"] == 0.0


def _first_conflicting_batch(trainer: Trainer, candidates: int = 16):
    """The first of the epoch's batches whose two task gradients (w.r.t. the shared parameters, at the trainer's
    current weights) have a negative cosine, so that the weak trigger fires on it: chosen by computing the
    cosines, not pinned by position, since which images a batch holds follows the data's splits."""
    model = copy.deepcopy(trainer.model)
    shared = model.shared_parameters()
    for batch in itertools.islice(trainer._loader(1), candidates):
        inputs, targets = trainer.inputs_targets(batch)
        losses = trainer.task_losses(model(inputs), targets)
        grads = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, shared, retain_graph=True)])
                 for loss in losses]
        if _cosine(grads[0], grads[1]) < 0:
            return batch
    raise AssertionError(f"none of the first {candidates} batches has conflicting task gradients")


def test_teleport_event_keys_and_values_match_the_gradients_and_the_optimizer(multimnist_small, tmp_path, monkeypatch):
    traces = []
    real = callback.optimise_adapter
    monkeypatch.setattr(callback, "optimise_adapter", lambda *args: traces.append(real(*args)) or traces[-1])
    trainer = _trainer(multimnist_small, tmp_path, trigger="weak", radius=0.5, lr=5e-2)
    recorder = _Recorder()
    trainer.callbacks.append(recorder)
    conflicting = _first_conflicting_batch(trainer)
    theta_before = torch.cat([p.detach().reshape(-1) for p in trainer.shared]).clone()
    started = time.perf_counter()
    trainer.train_step(conflicting, 1)
    elapsed = time.perf_counter() - started
    (event,) = trainer.callbacks[0]._events
    (trace,) = traces
    # metrics.json's cost.events schema (docs/research/cost.md; experiments/cost_ablation.py reads it)
    assert set(event) == {
        "step", "epoch", "trigger", "reason", "losses_before", "conflicting_before", "cosine_to_mean_before",
        "grad_norms_before", "mean_grad_norm_before", "min_pairwise_cos_before", "balance_weights", "adapter",
        "adapter_steps", "adapter_batches", "invariance_first", "invariance_last", "sharpness_first",
        "sharpness_last", "displacement_norm", "displacement_relative", "sigma", "sigma_raw", "htr_reference",
        "htr_applied", "htr_restarted", "htr_betas", "seconds", "losses_after", "loss_change_max_abs", "loss_change_max_relative",
        "min_pairwise_cos_after", "conflicting_after", "cosine_to_mean_after", "grad_norms_after",
        "mean_grad_norm_after"}
    # two tasks: the smallest pairwise cosine is the one cosine, before (the weak trigger fired on it) and after
    before, after = recorder.grads
    assert math.isclose(event["min_pairwise_cos_before"], _cosine(before[0], before[1]), rel_tol=1e-12)
    assert event["min_pairwise_cos_before"] < 0
    # the reason names the rule that fired and its pair (two tasks: the only pair) with that cosine
    first, second = event["losses_before"]
    assert event["trigger"] == "weak"
    assert event["reason"] == (f"weak conflict (Def. 1): cos(g_{first}, g_{second}) = "
                               f"{_cosine(before[0], before[1]):.3f} < 0")
    assert math.isclose(event["min_pairwise_cos_after"], _cosine(after[0], after[1]), rel_tol=1e-12)
    # the gradient norms at the redone step, per task and of the mean gradient
    names = list(event["losses_before"])
    assert event["grad_norms_after"].keys() == set(names)
    for name, g in zip(names, after, strict=True):
        assert math.isclose(event["grad_norms_after"][name], math.sqrt(float(g @ g)), rel_tol=1e-12)
    mean = after.mean(dim=0)
    assert math.isclose(event["mean_grad_norm_after"], math.sqrt(float(mean @ mean)), rel_tol=1e-12)
    # the tasks whose gradient at the redone step conflicts with the mean gradient
    cosines = {name: _cosine(g, mean) for name, g in zip(names, after, strict=True)}
    assert event["conflicting_after"] == sum(c < 0 for c in cosines.values())
    assert event["cosine_to_mean_after"] == pytest.approx(cosines, rel=1e-12)
    # the displacement relative to the trunk's norm before the teleport
    assert event["displacement_relative"] == pytest.approx(event["displacement_norm"] / float(theta_before.norm()),
                                                           rel=1e-12)
    # the teleport's duration is part of the step's
    assert 0.0 < event["seconds"] < elapsed
    # L_t and L_g at the first and the last of the 8 adapter steps; L_t = 0 at the start (LoRA's B = 0)
    assert event["adapter_steps"] == trace.steps == 8
    assert (event["invariance_first"], event["invariance_last"]) == (trace.invariance[0], trace.invariance[-1])
    assert (event["sharpness_first"], event["sharpness_last"]) == (trace.sharpness[0], trace.sharpness[-1])
    assert event["invariance_first"] == 0.0 and event["invariance_last"] > 0.0
    # HTR (Eq. 13): the optimizer steps with σ·(β₁, β₂), which the event records
    sigma = event["sigma"]
    assert 0.0 < sigma < 1.0 and event["htr_applied"] is True
    assert event["htr_betas"] == recorder.betas == [[sigma * 0.9, sigma * 0.999]]
    # the loss changes, recomputed from the recorded float64 losses
    pairs = [(event["losses_after"][t], event["losses_before"][t]) for t in event["losses_before"]]
    assert event["loss_change_max_abs"] == max(abs(a - b) for a, b in pairs) > 0.0
    assert event["loss_change_max_relative"] == max(abs(a - b) / abs(b) for a, b in pairs)


@pytest.mark.parametrize("eval_mode", [False, True])
def test_invariance_targets_are_the_trigger_batch_losses_in_the_variants_mode(eval_mode, multimnist_small, tmp_path,
                                                                             monkeypatch):
    # L_i* is measured on the teleport's copy of the model: in train mode (the paper variant: BatchNorm on the
    # batch's statistics) or in eval mode (the released code: BatchNorm on its running statistics)
    problems = []
    real = callback.optimise_adapter
    monkeypatch.setattr(callback, "optimise_adapter", lambda problem, *args: problems.append(problem)
                        or real(problem, *args))
    trainer = _trainer(multimnist_small, tmp_path, eval_mode=eval_mode, use_sharpness=False, htr=False, steps=1)
    batch = next(iter(trainer._loader(1)))
    inputs, targets = trainer.inputs_targets(batch)
    reference = copy.deepcopy(trainer.model).train(not eval_mode)
    with torch.no_grad():
        expected = torch.stack(trainer.task_losses(reference(inputs), targets))
        other = torch.stack(trainer.task_losses(reference.train(eval_mode)(inputs), targets))
    assert not torch.allclose(expected, other, rtol=1e-3)  # the two modes give different losses
    trainer.train_step(batch, 1)
    (problem,) = problems
    torch.testing.assert_close(problem.targets, expected.unsqueeze(0), rtol=1e-12, atol=0.0)


def test_mean_invariance_target_is_each_tasks_loss_averaged_over_the_teleport_batches():
    # the released code's L* (invariance_target="mean"): one row [1, K], the per-task mean of the K losses of
    # each of the teleport's batches, computed here on the model without adapters (LoRA starts at B = 0)
    model = _tiny_model().double()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 4, generator=g, dtype=torch.float64),
             [torch.randn(8, 1, generator=g, dtype=torch.float64) for _ in range(2)]) for _ in range(3)]
    _, problem = _teleport_problem(model, data, {"invariance_target": "mean"})
    with torch.no_grad():
        per_batch = [[float(loss) for loss in _squared_errors(model(x), y)] for x, y in data]
    expected = [[sum(row[i] for row in per_batch) / 3 for i in range(2)]]
    torch.testing.assert_close(problem.targets, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0.0)
    assert problem.dtype == torch.float64  # the perturbations are drawn in the trunk's dtype


def test_the_problem_of_a_trunk_with_one_parameter_perturbs_that_parameter():
    # a bias-free single Linear trunk: one shared parameter, which also gives the problem's dtype
    torch.manual_seed(0)
    model = MultiTaskModel(nn.Sequential(nn.Linear(4, 5, bias=False), nn.Tanh()), [nn.Linear(5, 1), nn.Linear(5, 1)],
                           ["a", "b"]).double()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 4, generator=g, dtype=torch.float64),
             [torch.randn(8, 1, generator=g, dtype=torch.float64) for _ in range(2)])]
    _, problem = _teleport_problem(model, data)
    assert problem.perturbation_shapes == {"trunk.0.base_layer.weight": (5, 4)}
    assert problem.dtype == torch.float64


def test_a_trunk_without_conv_or_linear_layers_is_refused_in_one_line():
    model = MultiTaskModel(nn.Sequential(nn.LayerNorm(4)), [nn.Linear(4, 1), nn.Linear(4, 1)], ["a", "b"])
    with pytest.raises(InvalidParameterError) as error:
        adapters.check_targets(model, model.shared_parameters(), "lora")
    assert str(error.value) == ("COST needs Conv2d or Linear layers in the shared trunk to put adapters on; this "
                                "model's trunk has none (use a benchmark with a convolutional or MLP trunk)")


@pytest.mark.parametrize("n_convs, named", [(4, "trunk.0, trunk.1, trunk.2..."), (3, "trunk.0, trunk.1, trunk.2")])
def test_inject_refuses_oft_on_conv_layers_naming_the_first_three(n_convs, named):
    # injecting directly (not through the teleport's check) refuses too; beyond three Conv2d layers, "..."
    trunk = nn.Sequential(*[nn.Conv2d(1, 1, 1) for _ in range(n_convs)], nn.Flatten())
    model = MultiTaskModel(trunk, [nn.Linear(4, 1), nn.Linear(4, 1)], ["a", "b"])
    with pytest.raises(InvalidParameterError) as error:
        adapters.inject(model, model.shared_parameters(), "oft")
    assert str(error.value) == ("COST adapter 'oft' is wrong on Conv2d layers in peft 0.21 (its output differs at "
                                f"initialisation; trunk layers {named}); use adapter=lora or loha")


def test_adapter_objective_is_weighted_invariance_minus_gamma_times_sharpness():
    # Eq. 11 on a hand-checked problem: losses (x₀², x₁²) at x = w + Δ (+ ε), w = (1, 2), Δ = 0, targets
    # (0.5, 3): L_t = (0.5 + 1) / 2 = 0.75; ε = (0.5, 0): perturbed losses (2.25, 4), R = (1.5, 0.5),
    # L_g = |(1.5 · 1.25 + 0.5 · 0) / 2| = 0.9375; w·L_t − γ·L_g = 2 · 0.75 − 0.5 · 0.9375 = 1.03125
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    delta = torch.zeros(2, dtype=torch.float64, requires_grad=True)

    def losses(batch, eps):
        x = w + delta + (eps["w"] if eps is not None else 0.0)
        return x ** 2

    problem = TeleportProblem(losses=losses, perturbation_shapes={"w": w.shape}, adapter_parameters=[delta],
                              targets=torch.tensor([[0.5, 3.0]], dtype=torch.float64),
                              balance=torch.tensor([1.5, 0.5], dtype=torch.float64), n_batches=1,
                              dtype=torch.float64)
    options = CostOptions.from_mapping({"invariance_weight": 2.0, "gamma": 0.5}).resolved()
    eps = {"w": torch.tensor([0.5, 0.0], dtype=torch.float64)}
    total, l_t, l_g = adapter_objective(problem, options, 0, [eps])
    assert (float(l_t.detach()), float(l_g.detach())) == (0.75, 0.9375)
    assert float(total.detach()) == 1.03125


def test_the_objective_of_a_later_batch_uses_its_own_target_row_and_the_trigger_batch_for_sharpness():
    # losses (b+1)·(x₀², x₁²) on batch b at x = w + Δ (+ ε), w = (1, 2): batch 1 gives (2, 8) against its target
    # row (1.5, 9): L_t = (0.5 + 1) / 2 = 0.75. L_g perturbs the trigger batch 0: losses (1, 4) -> (2.25, 4) with
    # ε = (0.5, 0), R = (1.5, 0.5): L_g = |(1.5 · 1.25 + 0) / 2| = 0.9375; 2 · 0.75 − 0.5 · 0.9375 = 1.03125
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    delta = torch.zeros(2, dtype=torch.float64, requires_grad=True)

    def losses(batch, eps):
        return (batch + 1) * (w + delta + (eps["w"] if eps is not None else 0.0)) ** 2

    problem = TeleportProblem(losses=losses, perturbation_shapes={"w": w.shape}, adapter_parameters=[delta],
                              targets=torch.tensor([[0.0, 0.0], [1.5, 9.0]], dtype=torch.float64),
                              balance=torch.tensor([1.5, 0.5], dtype=torch.float64), n_batches=2,
                              dtype=torch.float64)
    options = CostOptions.from_mapping({"invariance_weight": 2.0, "gamma": 0.5}).resolved()
    total, l_t, l_g = adapter_objective(problem, options, 1, [{"w": torch.tensor([0.5, 0.0], dtype=torch.float64)}])
    assert (float(l_t.detach()), float(l_g.detach()), float(total.detach())) == (0.75, 0.9375, 1.03125)


@pytest.mark.parametrize("noise", ["sphere", "per-tensor"])
def test_the_adapter_optimisation_draws_its_perturbations_with_the_options_noise(noise):
    # one step on losses (x₀², x₁²) at x = w + Δ + (ε_a, ε_b): two one-element tensors, so the sphere (‖ε‖ = δ
    # over both) and per-tensor noise (|ε_a| = |ε_b| = δ) differ; L_g of the step is Eq. 9 at the seed's draws
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    delta = torch.zeros(2, dtype=torch.float64, requires_grad=True)

    def losses(batch, eps):
        x = w + delta + (torch.cat([eps["a"], eps["b"]]) if eps is not None else 0.0)
        return x ** 2

    shapes = {"a": torch.Size([1]), "b": torch.Size([1])}
    problem = TeleportProblem(losses=losses, perturbation_shapes=shapes, adapter_parameters=[delta],
                              targets=torch.tensor([[1.0, 4.0]], dtype=torch.float64),
                              balance=torch.tensor([1.5, 0.5], dtype=torch.float64), n_batches=1,
                              dtype=torch.float64)
    options = CostOptions.from_mapping({"noise": noise, "radius": 0.1, "perturbations": 2}).resolved()
    draw = torch.Generator().manual_seed(5)
    eps = [objective.sample_perturbation(shapes, 0.1, noise, draw, torch.float64, torch.device("cpu"))
           for _ in range(2)]
    perturbed = torch.stack([(w + torch.cat([e["a"], e["b"]])) ** 2 for e in eps])
    expected = ((perturbed - w ** 2) * problem.balance).mean(dim=1).abs().max()
    trace = optimise_adapter(problem, options, 1, 1e-3, torch.Generator().manual_seed(5))
    assert trace.sharpness == [pytest.approx(float(expected), rel=1e-12)]


def _tiny_model() -> MultiTaskModel:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh())
    return MultiTaskModel(trunk, [nn.Linear(5, 1), nn.Linear(5, 1)], ["a", "b"])


def _squared_errors(preds, targets):
    return [((p - t) ** 2).mean() for p, t in zip(preds, targets, strict=True)]


def _teleport_problem(model: MultiTaskModel, data: list, options: dict | None = None, amp: str = "none"):
    """The adapted copy of ``model`` (LoRA, rank 2) and COST's problem on it over the batches ``data`` (batch 0
    the trigger batch), for task gradient norms 1 and 2, through a stand-in trainer with squared-error losses."""
    adapted = adapters.inject(model, model.shared_parameters(), "lora", 2)
    trainer = SimpleNamespace(device=torch.device("cpu"), config=SimpleNamespace(amp=amp),
                              inputs_targets=lambda batch: batch, task_losses=_squared_errors)
    batches = SimpleNamespace(n=len(data), get=lambda index: data[index])
    stats = gradient_stats(torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64))
    return adapted, CostTeleport(options)._problem(trainer, adapted, batches, stats)


def test_the_teleports_forward_runs_in_bfloat16_under_amp_whatever_autocasts_default_dtype():
    # --amp bf16 means bfloat16 also where autocast's default is another type (float16 on CUDA; set here on
    # the CPU, whose default is bfloat16)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), [torch.randn(8, 1, generator=g) for _ in range(2)]
    previous = torch.get_autocast_dtype("cpu")
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        adapted, problem = _teleport_problem(_tiny_model(), [(x, y)], amp="bf16")
    finally:
        torch.set_autocast_dtype("cpu", previous)

    def expected(dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            return torch.stack(_squared_errors(adapted.model(x), y)).float()

    assert not torch.equal(expected(torch.bfloat16), expected(torch.float16))
    assert torch.equal(problem.targets, expected(torch.bfloat16).unsqueeze(0))


def test_inject_defaults_to_lora_of_rank_5_on_every_shared_layer():
    # App. B.2: LoRA, r = 5; A is [r, in], B is [out, r] for each trunk Linear (4 -> 6 -> 5)
    model = _tiny_model()
    adapted = adapters.inject(model, model.shared_parameters())
    shapes = {n: tuple(p.shape) for n, p in adapted.model.named_parameters() if p.requires_grad}
    assert shapes == {"trunk.0.lora_A.default.weight": (5, 4), "trunk.0.lora_B.default.weight": (6, 5),
                      "trunk.2.lora_A.default.weight": (5, 6), "trunk.2.lora_B.default.weight": (5, 5)}


@pytest.mark.parametrize("leftover", ["lora_A", "hada_w1", "oft_R"])
def test_merge_refuses_a_merged_model_that_still_holds_adapter_modules(leftover):
    # the trainer must get plain layers back, whichever adapter (LoRA, LoHa, OFT) a PEFT merge left behind
    merged = nn.Sequential()
    merged.add_module("fc", nn.Linear(2, 2))
    merged.fc.add_module(leftover, nn.Identity())
    adapted = adapters.AdaptedModel(model=merged, tuner=SimpleNamespace(merge_and_unload=lambda: merged),
                                    adapter_parameters=[], shared_names=[], targets=[])
    with pytest.raises(RuntimeError) as error:
        adapters.merge_and_unload(adapted)
    assert str(error.value) == f"adapter modules remain after merge_and_unload: ['fc.{leftover}']"


@pytest.mark.parametrize("adapter", ["lora", "loha"])
def test_the_teleport_injects_the_adapter_and_rank_of_its_options(adapter, multimnist_small, tmp_path, monkeypatch):
    # rank 2 rather than the default 5: the adapter factors of every trunk layer have 2 as their inner size
    injected = []
    inject = adapters.inject

    def recording_inject(*args, **kwargs):
        adapted = inject(*args, **kwargs)
        injected.append({n: tuple(p.shape) for n, p in adapted.model.named_parameters() if p.requires_grad})
        return adapted

    monkeypatch.setattr(adapters, "inject", recording_inject)
    trainer = _trainer(multimnist_small, tmp_path, adapter=adapter, rank=2, steps=1)
    trainer.train_step(next(iter(trainer._loader(1))), 1)
    (shapes,) = injected
    factor = {"lora": "lora_A", "loha": "hada_w1_b"}[adapter]  # both [rank, fan-in]
    inner = [shape[0] for name, shape in shapes.items() if factor in name]
    assert inner and set(inner) == {2}


def test_loss_changes_are_relative_to_each_losss_own_size_below_one_too():
    # losses 0.5 and 0.02 move by 0.1 and 0.01: relative changes 0.2 and 0.5 (not clamped at 1)
    cost = CostTeleport()
    cost._task_names = ["a", "b"]
    event = {"losses_before": {"a": 0.5, "b": 0.02}}
    cost._record_after(event, StepState(epoch=1, step=0, batch=None, losses=torch.tensor([0.4, 0.03])))
    assert event["losses_after"] == pytest.approx({"a": 0.4, "b": 0.03}, rel=1e-6)
    assert event["loss_change_max_abs"] == pytest.approx(0.1, rel=1e-6)
    assert event["loss_change_max_relative"] == pytest.approx(0.5, rel=1e-5)
    assert "conflicting_after" not in event  # no gradients at the redone step: no gradient telemetry


def test_without_htr_a_teleport_records_that_htr_was_not_applied(multimnist_small, tmp_path):
    trainer = _trainer(multimnist_small, tmp_path, htr=False, steps=1)
    trainer.train_step(next(iter(trainer._loader(1))), 1)
    (event,) = trainer.callbacks[0]._events
    assert event["htr_applied"] is False and "htr_betas" not in event


def test_the_teleports_extra_batches_are_a_shuffle_of_the_training_split_fixed_by_its_seed(multimnist_small,
                                                                                           tmp_path):
    trainer = _trainer(multimnist_small, tmp_path)
    ordered = [inputs for inputs, _ in trainer.bench.make_loader(trainer.data.splits["train"],
                                                                 trainer.config.batch_size, shuffle=False)]

    def extra(seed: int, global_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(global_seed)  # the global random state must not matter
        batches = callback._Batches(trainer, "trigger", count=0, seed=seed)
        assert batches.n == 1 + len(ordered) and batches.get(0) == "trigger"
        return [batches.get(i)[0] for i in range(1, batches.n)]

    first = extra(seed=11, global_seed=0)
    assert all(torch.equal(a, b) for a, b in zip(first, extra(seed=11, global_seed=1), strict=True))
    assert not torch.equal(first[0], extra(seed=12, global_seed=0)[0])
    assert not torch.equal(first[0], ordered[0])
    # a shuffle: every training image once
    assert sorted(torch.cat(first).flatten(1).sum(1).tolist()) == pytest.approx(
        sorted(torch.cat(ordered).flatten(1).sum(1).tolist()))


@pytest.mark.parametrize("batch_size,balance", [(0, "softmax"), (3, "complement")])
def test_every_teleport_batch_gives_its_own_losses_and_index_0_stays_the_trigger_batch(batch_size, balance):
    # batch_size 0: whole batches; 3: the first 3 samples of each
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 4, generator=g), [torch.randn(8, 1, generator=g) for _ in range(2)]) for _ in range(3)]
    adapted, problem = _teleport_problem(_tiny_model(), data, {"batch_size": batch_size, "balance": balance})
    # R of the options' kind for the gradient norms 1 and 2 (sum 3): Eq. 10's K·softmax(3/1, 3/2), or the
    # released code's K·(1 - norm/sum)
    sigmoid = 1.0 / (1.0 + math.exp(-1.5))
    expected_balance = {"softmax": [2 * sigmoid, 2 * (1 - sigmoid)], "complement": [4 / 3, 2 / 3]}[balance]
    assert problem.balance.tolist() == pytest.approx(expected_balance, rel=1e-12)
    used = batch_size or 8
    with torch.no_grad():
        expected = [torch.stack(_squared_errors(adapted.model(x[:used]), [t[:used] for t in y])) for x, y in data]
        assert torch.equal(problem.targets, torch.stack(expected))
        # the adapter loop comes back to index 0 after the others: still the trigger batch
        for index in (1, 2, 0):
            assert torch.equal(problem.losses(index, None), expected[index])


class _BetasRecorder(Callback):
    """The betas of the optimizer's groups at the step (put after COST, which sets them for HTR)."""

    name = "betas"

    def before_optimizer_step(self, trainer, state):
        self.betas = [list(g["betas"]) for g in trainer.optimizer.param_groups]


@pytest.mark.parametrize("raw", [-0.4, 0.0])
@pytest.mark.parametrize("nonpositive", ["restart", "zero-betas"])
def test_a_teleport_against_the_reference_gradient_restarts_adam_for_the_trunk_or_clamps_sigma(
        multimnist_small, tmp_path, monkeypatch, nonpositive, raw):
    # σ = cos(Δθ, g′) ≤ 0 (forced; 0 included): "restart" drops the Adam state of the trunk's groups, so the
    # teleport step is their step 1; "zero-betas" steps them with β = (0, 0) on step 2
    trainer = _trainer(multimnist_small, tmp_path, steps=1, htr_nonpositive=nonpositive, delay_epochs=1)
    cost = trainer.callbacks[0]
    recorder = _BetasRecorder()
    trainer.callbacks.append(recorder)
    batches = iter(trainer._loader(1))
    trainer.train_step(next(batches), 1)              # an ordinary step (delayed start): every tensor on step 1
    cost.on_epoch_start(trainer, 2)
    monkeypatch.setattr(callback, "htr_sigma", lambda displacement, reference: (0.0, raw))
    trainer.train_step(next(batches), 2)
    (event,) = cost._events
    trunk = {id(p) for p in trainer.shared}
    trunk_groups = [g for g in trainer.optimizer.param_groups if any(id(p) in trunk for p in g["params"])]
    in_trunk_groups = {id(p) for g in trunk_groups for p in g["params"]}
    steps = {int(trainer.optimizer.state[p]["step"]) for p in trainer.model.parameters() if id(p) in in_trunk_groups}
    other_steps = {int(trainer.optimizer.state[p]["step"]) for g in trainer.optimizer.param_groups
                   for p in g["params"] if id(p) not in in_trunk_groups}
    assert event["htr_applied"] is True and other_steps <= {2}
    if nonpositive == "restart":
        assert event["htr_restarted"] is True and "htr_betas" not in event and steps == {1}
        assert recorder.betas == [[0.9, 0.999]] * len(trainer.optimizer.param_groups)
    else:
        assert event["htr_restarted"] is False and steps == {2}
        assert event["htr_betas"] == [[0.0, 0.0]] * len(trunk_groups)
    assert trainer.optimizer.param_groups[0]["betas"] == (0.9, 0.999)


def test_the_callback_rescales_adams_moments_after_the_htr_step_unless_told_not_to(multimnist_small, tmp_path,
                                                                                   monkeypatch):
    # σ forced to 0.5 on Adam's step 2: with "rescale" the trunk's first moment is Eq. 13's times
    # (1 − β₁²)/(σβ₁(1 − β₁) + 1 − σβ₁); with "none" it is Eq. 13's (same seed, same batches, same gradients)
    monkeypatch.setattr(callback, "htr_sigma", lambda displacement, reference: (0.5, 0.5))
    moments = {}
    for choice in ("rescale", "none"):
        trainer = _trainer(multimnist_small, tmp_path / choice, steps=1, delay_epochs=1, htr_bias_correction=choice)
        batches = iter(trainer._loader(1))
        trainer.train_step(next(batches), 1)
        trainer.callbacks[0].on_epoch_start(trainer, 2)
        trainer.train_step(next(batches), 2)
        (event,) = trainer.callbacks[0]._events
        assert event["htr_betas"][0] == [0.45, 0.4995]
        moments[choice] = trainer.optimizer.state[trainer.shared[0]]["exp_avg"].clone()
    factor = (1 - 0.9 ** 2) / (0.5 * 0.9 * (1 - 0.9) + 1 - 0.5 * 0.9)
    torch.testing.assert_close(moments["rescale"], factor * moments["none"], rtol=1e-12, atol=1e-15)
