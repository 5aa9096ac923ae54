"""COST's mechanism experiment (mtlflow.experiments.cost_mechanism): the fork is exact, and what it records
matches an independent recomputation."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments import claims
from mtlflow.experiments import cost_mechanism as cm
from mtlflow.teleport.objective import balance_weights


@pytest.fixture(autouse=True)
def _restore_threads():
    # the trainers here run on one thread (their configuration's ``threads``), which torch keeps process-wide
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def _config(**teleport_options) -> cm.MechanismConfig:
    return cm.MechanismConfig(tasks=3, width=1, image_size=8, samples=16, batch_size=8, events=1, max_steps=4,
                              horizon=2, probes=3, budgets=((2, None),), threads=1,
                              teleport_options={"trigger": "always", "steps": 3, "lr": 0.05, **teleport_options})


def _state(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _assert_same_state(first, second) -> None:
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_plain_branch_equals_a_plain_run_bit_for_bit():
    config = _config()
    forked = cm.build_trainer(config, seed=0)
    batches = cm.training_batches(forked, 4, seed=0)
    probe = cm._Probe()
    result = cm.fork(forked, batches, 0, config, 0, probe)
    # after the fork the trainer is where the plain trigger step leaves it; its continuation is branch (b)
    plain = cm.build_trainer(config, seed=0)
    plain_probe = cm._Probe()
    cm._step(plain, batches[0], plain_probe)
    _assert_same_state(_state(forked), _state(plain))
    assert forked.global_step == plain.global_step == 1
    rows = cm.run_steps(plain, batches[1:3], plain_probe)
    cont = result["continuation"]
    assert cont["plain"]["mean_loss"] == sum(r["mean_loss"] for r in rows) / 2
    assert cont["plain"]["dominated_ratio"] == sum(r["dominated"] for r in rows) / 2
    # the fork left nothing behind: continuing the forked trainer gives the plain run's next steps exactly
    assert cm.run_steps(forked, batches[1:3], probe) == rows
    _assert_same_state(_state(forked), _state(plain))


def test_identity_teleport_branch_equals_the_plain_branch():
    # without L_g the adapter never leaves Δθ = 0 (|L − L*| has zero gradient there), σ = 1: an identity teleport
    config = _config(use_sharpness=False)
    trainer = cm.build_trainer(config, seed=1)
    batches = cm.training_batches(trainer, 4, seed=1)
    result = cm.fork(trainer, batches, 0, config, 1, cm._Probe())
    tele, cont = result["teleport"], result["continuation"]
    assert tele["displacement_relative"] == 0.0 and tele["sigma"] == 1.0
    assert tele["losses_after"] == tele["losses_before"]
    assert cont["teleported"] == cont["plain"] and cont["mean_loss_difference"] == 0.0


def test_teleport_moves_in_the_real_branch():
    # the same fork with the sharpness term on differs from the plain branch (the identity test is not vacuous)
    config = _config()
    trainer = cm.build_trainer(config, seed=1)
    batches = cm.training_batches(trainer, 4, seed=1)
    result = cm.fork(trainer, batches, 0, config, 1, cm._Probe())
    assert result["teleport"]["displacement_relative"] > 0
    assert result["continuation"]["teleported"]["mean_loss"] != result["continuation"]["plain"]["mean_loss"]


def _hand_losses(model, trainer, batch, overrides=None) -> torch.Tensor:
    """BCE-with-logits of each task written out: mean over samples of softplus(z) − y·z."""
    inputs, targets = trainer.inputs_targets(batch)
    if overrides:
        model = copy.deepcopy(model)
        with torch.no_grad():
            params = dict(model.named_parameters())
            for name, eps in overrides.items():
                params[name].add_(eps)
    model.train()
    logits = model(inputs)
    return torch.stack([(F.softplus(z.squeeze(-1)) - y * z.squeeze(-1)).mean()
                        for z, y in zip(logits, targets, strict=True)])


def test_recorded_quantities_match_a_recomputation():
    config = _config()
    trainer = cm.build_trainer(config, seed=2)
    batches = cm.training_batches(trainer, 4, seed=2)
    before_state = _state(trainer)
    probe = cm._Probe()
    record = cm.teleport_at(trainer, batches[0], config, config.options(), 2, probe)
    teleported = probe.pre_update
    model = copy.deepcopy(trainer.model)
    names = cm.shared_names(trainer)
    for state, key in ((before_state, "before"), (teleported, "after")):
        model.load_state_dict(state)
        losses = _hand_losses(model, trainer, batches[0])
        torch.testing.assert_close(losses.double(), torch.tensor(record[f"losses_{key}"], dtype=torch.float64),
                                   rtol=1e-5, atol=1e-6)
        # per-task gradients of the shared parameters, one backward per task
        rows = []
        for i in range(len(losses)):
            model.zero_grad()
            _hand_losses(model, trainer, batches[0])[i].backward()
            rows.append(torch.cat([dict(model.named_parameters())[n].grad.reshape(-1) for n in names]))
        grads = torch.stack(rows).double()
        norms = grads.norm(dim=1)
        mean = grads.mean(dim=0)
        cosines = grads @ mean / (norms * mean.norm())
        torch.testing.assert_close(norms, torch.tensor(record[f"grad_norms_{key}"], dtype=torch.float64),
                                   rtol=1e-4, atol=1e-7)
        weakest = int(torch.argmin(norms))
        assert record[f"weakest_cos_{key}"] == pytest.approx(float(cosines[weakest]), abs=1e-4)
        if key == "before":
            balance = balance_weights(norms)
        else:
            assert record["dominated_resolved"] == bool(cosines[weakest] >= 0)
        # L_g of Eq. 9 with the same fixed ε (same seed as the record's)
        eps = cm.sharpness_probes(trainer, config.probes, 1.0, "sphere", cm._seed_of(2, record["step"]) + 7)
        for e in eps:
            assert float(torch.sqrt(sum((t.double() ** 2).sum() for t in e.values()))) == pytest.approx(1.0)
        with torch.no_grad():
            base = _hand_losses(model, trainer, batches[0]).double()
            diffs = [(balance * (_hand_losses(model, trainer, batches[0], e).double() - base)).mean() for e in eps]
        assert record[f"sharpness_{key}"] == pytest.approx(float(torch.stack(diffs).abs().max()), rel=1e-4, abs=1e-7)
    losses_before = torch.tensor(record["losses_before"])
    change = ((torch.tensor(record["losses_after"]) - losses_before).abs() / losses_before).max()
    assert record["loss_change_max_relative"] == pytest.approx(float(change), rel=1e-6)
    gain = record["sharpness_after"] / record["sharpness_before"] - 1
    assert record["sharpness_gain"] == pytest.approx(gain)
    assert record["achieved"] == (gain >= config.gain_margin and float(change) <= config.tolerance)


def test_trigger_search_counts_the_dominated_steps():
    # trigger ratio = the dominated-conflict steps (Eq. 3) among those searched, recounted on a plain run
    config = cm.MechanismConfig(tasks=3, width=1, image_size=8, samples=16, batch_size=8, events=1, max_steps=6,
                                horizon=1, probes=2, budgets=((1, None),), threads=1,
                                teleport_options={"steps": 1})
    result = cm.run_seed(config, seed=3)
    plain = cm.build_trainer(config, seed=3)
    batches = cm.training_batches(plain, config.max_steps + config.horizon + 1, seed=3)
    rows = cm.run_steps(plain, batches[:result["steps_searched"]], cm._Probe())
    assert result["trigger_steps"] == sum(r["dominated"] for r in rows)
    assert len(result["events"]) == int(any(r["dominated"] for r in rows))
    if result["events"]:
        assert result["events"][0]["teleport"]["dominated_before"]


def test_claim_is_registered_after_the_overhead_claim():
    keys = list(claims.CLAIMS)
    assert keys[keys.index("cost-time-overhead") + 1] == "cost-mechanism"
    claim = claims.get("cost-mechanism")
    assert cm.config_from(claim.scales["ci"].config).events >= 1
    with pytest.raises(InvalidParameterError, match="unknown cost-mechanism settings"):
        cm.config_from({"epochs": 3})
    with pytest.raises(InvalidParameterError, match="events, horizon"):
        cm.config_from({"events": 0})
