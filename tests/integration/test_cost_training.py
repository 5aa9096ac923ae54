"""COST on real MultiMNIST: loss invariance of a teleport, merged model = adapter model, HTR on the
optimizer the trainer steps, telemetry in metrics.json, ``--teleport cost`` on top of five base methods,
exact resume, the CLI and the pipeline/DVC plumbing."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import InvalidParameterError
from mtlflow.engine.trainer import Trainer
from mtlflow.teleport import adapters

#: a teleport must leave every task loss on the trigger batch within this much of its value (relative)
INVARIANCE_TOLERANCE = 0.02
ALWAYS = {"trigger": "always"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trainer(data_dir, tmp_path, method="fairgrad", **options):
    bench, data = jobs.load_prepared(data_dir)
    config = RunConfig(method=method, batch_size=64, max_steps_per_epoch=2, epochs=1,
                         hparams=jobs.resolved_hparams(bench, method, {}), teleport="cost",
                         teleport_options={**ALWAYS, **options})
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
        cb.on_epoch_start(trainer, 1)
    return trainer


class MomentProbe(Callback):
    """Records Adam's moments of one shared tensor around the step (added after COST, so it sees the
    betas COST set and reads the moments after COST restored them)."""

    name = "probe"

    def before_optimizer_step(self, trainer, state):
        p = trainer.shared[0]
        st = trainer.optimizer.state[p]
        self.params = torch.cat([q.detach().reshape(-1) for q in trainer.shared]).clone()
        # no state: HTR restarted Adam for the trunk (σ ≤ 0), whose moments start from zero
        self.before = (st["exp_avg"].clone() if st else torch.zeros_like(p),
                       st["exp_avg_sq"].clone() if st else torch.zeros_like(p), p.grad.clone(),
                       trainer.optimizer.param_groups[0]["betas"])

    def after_optimizer_step(self, trainer, state):
        st = trainer.optimizer.state[trainer.shared[0]]
        self.after = (st["exp_avg"].clone(), st["exp_avg_sq"].clone(), trainer.optimizer.param_groups[0]["betas"])


@pytest.mark.parametrize("nonpositive", ["restart", "zero-betas"])
def test_teleport_keeps_losses_moves_the_trunk_and_applies_htr_to_the_stepped_optimizer(multimnist_small, tmp_path,
                                                                                        nonpositive):
    trainer = _trainer(multimnist_small, tmp_path, delay_epochs=1, htr_nonpositive=nonpositive)
    cost = trainer.callbacks[0]
    batches = iter(trainer._loader(1))
    trainer.train_step(next(batches), 1)          # an ordinary step first (delayed start): Adam has moments
    assert not cost._events
    cost.on_epoch_start(trainer, 2)               # epoch 2: teleports allowed
    shared_ids = [id(p) for p in trainer.shared]
    state_keys = {id(p) for p in trainer.optimizer.state}
    before = torch.cat([p.detach().reshape(-1) for p in trainer.shared]).clone()
    batch = next(batches)
    # g′ of Eq. 12, computed independently: the gradient of the mean task loss at the pre-teleport point
    twin = copy.deepcopy(trainer.model)
    inputs, targets = trainer.inputs_targets(batch)
    mean_loss = torch.stack(trainer.task_losses(twin(inputs), targets)).mean()
    g_prime = torch.cat([g.reshape(-1) for g in torch.autograd.grad(mean_loss, twin.shared_parameters())])
    probe = MomentProbe()
    trainer.callbacks.append(probe)
    trainer.train_step(batch, 2)
    (event,) = cost._events
    after = probe.params  # after the teleport, before the optimizer step of the redone step
    # the trunk moved, by what the event reports, and the losses on the trigger batch did not
    assert (after - before).norm() / before.norm() > 1e-3
    assert event["displacement_norm"] == pytest.approx(float((after - before).norm()), rel=1e-4)
    for task, loss in event["losses_before"].items():
        assert abs(event["losses_after"][task] - loss) <= INVARIANCE_TOLERANCE * loss, event
    # same parameter tensors, optimizer state still keyed by them
    assert [id(p) for p in trainer.shared] == shared_ids and {id(p) for p in trainer.optimizer.state} == state_keys
    # HTR: Eq. 13 with the recorded σ on the optimizer that stepped, betas restored afterwards
    sigma = event["sigma"]
    v0, s0, g, betas = probe.before
    v1, s1, restored = probe.after
    if event["sigma_raw"] <= 0 and nonpositive == "restart":
        # σ ≤ 0: Adam restarted for the trunk, so this step is a fresh Adam's first (its step count is 1)
        assert event["htr_restarted"] and betas == restored == (0.9, 0.999)
        assert int(trainer.optimizer.state[trainer.shared[0]]["step"]) == 1
        assert torch.equal(v0, torch.zeros_like(v0)) and torch.equal(s0, torch.zeros_like(s0))
        factor = 1.0  # a fresh Adam's moments are Eq. 13's with the unmodified betas, from zero
        scale1 = scale2 = 1.0
    else:
        assert not event["htr_restarted"]
        assert betas == pytest.approx((sigma * 0.9, sigma * 0.999)) and restored == (0.9, 0.999)
        factor = sigma
        # after the step the moments are rescaled to the weight Adam's bias correction assumes at step t = 2
        scale1, scale2 = ((1 - b ** 2) / (sigma * b * (1 - b) + 1 - sigma * b) for b in (0.9, 0.999))
    assert torch.allclose(v1, scale1 * (factor * 0.9 * v0 + (1 - factor * 0.9) * g), atol=1e-7)
    assert torch.allclose(s1, scale2 * (factor * 0.999 * s0 + (1 - factor * 0.999) * g * g), atol=1e-9)
    # Eq. 12: σ = cos(Δθ, g′), clamped to [0, 1] (a negative cosine would flip Adam's history)
    expected = float(torch.nn.functional.cosine_similarity(after - before, g_prime, dim=0))
    assert event["sigma_raw"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert event["htr_applied"] and sigma == pytest.approx(max(0.0, min(1.0, expected)), rel=1e-4, abs=1e-6)
    for key in ("reason", "conflicting_before", "conflicting_after", "cosine_to_mean_before", "cosine_to_mean_after",
                "grad_norms_before", "grad_norms_after", "adapter_steps", "seconds"):
        assert key in event


class UpdateProbe(Callback):
    """The flat shared gradient the optimizer is about to step with (the aggregated update direction)."""

    name = "update-probe"

    def before_optimizer_step(self, trainer, state):
        self.update = torch.cat([p.grad.detach().reshape(-1) for p in trainer.shared]).clone()
        self.params = torch.cat([p.detach().reshape(-1) for p in trainer.shared]).clone()


def test_last_update_reference_is_the_previous_steps_update_and_falls_back_to_the_mean_gradient(
        multimnist_small, tmp_path):
    # released code (``htr_reference="last-update"``): σ = cos(Δθ, the update of the step before the teleport)
    trainer = _trainer(multimnist_small, tmp_path / "later", delay_epochs=1, htr_reference="last-update")
    cost, probe = trainer.callbacks[0], UpdateProbe()
    trainer.callbacks.append(probe)
    batches = iter(trainer._loader(1))
    trainer.train_step(next(batches), 1)          # ordinary step (delayed start): its update is the reference
    previous_update = probe.update
    before = torch.cat([p.detach().reshape(-1) for p in trainer.shared]).clone()
    cost.on_epoch_start(trainer, 2)
    trainer.train_step(next(batches), 2)
    (event,) = cost._events
    expected = float(torch.nn.functional.cosine_similarity(probe.params - before, previous_update, dim=0))
    assert event["htr_reference"] == "last-update"
    assert event["sigma_raw"] == pytest.approx(expected, rel=1e-4, abs=1e-6)

    # a teleport on the very first step has no previous update: the reference is the mean-loss gradient
    first = _trainer(multimnist_small, tmp_path / "first", htr_reference="last-update")
    first_probe = UpdateProbe()
    first.callbacks.append(first_probe)
    batch = next(iter(first._loader(1)))
    twin = copy.deepcopy(first.model)
    inputs, targets = first.inputs_targets(batch)
    mean_loss = torch.stack(first.task_losses(twin(inputs), targets)).mean()
    g_prime = torch.cat([g.reshape(-1) for g in torch.autograd.grad(mean_loss, twin.shared_parameters())])
    start = torch.cat([p.detach().reshape(-1) for p in first.shared]).clone()
    first.train_step(batch, 1)
    (event,) = first.callbacks[0]._events
    expected = float(torch.nn.functional.cosine_similarity(first_probe.params - start, g_prime, dim=0))
    assert event["sigma_raw"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_without_the_invariance_term_the_same_teleport_changes_the_losses_more(multimnist_small, tmp_path):
    changes = {}
    for use_invariance in (True, False):
        trainer = _trainer(multimnist_small, tmp_path / str(use_invariance), use_invariance=use_invariance,
                           htr=False)
        trainer.train_step(next(iter(trainer._loader(1))), 1)
        changes[use_invariance] = trainer.callbacks[0]._events[0]["loss_change_max_abs"]
    assert changes[False] > 2 * changes[True]


@pytest.mark.parametrize("adapter", ["lora", "loha"])
def test_merged_model_has_no_adapters_and_equals_the_adapter_model(multimnist_small, tmp_path, adapter):
    trainer = _trainer(multimnist_small, tmp_path)
    model, shared = trainer.model, trainer.shared
    adapted = adapters.inject(model, shared, adapter, rank=5)
    assert adapted.targets == ["trunk.conv.0", "trunk.conv.3", "trunk.fc.1"]  # trunk layers only, no head
    with torch.no_grad():
        for p in adapted.adapter_parameters:
            p.normal_(0, 0.3)
    x, _ = trainer.inputs_targets(next(iter(trainer._loader(1))))
    with torch.no_grad():
        expected = adapted.model(x)
        original = model(x)
    assert not torch.allclose(expected[0], original[0], atol=1e-3)  # the adapters do change the outputs
    merged = adapters.merge_and_unload(adapted)
    assert not [n for n, _ in merged.named_modules() if "lora" in n or "hada" in n]
    assert [type(merged.get_submodule(t)) for t in adapted.targets] == [torch.nn.Conv2d, torch.nn.Conv2d, torch.nn.Linear]
    ids = [id(p) for p in shared]
    adapters.copy_shared_into(merged, model, shared)
    assert [id(p) for p in shared] == ids
    with torch.no_grad():
        for a, b in zip(expected, model(x), strict=True):
            assert (a - b).abs().max() <= 1e-5 * a.abs().max()  # float32 round-off of the merged weights


def test_oft_is_refused_on_conv_layers_and_bad_wrappers_are_one_line_errors(multimnist_small, tmp_path):
    with pytest.raises(InvalidParameterError, match="oft.*Conv2d.*lora or loha"):
        _trainer(multimnist_small, tmp_path, adapter="oft")
    bench, data = jobs.load_prepared(multimnist_small)
    with pytest.raises(InvalidParameterError, match="unknown teleport 'bogus'"):
        RunConfig(teleport="bogus").validate()
    with pytest.raises(InvalidParameterError, match="without a teleport"):
        RunConfig(teleport_options={"trigger": "weak"}).validate()
    with pytest.raises(InvalidParameterError) as error:
        Trainer(bench, data, RunConfig(tasks=["left"], teleport="cost"), tmp_path / "r", progress=False)
    assert str(error.value) == ("--teleport cost needs at least 2 tasks (gradient conflicts between tasks trigger it); "
                                "drop --tasks or --teleport")
    with pytest.raises(InvalidParameterError) as error:
        RunConfig(method="moml", teleport="cost")
    assert str(error.value) == ("--teleport cost wraps methods that use the trainer's step; 'moml' owns its training "
                                "step (custom_step); drop --teleport")


@pytest.mark.parametrize("method", ["ls", "mgda", "famo", "fairgrad", "nashmtl"])
def test_teleport_cost_wraps_every_kind_of_base_method(multimnist_small, tmp_path, method):
    result = jobs.train(multimnist_small, tmp_path / method, method=method, epochs=1, batch_size=64,
                        max_steps_per_epoch=2, progress=False, teleport="cost",
                        teleport_options={**ALWAYS, "steps": 2, "perturbations": 1})
    metrics = json.loads((tmp_path / method / "metrics.json").read_text())
    cost = metrics["epochs"][0]["cost"]
    # the cap stops teleports after the first, not the telemetry: both steps are checked (and trigger)
    assert cost["teleports"] == 1 and len(cost["events"]) == 1
    assert cost["checked_steps"] == cost["trigger_steps"] == 2 and cost["trigger_ratio"] == 1.0
    assert cost["resolved_options"]["trigger"] == "always" and "conflict_ratio" in metrics["epochs"][0]
    event = cost["events"][0]
    assert "losses_after" in event and "grad_norms_after" in event
    assert all(torch.isfinite(torch.tensor(v["acc"])) for v in result["final"]["test"].values())
    run = jobs.read_run(tmp_path / method)
    assert jobs.run_label(run["run"]).startswith(f"{method}") and "+cost(" in jobs.run_label(run["run"])


def test_cost_run_resumes_exactly(multimnist_small, tmp_path):
    common = dict(method="fairgrad", batch_size=64, max_steps_per_epoch=2, progress=False, teleport="cost",
                  teleport_options={**ALWAYS, "steps": 2, "perturbations": 1})
    full = jobs.train(multimnist_small, tmp_path / "full", epochs=2, **common)
    jobs.train(multimnist_small, tmp_path / "split", epochs=1, **common)
    resumed = jobs.train(multimnist_small, tmp_path / "split", epochs=2, resume=True, **common)
    assert resumed["final"] == full["final"]


def test_cli_train_with_teleport_and_one_line_errors(multimnist_small, tmp_path, capsys):
    from mtlflow.cli import main

    out = tmp_path / "cli"
    code = main(["train", "--data", str(multimnist_small), "--method", "ls", "--epochs", "1", "--batch-size", "64",
                 "--max-steps-per-epoch", "1", "--teleport", "cost", "--teleport-option", "trigger=always",
                 "--teleport-option", "steps=1", "--no-progress", "--out", str(out)])
    assert code == 0
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["teleport"] == "cost" and run["config"]["teleport_options"]["trigger"] == "always"
    assert json.loads((out / "metrics.json").read_text())["epochs"][0]["cost"]["teleports"] == 1
    capsys.readouterr()
    for args, match in [(["--teleport-option", "adapter=oft"], "oft"), (["--teleport-option", "bogus=1"], "unknown COST"),
                        (["--teleport", "warp"], "unknown teleport")]:
        base = ["train", "--benchmark", "multimnist", "--method", "ls", "--out", str(tmp_path / "bad")]
        extra = args if args[0] == "--teleport" else ["--teleport", "cost", *args]
        code = main(base + extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and match in err[0], err


def test_pipeline_and_dvc_pass_the_teleport_through(multimnist_small, tmp_path, monkeypatch):
    import yaml

    from mtlflow.jobs import stages
    from mtlflow.pipelines import runner

    cost = {"teleport": "cost", "teleport_options": {"trigger": "always", "steps": 1}}
    runner.validate_params("benchmark_sweep", {"train_options": {"teleport": "cost",
                                                                 "teleport_options": {"trigger": "weak"}}})
    with pytest.raises(InvalidParameterError, match="unknown teleport"):
        runner.validate_params("benchmark_sweep", {"train_options": {"teleport": "warp"}})
    with pytest.raises(InvalidParameterError, match="owns its training step"):
        runner.validate_params("benchmark_sweep", {"train_options": cost, "methods": ["moml"]})
    with pytest.raises(InvalidParameterError, match="unknown benchmark_sweep parameter"):
        runner.validate_params("benchmark_sweep", {"teleport": "cost"})  # an option of the runs, not of the sweep
    root = Path(runner.__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert "teleport" not in params["train_options"]
    params.update(epochs=1, train_options={"batch_size": 64, "max_steps_per_epoch": 1, **cost})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stages, "DATA", multimnist_small)
    loaded = stages.load_params()
    stages.stage_train(loaded, "ls", 0)
    stages.stage_reference(loaded, "left", 0)
    run = json.loads((tmp_path / "runs/mtl/ls-s0/run.json").read_text())
    assert run["config"]["teleport"] == "cost"
    reference = json.loads((tmp_path / "runs/reference/left-s0/run.json").read_text())
    assert reference["config"]["teleport"] is None  # references never teleport


def test_released_variant_trains_with_the_released_codes_choices(multimnist_small, tmp_path):
    jobs.train(multimnist_small, tmp_path / "released", method="fairgrad", epochs=1, batch_size=64,
               max_steps_per_epoch=2, progress=False, teleport="cost",
               teleport_options={"variant": "released", "trigger": "always", "perturbations": 1})
    cost = json.loads((tmp_path / "released" / "metrics.json").read_text())["epochs"][0]["cost"]
    resolved, (event,) = cost["resolved_options"], cost["events"]
    assert (resolved["invariance_weight"], resolved["gamma"], resolved["balance"], resolved["noise"]) == \
        (10.0, 0.5, "complement", "per-tensor")
    # two passes over every training batch (256 images at 64: 4 batches) plus the trigger batch
    assert event["adapter_batches"] == 5 and event["adapter_steps"] == 10
    assert event["htr_reference"] == "last-update" and sum(event["balance_weights"]) == pytest.approx(2 * (2 - 1))
