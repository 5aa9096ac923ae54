"""COST's mechanism where its trigger fires: does a teleport do what it optimises? (COST paper, Sec. 4, Alg. 1,
Eqs. 3, 7, 9-11 and Fig. 5(b); Zhou et al., NeurIPS 2025, ``shared/seeds/cost-symmetry-teleportation.txt``).

On MultiMNIST the paper's trigger (dominated conflict, Eq. 3) never fires (``docs/research/cost.md``), so the
teleport could not be judged there. This experiment trains the base method (FairGrad, the paper's base) on a
problem where it does fire -- the CelebA CNN with K random binary attributes (``SyntheticCelebA``, the K = 40
problem of ``mtlflow bench``), whose smallest task gradient regularly opposes the mean -- and at each of the first
``events`` trigger steps **forks** the training state (model, optimizer, method, step counter, RNG):

* branch (a): the production COST callback (:class:`mtlflow.teleport.callback.CostTeleport`, the options given)
  teleports on the trigger batch, the trainer redoes the step there with HTR, then ``horizon`` plain steps;
* branch (b): the same steps on the same batches without the teleport.

Recorded per event (the paper's quantities): on the trigger batch, each task's loss before and after the
teleport (loss invariance, what L_t of Eq. 7 penalises), the sharpness L_g of Eq. 9 before and after, measured
with ``probes`` fixed perturbations ε_j on the sphere ‖ε‖ = δ (the same ε at both points, R of Eq. 10 from the
pre-teleport norms; the adapter's own trace, first and last step, is kept too), the task gradient norms, the
cosines with the mean gradient, whether the dominated conflict (Eq. 3) is resolved, ‖Δθ‖, σ and seconds; over
the next ``horizon`` steps, the mean task loss of each step's batch (before its update) and the share of steps in
a dominated conflict, teleported minus not.

A **budget sweep** repeats the teleport of every event (from the same forked state) for each adapter budget
(steps × lr) and measures the L_g gain, the largest relative task-loss change and the seconds it costs; a
teleport *achieves its objective* when L_g rises by at least ``gain_margin`` while every task loss changes by at
most ``tolerance`` (relative). The smallest budget (fewest seconds) whose seed-mean does so is reported.

Statistics over seeds: :func:`mtlflow.metrics.intervals.mean_interval` (mean and 95 % bootstrap interval of the
per-seed means) and :func:`~mtlflow.metrics.intervals.compare` for teleported vs not.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback, StepState, TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import capture_rng_state, restore_rng_state
from mtlflow.engine.trainer import Trainer
from mtlflow.experiments.bench import SyntheticCelebA
from mtlflow.jobs import resolved_hparams
from mtlflow.metrics.intervals import compare, mean_interval
from mtlflow.teleport.callback import CostTeleport
from mtlflow.teleport.objective import balance_weights, sample_perturbation, sharpness_loss
from mtlflow.teleport.triggers import dominated_conflict, gradient_stats


@dataclass(frozen=True)
class MechanismConfig:
    """One mechanism study: the problem, the base method, the forks and the budget sweep."""

    tasks: int = 40
    width: int = 8
    image_size: int = 16
    samples: int = 512
    batch_size: int = 32
    method: str = "fairgrad"
    lr: float = 1e-3
    #: trigger events forked per seed, and the base-method steps searched for them at most
    events: int = 2
    max_steps: int = 200
    #: plain steps after the trigger step in both branches
    horizon: int = 10
    #: COST's options (the paper variant's defaults unless given; the trigger Eq. 3's unless given: the trigger
    #: steps are searched with Eq. 3, so another rule only serves tests, e.g. ``always``)
    teleport_options: Mapping[str, Any] = field(default_factory=dict)
    #: fixed perturbations ε_j of the L_g measurement (the same before and after a teleport)
    probes: int = 8
    #: adapter budgets (steps, lr) of the sweep; lr None = the options' lr
    budgets: tuple[tuple[int, float | None], ...] = ((8, None), (32, None), (8, 2e-2), (32, 2e-2), (128, 2e-2))
    gain_margin: float = 0.10
    tolerance: float = 0.02
    threads: int | None = 1

    def validate(self) -> None:
        if min(self.events, self.horizon, self.max_steps, self.probes, self.tasks - 1) < 1 or not self.budgets:
            raise InvalidParameterError("cost-mechanism: events, horizon, max_steps and probes must be >= 1, "
                                        "tasks >= 2 and budgets non-empty")

    def options(self, steps: int | None = None, lr: float | None = None) -> dict[str, Any]:
        chosen = {"trigger": "dominated", **dict(self.teleport_options), "max_per_epoch": 1}
        if steps is not None:
            chosen["steps"] = steps
        if lr is not None:
            chosen["lr"] = lr
        return chosen


class _Probe(Callback):
    """Reads what the trainer computed in a step without changing it: the batch's losses and per-task
    gradients (``after_gradients`` of the first attempt) and the parameters right before the optimizer step
    (after a teleport these are the teleported point)."""

    name = "cost-mechanism-probe"

    def __init__(self) -> None:
        self.losses: Tensor | None = None
        self.grads: Tensor | None = None
        self.pre_update: dict[str, Tensor] | None = None
        self.keep_pre_update = False

    @property  # type: ignore[override]
    def needs_jacobian(self) -> bool:
        return True

    def after_gradients(self, trainer: TrainerView, state: StepState) -> bool:
        self.losses = state.losses.detach().to("cpu", torch.float64).clone()
        self.grads = None if state.grads is None else state.grads.detach().clone()
        return False

    def before_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        if self.keep_pre_update:
            self.pre_update = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _seed_of(seed: int, step: int) -> int:
    return seed * 100_003 + step


def build_trainer(config: MechanismConfig, seed: int, device: str = "cpu"):
    """A real trainer of ``config.method`` on the synthetic CelebA problem (no run directory is written)."""
    bench = SyntheticCelebA(config.tasks, config.width, config.image_size)
    data = bench.data(config.samples, seed=seed)
    # the trainer sets torch's thread count from ``threads`` (the callers restore it)
    run = RunConfig(method=config.method, batch_size=config.batch_size, device=device, seed=seed, lr=config.lr,
                    threads=config.threads, hparams=resolved_hparams(bench, config.method, None))
    return Trainer(bench, data, run, out_dir=Path("/nonexistent-cost-mechanism-run"), progress=False)


def training_batches(trainer, count: int, seed: int) -> list[Any]:
    """``count`` batches of seeded shuffled passes over the training split (the same for every branch)."""
    batches: list[Any] = []
    epoch = 0
    while len(batches) < count:
        loader = trainer.bench.make_loader(trainer.data.splits["train"], trainer.config.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(_seed_of(seed, epoch)))
        batches.extend(loader)
        epoch += 1
    return batches[:count]


# ------------------------------------------------------------------------------------------ the fork


def snapshot(trainer) -> dict[str, Any]:
    """Everything a step reads or writes: model, optimizer, method, step counter and the RNG."""
    return {"model": copy.deepcopy(trainer.model.state_dict()),
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
            "method": copy.deepcopy(trainer.method.state_dict()),
            "reused_weights": None if trainer.reused_weights is None else trainer.reused_weights.clone(),
            "global_step": trainer.global_step, "rng": capture_rng_state()}


def restore(trainer, state: Mapping[str, Any]) -> None:
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
    trainer.method.load_state_dict(copy.deepcopy(state["method"]))
    trainer.reused_weights = None if state["reused_weights"] is None else state["reused_weights"].clone()
    trainer.global_step = state["global_step"]
    restore_rng_state(state["rng"])


def _step(trainer, batch: Any, probe: _Probe, teleport: CostTeleport | None = None) -> dict[str, Any] | None:
    """One trainer step on ``batch`` (``teleport``: with the COST callback attached for this step only);
    returns the teleport's event when one happened."""
    extra: list[Callback] = [] if teleport is None else [teleport]
    trainer.callbacks = [*extra, probe]
    try:
        if teleport is not None:
            teleport.on_train_start(trainer)
            teleport.on_epoch_start(trainer, 1)
        trainer.train_step(batch, epoch=1)
        if teleport is None:
            return None
        record: dict[str, Any] = {}
        teleport.on_epoch_end(trainer, record)
        events = record["cost"]["events"]
        return events[0] if events else None
    finally:
        trainer.callbacks = []


def run_steps(trainer, batches: Sequence[Any], probe: _Probe) -> list[dict[str, Any]]:
    """Plain steps; per step the batch's losses and conflict as the step saw them (before its update)."""
    rows = []
    for batch in batches:
        _step(trainer, batch, probe)
        rows.append(_step_row(probe))
    return rows


def _step_row(probe: _Probe) -> dict[str, Any]:
    assert probe.losses is not None and probe.grads is not None
    stats = gradient_stats(probe.grads)
    return {"mean_loss": float(probe.losses.mean()), "dominated": bool(dominated_conflict(stats)),
            "conflicting": stats.conflicting}


# ------------------------------------------------------------------------------------- measurements


def shared_names(trainer) -> list[str]:
    ids = {id(p) for p in trainer.shared}
    return [n for n, p in trainer.model.named_parameters() if id(p) in ids]


def sharpness_probes(trainer, count: int, radius: float, noise: str, seed: int) -> list[dict[str, Tensor]]:
    """``count`` fixed perturbations ε_j of the shared parameters (Eq. 8's sphere ‖ε‖ = δ)."""
    params = dict(trainer.model.named_parameters())
    shapes = {n: params[n].shape for n in shared_names(trainer)}
    first = params[next(iter(shapes))]
    generator = torch.Generator().manual_seed(seed)
    return [sample_perturbation(shapes, radius, noise, generator, first.dtype, first.device) for _ in range(count)]


def measure_point(trainer, state: Mapping[str, Tensor], batch: Any, balance: Tensor,
                  probes: Sequence[Mapping[str, Tensor]]) -> dict[str, Any]:
    """At the model state ``state`` on ``batch`` (train mode, on a copy: the trainer is untouched): the task
    losses, the per-task gradients' statistics and L_g of Eq. 9 with the fixed perturbations ``probes``."""
    model = copy.deepcopy(trainer.model)
    model.load_state_dict(state)
    model.train()
    inputs, targets = trainer.inputs_targets(batch)
    names = shared_names(trainer)
    params = dict(model.named_parameters())
    shared = [params[n] for n in names]
    losses = torch.stack(trainer.task_losses(model(inputs), targets))
    rows = []
    for i in range(losses.numel()):
        grads = torch.autograd.grad(losses[i], shared, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                               for g, p in zip(grads, shared, strict=True)]))
    stats = gradient_stats(torch.stack(rows))
    with torch.no_grad():
        perturbed = []
        for eps in probes:
            overrides = {n: params[n] + eps[n] for n in names}
            preds = torch.func.functional_call(model, overrides, (inputs,))
            perturbed.append(torch.stack(trainer.task_losses(preds, targets)))
        l_g = sharpness_loss(losses.detach(), torch.stack(perturbed), balance, "max-of-mean", 1.0)
    return {"losses": losses.detach().to(torch.float64), "stats": stats, "sharpness": float(l_g)}


def _weakest(stats) -> tuple[int, float]:
    i = int(torch.argmin(stats.norms))
    return i, float(stats.cos_to_mean[i])


def teleport_at(trainer, batch: Any, config: MechanismConfig, options: Mapping[str, Any], seed: int,
                probe: _Probe) -> dict[str, Any]:
    """From the trainer's current state: the COST step on ``batch`` and the paper's quantities before vs after
    the teleport on that batch. Leaves the trainer after the teleported (and redone) step."""
    before_state = copy.deepcopy(trainer.model.state_dict())
    cost = CostTeleport(options)
    probe.keep_pre_update = True
    try:
        event = _step(trainer, batch, probe, cost)
    finally:
        probe.keep_pre_update = False
    if event is None:
        raise InvalidParameterError("the teleport did not fire at a step where Eq. 3 holds (the trainer's and the "
                                    "probe's gradients differ)")
    assert probe.pre_update is not None
    norms = torch.tensor(list(event["grad_norms_before"].values()), dtype=torch.float64)
    balance = balance_weights(norms, cost.resolved.balance)
    eps = sharpness_probes(trainer, config.probes, cost.resolved.radius, cost.resolved.noise,
                           _seed_of(seed, event["step"]) + 7)
    before = measure_point(trainer, before_state, batch, balance, eps)
    after = measure_point(trainer, probe.pre_update, batch, balance, eps)
    change = (after["losses"] - before["losses"]).abs() / before["losses"].abs().clamp_min(1e-12)
    weakest_before, cos_before = _weakest(before["stats"])
    weakest_after, cos_after = _weakest(after["stats"])
    lg_before, lg_after = before["sharpness"], after["sharpness"]
    gain = lg_after / lg_before - 1.0 if lg_before > 0 else float("nan")
    return {
        "step": event["step"], "reason": event["reason"],
        "losses_before": [float(v) for v in before["losses"]], "losses_after": [float(v) for v in after["losses"]],
        "loss_change_max_relative": float(change.max()),
        "sharpness_before": lg_before, "sharpness_after": lg_after, "sharpness_gain": gain,
        "adapter_sharpness_first": event["sharpness_first"], "adapter_sharpness_last": event["sharpness_last"],
        "adapter_invariance_last": event["invariance_last"],
        "grad_norms_before": [float(v) for v in before["stats"].norms],
        "grad_norms_after": [float(v) for v in after["stats"].norms],
        "mean_grad_norm_before": before["stats"].mean_norm, "mean_grad_norm_after": after["stats"].mean_norm,
        "conflicting_before": before["stats"].conflicting, "conflicting_after": after["stats"].conflicting,
        "weakest_cos_before": cos_before, "weakest_cos_after": cos_after,
        "weakest_task_before": weakest_before, "weakest_task_after": weakest_after,
        "dominated_before": bool(dominated_conflict(before["stats"])),
        "dominated_resolved": not dominated_conflict(after["stats"]),
        "displacement_relative": event["displacement_relative"], "sigma": event["sigma"],
        "seconds": event["seconds"],
        "achieved": bool(gain >= config.gain_margin and float(change.max()) <= config.tolerance),
    }


def fork(trainer, batches: Sequence[Any], index: int, config: MechanismConfig, seed: int,
         probe: _Probe) -> dict[str, Any]:
    """At step ``index`` (a trigger step): branch (a) teleport + ``horizon`` steps, branch (b) the same steps
    without the teleport, then the budget sweep; the trainer is left as branch (b) after its trigger step."""
    start = snapshot(trainer)
    following = batches[index + 1: index + 1 + config.horizon]
    teleported = teleport_at(trainer, batches[index], config, config.options(), seed, probe)
    branch_a = run_steps(trainer, following, probe)
    restore(trainer, start)
    sweep = []
    for steps, lr in config.budgets:
        row = teleport_at(trainer, batches[index], config, config.options(steps, lr), seed, probe)
        sweep.append({"steps": steps, "lr": lr if lr is not None else CostTeleport(config.options()).resolved.lr,
                      **{k: row[k] for k in ("sharpness_gain", "loss_change_max_relative", "seconds", "achieved",
                                             "dominated_resolved", "displacement_relative")}})
        restore(trainer, start)
    _step(trainer, batches[index], probe)
    after_trigger = snapshot(trainer)
    branch_b = run_steps(trainer, following, probe)
    restore(trainer, after_trigger)
    return {"teleport": teleported, "sweep": sweep, "continuation": _continuation(branch_a, branch_b)}


def _continuation(teleported: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
        return {"mean_loss": statistics.fmean(r["mean_loss"] for r in rows),
                "dominated_ratio": statistics.fmean(float(r["dominated"]) for r in rows),
                "conflicting_mean": statistics.fmean(r["conflicting"] for r in rows)}
    if not teleported:
        return {}
    a, b = summary(teleported), summary(plain)
    return {"teleported": a, "plain": b, "steps": len(teleported),
            "mean_loss_difference": a["mean_loss"] - b["mean_loss"],
            "dominated_ratio_difference": a["dominated_ratio"] - b["dominated_ratio"]}


# ---------------------------------------------------------------------------------------------- runs


def run_seed(config: MechanismConfig, seed: int, device: str = "cpu", say=None) -> dict[str, Any]:
    """Train the base method until ``config.events`` trigger steps (Eq. 3) have been forked or ``max_steps``
    steps have run; the trigger ratio counts every step searched."""
    trainer = build_trainer(config, seed, device)
    probe = _Probe()
    batches = training_batches(trainer, config.max_steps + config.horizon + 1, seed)
    events, checked, fired = [], 0, 0
    started = time.perf_counter()
    for index in range(config.max_steps):
        before = snapshot(trainer)
        _step(trainer, batches[index], probe)
        row = _step_row(probe)
        checked += 1
        fired += row["dominated"]
        if row["dominated"] and len(events) < config.events:
            restore(trainer, before)
            events.append(fork(trainer, batches, index, config, seed, probe))
            if say:
                t = events[-1]["teleport"]
                say(f"seed {seed} step {index}: L_g {t['sharpness_before']:.4g} -> {t['sharpness_after']:.4g}, "
                    f"max |ΔL|/L {100 * t['loss_change_max_relative']:.2f} %, resolved {t['dominated_resolved']}")
        if len(events) >= config.events:
            break
    return {"seed": seed, "steps_searched": checked, "trigger_steps": fired,
            "trigger_ratio": fired / checked if checked else None, "events": events,
            "seconds": time.perf_counter() - started}


def _fmean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.fmean(values) if values else None


def seed_summary(result: Mapping[str, Any], config: MechanismConfig) -> dict[str, Any]:
    """The per-seed means over its events (what the statistics over seeds resample)."""
    events = result["events"]
    tele = [e["teleport"] for e in events]
    cont = [e["continuation"] for e in events if e["continuation"]]
    out: dict[str, Any] = {
        "seed": result["seed"], "events": len(events), "trigger_ratio": result["trigger_ratio"],
        "achieved_share": _fmean([float(t["achieved"]) for t in tele]),
        "sharpness_gain": _fmean([t["sharpness_gain"] for t in tele]),
        "loss_change_max_relative": _fmean([t["loss_change_max_relative"] for t in tele]),
        "resolved_share": _fmean([float(t["dominated_resolved"]) for t in tele]),
        "grad_norm_ratio": _fmean([t["mean_grad_norm_after"] / t["mean_grad_norm_before"] for t in tele]),
        "teleport_seconds": _fmean([t["seconds"] for t in tele]),
        "next_mean_loss_teleported": _fmean([c["teleported"]["mean_loss"] for c in cont]),
        "next_mean_loss_plain": _fmean([c["plain"]["mean_loss"] for c in cont]),
        "next_dominated_teleported": _fmean([c["teleported"]["dominated_ratio"] for c in cont]),
        "next_dominated_plain": _fmean([c["plain"]["dominated_ratio"] for c in cont]),
        "budgets": [],
    }
    for b, (steps, _) in enumerate(config.budgets):
        rows = [e["sweep"][b] for e in events]
        if rows:
            out["budgets"].append({"steps": steps, "lr": rows[0]["lr"],
                                   "sharpness_gain": _fmean([r["sharpness_gain"] for r in rows]),
                                   "loss_change_max_relative": _fmean([r["loss_change_max_relative"] for r in rows]),
                                   "achieved_share": _fmean([float(r["achieved"]) for r in rows]),
                                   "resolved_share": _fmean([float(r["dominated_resolved"]) for r in rows]),
                                   "seconds": _fmean([r["seconds"] for r in rows])})
    return out


def _interval(values: Sequence[float | None]) -> dict[str, Any] | None:
    kept = [float(v) for v in values if v is not None and v == v]
    return mean_interval(kept).as_dict() if kept else None


def summarise(config: MechanismConfig, seeds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and 95 % interval over seeds of every per-seed quantity; teleported vs plain continuation compared;
    per budget whether the seed mean achieves the objective and the cheapest that does."""
    keys = ("trigger_ratio", "achieved_share", "sharpness_gain", "loss_change_max_relative", "resolved_share",
            "grad_norm_ratio", "teleport_seconds", "next_mean_loss_teleported", "next_mean_loss_plain",
            "next_dominated_teleported", "next_dominated_plain")
    with_events = [s for s in seeds if s["events"]]
    out: dict[str, Any] = {k: _interval([s[k] for s in (seeds if k == "trigger_ratio" else with_events)])
                           for k in keys}
    paired = [(s["next_mean_loss_teleported"], s["next_mean_loss_plain"]) for s in with_events
              if s["next_mean_loss_teleported"] is not None]
    if len(paired) >= 2:
        out["next_mean_loss_comparison"] = compare([a for a, _ in paired], [b for _, b in paired], True).as_dict()
    budgets = []
    for b, (steps, _) in enumerate(config.budgets):
        rows = [s["budgets"][b] for s in with_events if len(s["budgets"]) > b]
        if not rows:
            continue
        gain = _interval([r["sharpness_gain"] for r in rows])
        change = _interval([r["loss_change_max_relative"] for r in rows])
        budgets.append({"steps": steps, "lr": rows[0]["lr"], "sharpness_gain": gain, "loss_change_max_relative": change,
                        "achieved_share": _interval([r["achieved_share"] for r in rows]),
                        "resolved_share": _interval([r["resolved_share"] for r in rows]),
                        "seconds": _interval([r["seconds"] for r in rows]),
                        "achieves": bool(gain and change and gain["mean"] >= config.gain_margin
                                         and change["mean"] <= config.tolerance)})
    out["budgets"] = budgets
    achieving = [b for b in budgets if b["achieves"]]
    out["smallest_achieving_budget"] = (min(achieving, key=lambda b: b["seconds"]["mean"]) if achieving else None)
    return out


@contextlib.contextmanager
def _restored_threads():
    """The trainers set torch's process-wide thread count from ``threads``; the caller's is restored after."""
    previous = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run(config: MechanismConfig, seeds: Sequence[int], device: str = "cpu", say=None) -> dict[str, Any]:
    """Every seed's forks and the statistics over seeds."""
    config.validate()
    with _restored_threads():
        results = [run_seed(config, seed, device, say) for seed in seeds]
    per_seed = [seed_summary(r, config) for r in results]
    return {"per_seed": per_seed, "summary": summarise(config, per_seed), "runs": results}


def config_from(mapping: Mapping[str, Any]) -> MechanismConfig:
    """A :class:`MechanismConfig` from a claim's configuration (lists become tuples)."""
    known = set(MechanismConfig.__dataclass_fields__)
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise InvalidParameterError(f"unknown cost-mechanism settings {', '.join(unknown)}; "
                                    f"valid: {', '.join(sorted(known))}")
    values = dict(mapping)
    if "budgets" in values:
        values["budgets"] = tuple((int(s), None if lr is None else float(lr)) for s, lr in values["budgets"])
    chosen = MechanismConfig(**values)
    chosen.validate()
    return chosen


# ------------------------------------------------------------------------- the claim (`mtlflow reproduce`)


def _json_run(result: Mapping[str, Any]) -> dict[str, Any]:
    """A seed's run as JSON (lists and numbers only): every event with its teleport, sweep and continuation."""
    return {k: result[k] for k in ("seed", "steps_searched", "trigger_steps", "trigger_ratio", "events", "seconds")}


def claim_seed(config: Mapping[str, Any], seed: int, ctx) -> dict[str, Any]:
    """One seed of the ``cost-mechanism`` claim: its value is the share of its trigger events where the teleport
    with the configured (default) budget achieves its objective."""
    chosen = config_from(config)
    with _restored_threads():
        result = run_seed(chosen, seed, ctx.device, ctx.say)
    summary = seed_summary(result, chosen)
    if not result["events"]:
        raise InvalidParameterError(f"seed {seed}: the dominated-conflict trigger (Eq. 3) never fired in "
                                    f"{chosen.max_steps} steps; raise max_steps")
    ctx.say(f"seed {seed}: trigger ratio {summary['trigger_ratio']:.3f}, objective achieved in "
            f"{summary['achieved_share']:.2f} of {summary['events']} teleports")
    return {"value": summary["achieved_share"], "summary": summary, "run": _json_run(result)}


def claim_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx) -> dict[str, Any]:
    """The statistics over seeds of every quantity and the budget sweep (:func:`summarise`)."""
    chosen = config_from(config)
    per_seed = [p["summary"] for p in parts]
    return {"values": [p["value"] for p in parts],
            "details": {"summary": summarise(chosen, per_seed), "per_seed": per_seed,
                        "runs": [p["run"] for p in parts]}}
