"""COST as a trainer callback: teleport the shared trunk when a trigger fires, then let any base method
continue (COST paper, Alg. 1; Zhou et al., NeurIPS 2025).

Per step (the trainer's callback hooks, ``mtlflow.core.callbacks``):

1. ``after_gradients`` -- from the per-task gradients of the step (which the callback asks the trainer
   for through ``needs_jacobian``, also for loss-weighting base methods) the trigger rule is checked
   (:mod:`mtlflow.teleport.triggers`), subject to the delayed start E and the per-epoch cap (App. A.6).
   The conflict and trigger telemetry is measured on every checked step of the epoch, also after the
   cap has stopped teleports, so that the epoch's ratios (Fig. 5(a)) describe the whole epoch.
   When it fires: freeze the trunk, train PEFT adapters on L_t − γ·L_g (:mod:`.objective`), merge
   them, copy the merged weights into the trainer's parameter tensors, and ask the trainer to redo the
   step at the new point (same batch: the base method then computes its update there).
2. ``before_optimizer_step`` of the redone step -- record the gradients and losses after the teleport
   and apply HTR (Eqs. 12–13, :mod:`.htr`) to the optimizer that is about to step.
3. ``after_optimizer_step`` -- restore the betas (σ = 1 again).
4. ``on_epoch_end`` -- ``record["cost"]``: teleports, checked and triggering steps, the dominated-conflict
   ratio (Fig. 5(a)), and one entry per teleport (reason, losses, conflicts, cosines and gradient norms
   before/after, σ, adapter steps, seconds); ``mtlflow_teleports_total`` is exported from it.

A teleport runs under a forked RNG seeded from (seed, step), so it is reproducible, does not shift the
base method's random stream, and a resumed run teleports exactly as an uninterrupted one.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from mtlflow.core.callbacks import Callback, StepState, TrainerView
from mtlflow.teleport import adapters
from mtlflow.teleport.htr import HtrStep, apply_htr, htr_sigma, restart_moments, restore_htr
from mtlflow.teleport.objective import TeleportProblem, balance_weights, optimise_adapter
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import RULES, GradientStats, describe, dominated_conflict, gradient_stats, needs_pairwise


def _flat(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _flat_grads(params: list[Tensor]) -> Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1) for p in params])


class _Batches:
    """Batch 0 is the trigger batch; batches 1.. come from a seeded pass over the training split.

    With ``count = 0`` every training batch is used; they are streamed (a pass re-creates the loader
    with the same seed), so the adapter loop must visit indices in cyclic order, as it does.
    """

    def __init__(self, trainer: TrainerView, trigger_batch: Any, count: int, seed: int):
        self.trainer, self.trigger, self.seed = trainer, trigger_batch, seed
        self._iter: Iterator | None = None
        self._index = 0
        self._current: Any = None
        n_loader = len(self._loader())
        self.n = 1 + (n_loader if count == 0 else min(count - 1, n_loader))

    def _loader(self):
        cfg = self.trainer.config
        return self.trainer.bench.make_loader(self.trainer.data.splits["train"], cfg.batch_size, shuffle=True,
                                              generator=torch.Generator().manual_seed(self.seed))

    def get(self, index: int) -> Any:
        if index == 0:
            return self.trigger
        if index == self._index:
            return self._current
        if index == 1 or self._iter is None:
            self._iter = iter(self._loader())
            self._index = 0
        if index != self._index + 1:  # pragma: no cover - the adapter loop is cyclic
            raise RuntimeError(f"teleport batches must be visited in order, asked for {index} after {self._index}")
        self._current = next(self._iter)
        self._index = index
        return self._current


def _seed(base: int, step: int) -> int:
    return (base * 1_000_003 + step * 7_919 + 17) % (2**63 - 1)


class CostTeleport(Callback):
    """COST symmetry teleportation on top of any base method (``--teleport cost``)."""

    name = "cost"

    def __init__(self, options: CostOptions | Mapping[str, Any] | None = None):
        self.options = options if isinstance(options, CostOptions) else CostOptions.from_mapping(options)
        self.options.validate()
        self.resolved = self.options.resolved()
        self.rule = RULES[self.resolved.trigger]
        self.total_teleports = 0
        self._active = True  # until the first epoch starts: the trainer checks at construction what we need
        #: the model's buffers (BatchNorm running statistics) before the current step's forward pass
        self._buffers: dict[str, Tensor] | None = None
        self._epoch_step = 0
        self._pending: dict[str, Any] | None = None
        self._htr_step: HtrStep | None = None
        self._last_update: Tensor | None = None
        self._task_names: list[str] = []
        self._reset_epoch()

    # -- what the trainer computes for us --------------------------------------------------------------
    @property  # type: ignore[override]
    def needs_jacobian(self) -> bool:
        """Per-task gradients on every checked step after the delayed start (telemetry of the whole epoch,
        also once the cap stops teleports) and on the redone step."""
        return self._active and (self._pending is not None or self._epoch_step % self.resolved.check_every == 0)

    def check(self, trainer: TrainerView) -> None:
        """Reject what COST cannot wrap, before training starts (called by the trainer's constructor)."""
        # a method with its own step (custom_step) is refused by RunConfig, which every Trainer is built from
        adapters.check_wrappable(trainer.model, len(trainer.tasks), self.resolved.adapter)

    def _reset_epoch(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._checked = self._fired = self._dominated = 0
        self._check_seconds = 0.0

    # -- hooks ---------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: TrainerView) -> None:
        importlib.import_module("peft")  # ~4 s once, here, so that no epoch pays it

        self._task_names = [t.name for t in trainer.tasks]

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        self._reset_epoch()
        self._epoch_step = 0
        self._active = epoch > self.resolved.delay_epochs and self.resolved.max_per_epoch > 0
        self._remember_buffers(trainer)

    def _remember_buffers(self, trainer: TrainerView) -> None:
        """Keep the buffers as they are before the next step's forward pass when that step may teleport: the
        teleported step is redone, and its discarded first forward must not update BatchNorm's running
        statistics (one step, one update, as the base method)."""
        may_teleport = self._active and len(self._events) < self.resolved.max_per_epoch \
            and self._epoch_step % self.resolved.check_every == 0
        self._buffers = {n: b.detach().clone() for n, b in trainer.model.named_buffers()} if may_teleport else None

    def _restore_buffers(self, trainer: TrainerView) -> None:
        if self._buffers is None:  # pragma: no cover - _remember_buffers ran for every step that may teleport
            raise RuntimeError("COST: no buffers recorded before a teleporting step")
        with torch.no_grad():
            for name, buffer in trainer.model.named_buffers():
                buffer.copy_(self._buffers[name])

    def after_gradients(self, trainer: TrainerView, state: StepState) -> bool:
        if not self._active or self._pending is not None or state.grads is None:
            return False
        if self._epoch_step % self.resolved.check_every != 0:
            return False
        started = time.perf_counter()
        stats = gradient_stats(state.grads, pairwise=needs_pairwise(self.resolved.trigger))
        self._checked += 1
        self._dominated += int(dominated_conflict(stats))
        fires = self.rule(stats)
        self._fired += int(fires)  # the trigger ratio counts the steps where the rule holds, capped or not
        self._check_seconds += time.perf_counter() - started
        if not fires or len(self._events) >= self.resolved.max_per_epoch:
            return False
        self._restore_buffers(trainer)
        self._pending = self._teleport(trainer, state, stats)
        return True

    def before_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        opts = self.resolved
        event = self._pending
        if event is not None:
            self._record_after(event, state)
            if opts.htr:
                self._apply_htr(trainer, event)
        if opts.htr and opts.htr_reference == "last-update":
            self._last_update = _flat_grads(trainer.shared)

    def _apply_htr(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        """HTR for the step after a teleport: Eq. 13 with σ, or Adam restarted for the trunk where σ ≤ 0."""
        raw = event["sigma_raw"]
        if self.resolved.htr_nonpositive == "restart" and raw is not None and raw <= 0:
            event["htr_applied"] = event["htr_restarted"] = restart_moments(trainer.optimizer, trainer.shared)
            return
        self._htr_step = apply_htr(trainer.optimizer, trainer.shared, event["sigma"])
        event["htr_applied"] = bool(self._htr_step)
        if self._htr_step:
            event["htr_betas"] = [list(g["betas"]) for g, _ in self._htr_step.groups]

    def after_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        if self._htr_step is not None:
            restore_htr(self._htr_step, self.resolved.htr_bias_correction)
            self._htr_step = None
        if self._pending is not None:
            self._events.append(self._pending)
            self.total_teleports += 1
            self._pending = None
        self._epoch_step += 1
        self._remember_buffers(trainer)

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        record["cost"] = epoch_summary(self._events, self._checked, self._fired, self._dominated,
                                      self.options.as_dict(), self.resolved.as_dict())
        record["cost"]["check_seconds"] = self._check_seconds

    def state_dict(self) -> dict[str, Any]:
        return {"total_teleports": self.total_teleports, "last_update": self._last_update}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total_teleports = int(state.get("total_teleports", 0))
        self._last_update = state.get("last_update")

    # -- the teleport ----------------------------------------------------------------------------------------
    def _teleport(self, trainer: TrainerView, state: StepState, stats: GradientStats) -> dict[str, Any]:
        opts = self.resolved
        started = time.perf_counter()
        shared = trainer.shared
        theta_before = _flat(shared).clone()
        if opts.htr_reference == "last-update" and self._last_update is not None:
            reference = self._last_update
        else:  # the gradient at the pre-teleport point (of the mean loss), also on a first-step teleport
            reference = state.grads.detach().mean(dim=0)
        seed = _seed(trainer.config.seed, trainer.global_step)
        devices = [trainer.device] if trainer.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed)
            adapted = adapters.inject(trainer.model, shared, opts.adapter, opts.rank)
            adapted.model.train(not opts.eval_mode)
            if not opts.eval_mode:  # BatchNorm as in training (batch statistics), dropout off: see _deterministic
                _deterministic(adapted.model)
            batches = _Batches(trainer, state.batch, opts.batches, seed)
            problem = self._problem(trainer, adapted, batches, stats)
            steps = opts.steps if opts.passes is None else opts.passes * batches.n
            trace = optimise_adapter(problem, opts, steps, opts.lr or trainer.config.lr, generator)
            merged = adapters.merge_and_unload(adapted)
            adapters.copy_shared_into(merged, trainer.model, shared)
        displacement = _flat(shared) - theta_before
        sigma, raw = htr_sigma(displacement, reference)
        names = self._task_names
        return {
            "step": trainer.global_step,
            "epoch": state.epoch,
            "trigger": opts.trigger,
            "reason": describe(opts.trigger, stats, names),
            "losses_before": dict(zip(names, map(float, state.losses), strict=True)),
            "conflicting_before": stats.conflicting,
            "cosine_to_mean_before": dict(zip(names, map(float, stats.cos_to_mean), strict=True)),
            "grad_norms_before": dict(zip(names, map(float, stats.norms), strict=True)),
            "mean_grad_norm_before": stats.mean_norm,
            "min_pairwise_cos_before": _min_pairwise(stats),
            "balance_weights": [float(r) for r in problem.balance],
            "adapter": opts.adapter,
            "adapter_steps": trace.steps,
            "adapter_batches": batches.n,
            # one trace entry per adapter step, and the options give at least one step (steps, passes >= 1)
            "invariance_first": trace.invariance[0],
            "invariance_last": trace.invariance[-1],
            "sharpness_first": trace.sharpness[0],
            "sharpness_last": trace.sharpness[-1],
            "displacement_norm": float(displacement.norm()),
            "displacement_relative": float(displacement.norm() / theta_before.norm().clamp_min(1e-30)),
            "sigma": sigma,
            "sigma_raw": raw,
            "htr_reference": opts.htr_reference,
            "htr_applied": False,
            "htr_restarted": False,
            "seconds": time.perf_counter() - started,
        }

    def _problem(self, trainer: TrainerView, adapted: adapters.AdaptedModel, batches: _Batches,
                 stats: GradientStats) -> TeleportProblem:
        """The teleport's :class:`TeleportProblem` on the adapted copy of the trainer's model."""
        opts = self.resolved
        model = adapted.model
        params = dict(model.named_parameters())
        base = {n: params[n] for n in adapted.shared_names}
        amp = trainer.config.amp == "bf16"
        prepared: dict[int, tuple[Any, list[Tensor]]] = {}

        def losses(index: int, eps: Mapping[str, Tensor] | None) -> Tensor:
            if index == 0 and 0 in prepared:
                inputs, targets = prepared[0]
            else:
                inputs, targets = trainer.inputs_targets(batches.get(index))
                if opts.batch_size and isinstance(inputs, Tensor):
                    inputs, targets = inputs[:opts.batch_size], [t[:opts.batch_size] for t in targets]
                if index == 0:
                    prepared[0] = (inputs, targets)
            with torch.autocast(trainer.device.type, dtype=torch.bfloat16, enabled=amp):
                if eps is None:
                    preds = model(inputs)
                else:
                    overrides = {n: base[n] + eps[n] for n in eps}
                    preds = torch.func.functional_call(model, overrides, (inputs,))
                stacked = torch.stack(trainer.task_losses(preds, targets))
                # bf16 autocast losses are compared in float32; a float64 model keeps float64
                return stacked if stacked.dtype == torch.float64 else stacked.float()

        with torch.no_grad():
            rows = [losses(b, None) for b in range(batches.n)]
        targets = torch.stack(rows)
        if opts.invariance_target == "mean":
            targets = targets.mean(dim=0, keepdim=True)
        first = base[adapted.shared_names[0]]
        return TeleportProblem(losses=losses, perturbation_shapes={n: base[n].shape for n in adapted.shared_names},
                               adapter_parameters=adapted.adapter_parameters, targets=targets,
                               balance=balance_weights(stats.norms, opts.balance), n_batches=batches.n,
                               dtype=first.dtype, device=first.device)

    def _record_after(self, event: dict[str, Any], state: StepState) -> None:
        names = self._task_names
        before = torch.tensor(list(event["losses_before"].values()), dtype=torch.float64)
        after = state.losses.detach().to("cpu", torch.float64)
        event["losses_after"] = dict(zip(names, map(float, after), strict=True))
        event["loss_change_max_abs"] = float((after - before).abs().max())
        event["loss_change_max_relative"] = float(((after - before).abs() / before.abs().clamp_min(1e-12)).max())
        if state.grads is not None:
            stats = gradient_stats(state.grads, pairwise=needs_pairwise(self.resolved.trigger))
            event["min_pairwise_cos_after"] = _min_pairwise(stats)
            event["conflicting_after"] = stats.conflicting
            event["cosine_to_mean_after"] = dict(zip(names, map(float, stats.cos_to_mean), strict=True))
            event["grad_norms_after"] = dict(zip(names, map(float, stats.norms), strict=True))
            event["mean_grad_norm_after"] = stats.mean_norm


def _deterministic(model: nn.Module) -> None:
    """Switch the stochastic layers (dropout) of a train-mode model to eval mode.

    Inside a teleport L_t compares losses with their pre-teleport values and L_g compares perturbed with
    unperturbed losses: with dropout active both measure the dropout noise (L_t at Δθ = 0 would be
    0.002-0.04 on the Office ResNet) rather than the teleport. BatchNorm keeps its training behaviour."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.eval()


def _min_pairwise(stats: GradientStats) -> float | None:
    """The most negative cosine between two task gradients (when the rule computed them)."""
    if stats.pairwise_cos is None:
        return None
    k = stats.n_tasks
    return float((stats.pairwise_cos + 3.0 * torch.eye(k, dtype=torch.float64)).min())


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def epoch_summary(events: list[dict[str, Any]], checked: int, fired: int, dominated: int,
                  options: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """The epoch record's ``cost`` entry: counts, ratios, telemetry averages and every teleport."""
    return {
        "teleports": len(events),
        "checked_steps": checked,
        "trigger_steps": fired,
        "trigger_ratio": fired / checked if checked else None,
        "dominated_conflict_ratio": dominated / checked if checked else None,
        "seconds": sum(e["seconds"] for e in events),
        "conflicting_before_mean": _mean([e["conflicting_before"] for e in events]),
        "conflicting_after_mean": _mean([e.get("conflicting_after") for e in events]),
        "mean_grad_norm_before_mean": _mean([e["mean_grad_norm_before"] for e in events]),
        "mean_grad_norm_after_mean": _mean([e.get("mean_grad_norm_after") for e in events]),
        "loss_change_max_abs_mean": _mean([e.get("loss_change_max_abs") for e in events]),
        "sigma_mean": _mean([e["sigma"] for e in events]),
        "options": options,
        "resolved_options": resolved,
        "events": events,
    }
