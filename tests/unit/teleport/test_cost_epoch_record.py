"""COST's epoch record and checkpoint state, on hand-built inputs: the telemetry means are averages over
the teleports that report the value, the trigger checks' time is the clock's, and the state a checkpoint
keeps (teleport count, HTR's last update) comes back on resume; which steps COST checks, counts, teleports
and redoes under the delay, the check period and the per-epoch cap.

Each test pins a behaviour that the mutation run (docs/development/mutation-testing.md) found unchecked.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mtlflow.core.callbacks import StepState
from mtlflow.teleport import callback
from mtlflow.teleport.callback import CostTeleport, epoch_summary

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _event(seconds: float, conflicting_before: int, norm_before: float, sigma: float, **after: float) -> dict:
    """A teleport's event; the ``after`` telemetry exists only where the redone step had per-task gradients."""
    return {"seconds": seconds, "conflicting_before": conflicting_before, "mean_grad_norm_before": norm_before,
            "sigma": sigma, **after}


def test_epoch_summary_averages_telemetry_over_the_teleports_that_report_it() -> None:
    events = [
        _event(1.5, 1, 2.0, 0.25, conflicting_after=0, mean_grad_norm_after=1.0, loss_change_max_abs=0.125),
        _event(0.5, 2, 4.0, 0.5),
        _event(1.0, 0, 6.0, 0.75, conflicting_after=1, mean_grad_norm_after=3.0, loss_change_max_abs=0.375),
    ]
    summary = epoch_summary(events, checked=4, fired=3, dominated=1, options={"o": 1}, resolved={"r": 2})
    assert summary == {
        "teleports": 3, "checked_steps": 4, "trigger_steps": 3, "trigger_ratio": 0.75,
        "dominated_conflict_ratio": 0.25, "seconds": 3.0,
        "conflicting_before_mean": 1.0,          # (1 + 2 + 0) / 3
        "conflicting_after_mean": 0.5,           # (0 + 1) / 2: the second teleport has no after telemetry
        "mean_grad_norm_before_mean": 4.0,       # (2 + 4 + 6) / 3
        "mean_grad_norm_after_mean": 2.0,        # (1 + 3) / 2
        "loss_change_max_abs_mean": 0.25,        # (0.125 + 0.375) / 2
        "sigma_mean": 0.5,                       # (0.25 + 0.5 + 0.75) / 3
        "options": {"o": 1}, "resolved_options": {"r": 2}, "events": events,
    }


def test_an_epoch_without_checked_steps_has_no_ratios() -> None:
    summary = epoch_summary([], checked=0, fired=0, dominated=0, options={}, resolved={})
    assert (summary["trigger_ratio"], summary["dominated_conflict_ratio"], summary["teleports"]) == (None, None, 0)


def test_epoch_record_check_seconds_is_the_time_spent_checking_the_trigger(monkeypatch) -> None:
    # a clock the callback reads at the start and the end of each check: 0.25 s, then 0.5 s
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    monkeypatch.setattr(callback, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    cost = CostTeleport()
    trainer = SimpleNamespace(model=nn.Linear(2, 2))
    agreeing = torch.tensor([[1.0, 0.0], [1.0, 0.5]], dtype=torch.float64)  # no rule fires: no teleport
    for step in range(2):
        state = StepState(epoch=1, step=step, batch=None, losses=torch.ones(2), grads=agreeing)
        assert cost.after_gradients(trainer, state) is False
        cost.after_optimizer_step(trainer, state)
    record: dict = {}
    cost.on_epoch_end(trainer, record)
    assert record["cost"]["checked_steps"] == 2 and record["cost"]["teleports"] == 0
    assert record["cost"]["check_seconds"] == 0.75
    # the options as given (None: the variant's default) and as resolved
    assert record["cost"]["options"] == cost.options.as_dict() and record["cost"]["options"]["variant"] == "paper"
    assert record["cost"]["resolved_options"] == cost.resolved.as_dict()


def test_checkpoint_state_restores_the_teleport_count_and_htrs_last_update() -> None:
    # the released variant's HTR reference is the last update: the shared gradients the optimizer stepped with
    options = {"variant": "released"}
    cost = CostTeleport(options)
    shared = [nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(3))]
    shared[0].grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    shared[1].grad = torch.tensor([5.0, 6.0, 7.0])
    trainer = SimpleNamespace(shared=shared, optimizer=None)
    cost.before_optimizer_step(trainer, StepState(epoch=1, step=0, batch=None, losses=torch.ones(2)))
    cost.total_teleports = 3
    resumed = CostTeleport(options)
    resumed.load_state_dict(cost.state_dict())
    state = resumed.state_dict()
    assert state.keys() == {"total_teleports", "last_update"}
    assert state["total_teleports"] == 3
    assert torch.equal(state["last_update"], torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    older = CostTeleport(options)   # a checkpoint written before the count was saved: no teleport counted yet
    older.total_teleports = 5
    older.load_state_dict({"last_update": None})
    assert older.state_dict()["total_teleports"] == 0


def test_without_htr_the_last_update_is_neither_kept_nor_saved() -> None:
    # the released variant with HTR switched off: its "last-update" reference has nothing to serve
    cost = CostTeleport({"variant": "released", "htr": False})
    shared = [nn.Parameter(torch.zeros(2))]
    shared[0].grad = torch.tensor([1.0, 2.0])
    cost.before_optimizer_step(SimpleNamespace(shared=shared, optimizer=None),
                               StepState(epoch=1, step=0, batch=None, losses=torch.ones(2)))
    assert cost.state_dict()["last_update"] is None


#: two task gradients with a dominated conflict (Eq. 3): the smaller one, (-0.3, 0.1), has inner product
#: -0.1 with the mean (0.35, 0.05); and two without any conflict
DOMINATED = torch.tensor([[1.0, 0.0], [-0.3, 0.1]], dtype=torch.float64)
CALM = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)


def _schedule_run(monkeypatch, options: dict, epochs: list[str]) -> tuple[CostTeleport, list, list, list]:
    """Drive COST's hooks as the trainer does, epoch by epoch, with each step's gradients given by a letter
    (D: dominated conflict, C: calm) and present on every step (a base method that needs the Jacobian).

    The adapter optimisation is replaced by a stand-in that records when it was asked for: this test is about
    when COST checks, counts and teleports; the teleport itself is tested in test_cost_teleport_step.py."""
    cost = CostTeleport({"trigger": "dominated", "htr": False, **options})
    trainer = SimpleNamespace(model=nn.BatchNorm1d(2), shared=[nn.Parameter(torch.zeros(2))], optimizer=None,
                              global_step=0, tasks=[SimpleNamespace(name="a"), SimpleNamespace(name="b")])
    monkeypatch.setattr(cost, "_teleport", lambda trainer, state, stats: {
        "step": trainer.global_step, "epoch": state.epoch, "losses_before": {"a": 1.0, "b": 1.0}, "seconds": 0.0,
        "conflicting_before": stats.conflicting, "mean_grad_norm_before": stats.mean_norm, "sigma": 1.0})
    cost.on_train_start(trainer)
    asked, records, redone = [], [], []
    for epoch, letters in enumerate(epochs, start=1):
        cost.on_epoch_start(trainer, epoch)
        for letter in letters:
            asked.append((cost.needs_jacobian, cost._buffers is not None))
            state = StepState(epoch=epoch, step=trainer.global_step, batch=None, losses=torch.ones(2),
                              grads={"D": DOMINATED, "C": CALM}[letter])
            if cost.after_gradients(trainer, state):  # the trainer redoes the step at the teleported point
                redone.append(trainer.global_step)
            cost.before_optimizer_step(trainer, state)
            cost.after_optimizer_step(trainer, state)
            trainer.global_step += 1
        record: dict = {}
        cost.on_epoch_end(trainer, record)
        records.append(record["cost"])
    return cost, asked, records, redone


def test_checks_counts_and_teleports_follow_the_delay_the_check_period_and_the_cap(monkeypatch) -> None:
    cost, asked, records, redone = _schedule_run(monkeypatch, {"delay_epochs": 1, "check_every": 2, "max_per_epoch": 2},
                                         ["DDDDDDD", "CDDCDDD", "DDCDCDC"])
    # epoch 1 is delayed; then every second step is checked (epoch steps 0, 2, 4, 6), also once capped
    counts = [(r["checked_steps"], r["trigger_steps"], r["dominated_conflict_ratio"], r["teleports"]) for r in records]
    assert counts == [(0, 0, None, 0), (4, 3, 3 / 4, 2), (4, 1, 1 / 4, 1)]
    assert [(e["epoch"], e["step"]) for r in records for e in r["events"]] == [(2, 9), (2, 11), (3, 14)]
    assert redone == [9, 11, 14]  # only the teleported steps are redone
    assert cost.total_teleports == 3 and cost.state_dict()["total_teleports"] == 3
    # gradients are asked for on the checked steps only; the buffers are kept before a step that may teleport
    checked = [False] * 7 + [True, False] * 3 + [True] + [True, False] * 3 + [True]
    may_teleport = [False] * 7 + [True, False, True, False, True, False, False] + [True, False] * 3 + [True]
    assert asked == list(zip(checked, may_teleport, strict=True))


def test_no_teleports_allowed_asks_for_no_gradients_and_a_step_without_gradients_counts_nothing(monkeypatch):
    cost, asked, records, redone = _schedule_run(monkeypatch, {"max_per_epoch": 0}, ["DD"])
    assert asked == [(False, False)] * 2 and records[0]["checked_steps"] == 0 and redone == []
    cost = CostTeleport({"trigger": "always"})
    trainer = SimpleNamespace(model=nn.Linear(1, 1))
    cost.on_epoch_start(trainer, 1)
    assert cost.needs_jacobian
    assert cost.after_gradients(trainer, StepState(epoch=1, step=0, batch=None, losses=torch.ones(2))) is False
    record: dict = {}
    cost.on_epoch_end(trainer, record)
    assert record["cost"]["checked_steps"] == 0
