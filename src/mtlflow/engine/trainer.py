"""The training engine shared by every method.

One step: forward through the shared trunk and the heads, K task losses, then by method family

* loss weighting: back-propagate ``method.objective(losses)``;
* gradient methods: the gradient engine (:mod:`mtlflow.grad_engine`) computes what ``method.requires``
  asks for -- per-task gradients w.r.t. the shared parameters (backend ``config.grad_backend``, K-loop
  by default), only their Gramian (``autogram``), or gradients w.r.t. the shared features
  (``requires = REPRESENTATION`` or ``config.grad_wrt = "representation"``) -- then
  ``direction = method.combine(grads, losses)`` is written into the shared parameters' ``.grad``, or,
  for Gramian-weighting methods on the Gramian/representation paths, ``Σ w_i L_i`` is back-propagated
  to the shared parameters; every head always gets its plain gradient ``∇L_i``. A Gramian-weighting
  method with ``update_weights_every`` = N > 1 solves its weights every N steps; in between the step
  reuses them and computes no per-task gradient (one backward pass);

then, identically for every method and in this order: global rescaling (x K for methods whose
direction is a convex combination, see ``Method.natural_scale``), gradient clipping (after the
backward pass, on all parameters, when ``clip_grad_norm`` is set), ``optimizer.step()`` and the
method's ``after_optimizer_step`` hook.

After every epoch the trainer evaluates the val and test splits, writes ``metrics.json`` and a
checkpoint (model, optimizer, method state, RNG states) atomically; ``resume=True`` continues from
the last checkpoint and reaches the same final metrics as an uninterrupted run (the data order of
epoch e depends only on (seed, e)).

Run directory layout (the contract with ``evaluate``, ``aggregate`` and the pipeline components):

* ``run.json``     -- configuration, status (running/completed/failed/interrupted), data hash, versions;
* ``metrics.json`` -- per-epoch metrics per split and task, timing and memory, the selection rule and
  the selected ``final`` metrics;
* ``checkpoint.pt`` -- the last completed epoch (for ``--resume``);
* ``model.pt``     -- final weights with the benchmark name and configuration to rebuild the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from mtlflow import methods as method_registry
from mtlflow import teleport
from mtlflow.benchmarks.base import Benchmark, BenchmarkData
from mtlflow.config.run import RunConfig, autogram_needs_gramian
from mtlflow.core.callbacks import Callback, StepState
from mtlflow.core.errors import DataError, InvalidParameterError, NonFiniteLossError
from mtlflow.core.numerics import blas_on_one_thread
from mtlflow.core.seeding import capture_rng_state, epoch_generator, restore_rng_state, seed_everything
from mtlflow.engine import distributed, rundir
from mtlflow.engine import step as step_rules
from mtlflow.engine.schedulers import build_scheduler
from mtlflow.engine.step import GradientMode
from mtlflow.engine.telemetry import EpochTelemetry, cosines_to_mean, jacobian_cosines_to_mean
from mtlflow.grad_engine import (
    AutogramGramian,
    ForwardPass,
    StepProblem,
    backward_heads,
    backward_shared_weighted,
    jacobian_backend,
    representation_jacobian,
    resolve_backend,
    task_jacobian,
    write_flat_grad,
)
from mtlflow.methods.base import GradientMethod, GradInput, GramianWeighting, Method, StepContext, needs_full_jacobian
from mtlflow.metrics.evaluation import evaluate_model
from mtlflow.metrics.selection import BEST_VAL, best_epoch_index, select_final, val_split_too_small, validation_score
from mtlflow.models import architectures

EVAL_SPLITS = ("val", "test")


@dataclass
class _StepWork:
    """What the gradient engine computed for one step (see :meth:`Trainer._plan_gradients`); ``mode`` is
    ``REUSE`` on the amortised steps of a method with ``update_weights_every`` > 1."""

    mode: GradientMode
    forward: ForwardPass
    jacobian: Tensor | None = None        # [K, P] w.r.t. the shared parameters
    gramian: Tensor | None = None         # [K, K] w.r.t. the shared parameters (autogram)
    representation: Tensor | None = None  # [K, numel(z)] w.r.t. the shared features

    @property
    def losses(self) -> Tensor:
        return self.forward.stacked


class Trainer:
    """Train one method on one prepared benchmark into one run directory."""

    def __init__(self, bench: Benchmark, data: BenchmarkData, config: RunConfig, out_dir: str | Path,
                 progress: bool = True, callbacks: Sequence[Callback] = (), eval_splits: Sequence[str] = EVAL_SPLITS):
        self.bench, self.data, self.config = bench, data, config
        #: the splits evaluated after every epoch: val (it selects) and test; a tuning trial evaluates val only
        self.eval_splits = tuple(eval_splits)
        if "val" not in self.eval_splits:
            raise InvalidParameterError(f"eval_splits {self.eval_splits} lacks 'val', which selects the epoch")
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.tasks = bench.select_tasks(config.tasks)
        self.task_index = [bench.task_names.index(t.name) for t in self.tasks]
        self.device = config.resolved_device()
        #: torchrun/DDP topology (a no-op in one process): see mtlflow.engine.distributed
        self.dist = distributed.from_env(self.device)
        for split in ("train", *self.eval_splits):
            if split not in data.splits:
                raise DataError(f"prepared data lacks the {split!r} split; re-run `mtlflow prepare`")
        if config.threads is not None:  # before anything runs: the thread count changes float reductions
            torch.set_num_threads(config.threads)
        #: the budget fitted to the training rows (batch size, epochs; see :func:`fit_budget`), recorded in run.json
        self.budget = fit_budget(config, len(data.splits["train"]), self.dist.world_size)
        if (config.batch_size, config.epochs) != (self.budget["batch_size"], self.budget["max_epochs"]):
            config = self.config = dataclasses.replace(config, batch_size=self.budget["batch_size"],
                                                       epochs=self.budget["max_epochs"])
        seed_everything(config.seed, config.deterministic)
        self.model = architectures.build_model(bench, [t.name for t in self.tasks], config.architecture,
                                               config.architecture_options, data.splits["train"]).to(self.device)
        self.method: Method = method_registry.build(config.method, len(self.tasks), config.seed,
                                                    **config.hparams)
        self.method.to(self.device)
        self.callbacks: list[Callback] = list(callbacks)
        if config.teleport:  # the wrapper checks the model and method it wraps before anything runs
            wrapper = teleport.build(config.teleport, config.teleport_options)
            wrapper.check(self)
            self.callbacks.append(wrapper)
        self.method.setup(self)
        self.optimizer = self._build_optimizer()
        self.scheduler = build_scheduler(config.scheduler, config.scheduler_options, self.optimizer, bench,
                                         [t.name for t in self.tasks], self._metric_specs())
        self.shared = self.model.shared_parameters()
        self.task_params = [self.model.task_parameters(i) for i in range(len(self.tasks))]
        # per-step arguments, built once: every step of a small model pays for each list built in it
        self._head_params = [p for params in self.task_params for p in params]
        self._optimized_params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.history: list[dict[str, Any]] = []
        self.global_step = 0
        self.gradient_mode, self.grad_backend = self._plan_gradients()
        self.dist.check_supported(self)
        self._jacobian_backend = (jacobian_backend(self.grad_backend) if self.gradient_mode is GradientMode.JACOBIAN
                                  else None)
        self._autogram = AutogramGramian(self.model.trunk) if self.gradient_mode is GradientMode.GRAMIAN else None
        #: N of the method's ``update_weights_every`` (Gramian-weighting methods only)
        self.update_weights_every = (self.method.update_weights_every()
                                     if isinstance(self.method, GramianWeighting) else 1)
        #: the last solved weights, reused on amortised steps (checkpointed)
        self.reused_weights: Tensor | None = None
        #: the weights of the best validation epoch so far (select best-val; checkpointed), on the CPU
        self.best_state: dict[str, Tensor] | None = None
        #: how training ended (epochs run, best epoch, early stop, convergence), set by :meth:`fit`
        self.outcome: dict[str, Any] | None = None
        #: what the run directory's files record of this run (:mod:`mtlflow.engine.rundir` reads no trainer)
        self._run_record = rundir.RunRecord(
            out_dir=self.out_dir, dist=self.dist, config=config, benchmark=bench.name,
            benchmark_config=bench.config, dataset=bench.label, benchmark_tasks=len(bench.tasks),
            tasks=tuple(self.tasks), data_hash=data.content_hash, budget=self.budget)

    def _plan_gradients(self) -> tuple[GradientMode, str | None]:
        """(mode, backend): what the engine computes each step, checked before training starts.

        Modes (:class:`~mtlflow.engine.step.GradientMode`): ``CUSTOM`` (the method owns the step), ``LOSSES``
        (loss weighting: one backward of the objective), ``JACOBIAN`` (per-task gradients w.r.t. the shared
        parameters from a Jacobian backend), ``GRAMIAN`` (the Gramian only, with autogram; Gramian-weighting
        methods) and ``REPRESENTATION`` (per-task gradients w.r.t. the shared features). ``grad_backend``
        applies to gradients w.r.t. the shared parameters only; the other modes ignore it.
        """
        method, cfg = self.method, self.config
        backend = resolve_backend(cfg.grad_backend)
        jacobian_callbacks = [cb.name for cb in self.callbacks if cb.needs_jacobian]
        if method.custom_step:
            return GradientMode.CUSTOM, None
        if not isinstance(method, GradientMethod):
            return GradientMode.LOSSES, None
        if method.requires is GradInput.REPRESENTATION or cfg.grad_wrt == "representation":
            if needs_full_jacobian(type(method)):  # RunConfig.validate rejects this combination too
                raise InvalidParameterError(f"grad_wrt 'representation' does not apply to {method.name!r}")
            mode = GradientMode.REPRESENTATION
        elif backend == "autogram":
            if needs_full_jacobian(type(method)):
                raise InvalidParameterError(autogram_needs_gramian(method.name))
            if not isinstance(getattr(self.model, "trunk", None), torch.nn.Module):
                raise InvalidParameterError("grad_backend 'autogram' needs a model with a `trunk` module; use loop")
            mode = GradientMode.GRAMIAN
        else:
            if backend == "autojac" and any(self.model.trunk_task_parameters(i) for i in range(len(self.tasks))):
                # TorchJD's mtl_backward assumes every path from the shared parameters to a loss runs through the
                # shared features; task-specific trunk modules (SegNet-MTAN's attention masks) read the encoder's
                # inner activations, so its Jacobian would be wrong (and its second backward fails)
                raise InvalidParameterError(
                    f"grad_backend 'autojac' needs every trunk parameter shared; {self.bench.name}'s model has "
                    "task-specific parameters inside its trunk (attention masks); use --grad-backend loop, batched "
                    "or func")
            return GradientMode.JACOBIAN, backend
        if jacobian_callbacks:
            raise InvalidParameterError(
                f"callback(s) {', '.join(jacobian_callbacks)} need per-task gradients w.r.t. the shared parameters, "
                f"which the {mode} mode of {method.name!r} does not compute; use grad_wrt=parameters and a "
                "Jacobian backend (loop, batched, func, autojac)")
        return mode, "autogram" if mode is GradientMode.GRAMIAN else None

    # -- setup ---------------------------------------------------------------------------------
    def _build_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        model_groups = getattr(self.model, "optimizer_groups", None)  # an architecture's own groups (NORMAL)
        groups: list[dict[str, Any]] = (model_groups(cfg.lr) if callable(model_groups) else
                                        [{"params": [p for p in self.model.parameters() if p.requires_grad]}])
        method_params = self.method.parameters()
        if method_params:
            groups.append({"params": method_params, "lr": cfg.method_lr, "weight_decay": 0.0})
        if cfg.optimizer == "adam":
            return torch.optim.Adam(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        if cfg.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def _loader(self, epoch: int) -> DataLoader:
        cfg = self.config
        pin = self.device.type == "cuda" if cfg.pin_memory is None else cfg.pin_memory
        split, shuffle = self.dist.training_split(self.data.splits["train"], cfg.seed, epoch)
        return self.bench.make_loader(split, cfg.batch_size, shuffle=shuffle,
                                      generator=epoch_generator(cfg.seed, epoch), num_workers=cfg.num_workers,
                                      pin_memory=pin)

    # -- one step ------------------------------------------------------------------------------
    def inputs_targets(self, batch: Any) -> tuple[Any, list[Tensor]]:
        """A batch's inputs and the trained tasks' targets, on the trainer's device."""
        inputs, targets = self.bench.unpack(batch)
        inputs = inputs.to(self.device) if hasattr(inputs, "to") else inputs
        return inputs, [targets[idx].to(self.device) for idx in self.task_index]

    def task_losses(self, preds: Sequence[Tensor], targets: Sequence[Tensor]) -> list[Tensor]:
        """Each trained task's loss of its prediction."""
        return [task.loss(pred, target) for task, pred, target in zip(self.tasks, preds, targets, strict=True)]

    def forward_pass(self, batch: Any) -> ForwardPass:
        """Shared features z, then the heads and the K task losses (``model(x)`` split at z)."""
        inputs, targets = self.inputs_targets(batch)
        with self._autocast():
            features = self.model.features(inputs)
            return ForwardPass(self.task_losses(self.model.forward_heads(features), targets), features)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when ``amp`` is on; otherwise no context at all, unless an enclosing autocast is
        active (which a disabled one switches off): entering a disabled autocast costs ~35 µs per forward
        pass on the CPU, 1 % of a small tabular model's step."""
        amp = self.config.amp == "bf16"
        if not amp and not torch.is_autocast_enabled(self.device.type):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=amp)

    def step_problem(self, batch: Any) -> StepProblem:
        """The batch as the engine sees it: a forward pass and its functional form (``torch.func``)."""
        inputs, targets = self.inputs_targets(batch)

        def functional_losses(overrides: dict[str, Tensor]) -> Tensor:
            with self._autocast():
                preds = torch.func.functional_call(self.model, overrides, (inputs,))
                return torch.stack(self.task_losses(preds, targets))

        return StepProblem(self.model, self.shared, self.task_params, lambda: self.forward_pass(batch),
                           functional_losses)

    def _check_finite(self, losses: Tensor, epoch: int) -> None:
        # the float64 sum of K losses is finite exactly when every loss is (K finite float32/bf16 values
        # cannot overflow float64; float64 losses near its limit are reported as such): one reduction and
        # one read, where isfinite().all() runs four kernels
        if not math.isfinite(float(losses.detach().sum(dtype=torch.float64))):
            bad = ([f"{t.name}={float(v)}" for t, v in zip(self.tasks, losses.detach(), strict=True) if not math.isfinite(float(v))]
                   or ["their float64 sum overflows"])
            raise NonFiniteLossError(
                f"non-finite loss ({', '.join(bad)}) at epoch {epoch}, step {self.global_step}; "
                f"lower --lr, set --clip-grad-norm, or check the data")

    def forward_losses(self, batch: Any) -> tuple[Tensor, list[Tensor]]:
        """Per-task losses of ``batch`` as a stacked tensor and as the list of separate graph nodes."""
        forward = self.forward_pass(batch)
        return forward.stacked, forward.losses

    def train_step(self, batch: Any, epoch: int) -> dict[str, Any]:
        """One optimisation step on ``batch``; returns step telemetry (at least ``losses``)."""
        # evaluation (each epoch's end) and callbacks may leave the model in eval mode (``Module.eval()`` on the
        # root); reading the root's flag costs far less than ``Module.train()`` per step. A submodule a user
        # put in eval mode on purpose (frozen batch norm) stays so.
        if not self.model.training:
            self.model.train()
        if self.method.custom_step:
            info = self.method.training_step(self, batch, epoch)
            self.global_step += 1
            return info
        # A callback may change the parameters (a teleport) and ask for the step to be redone there.
        for attempt in (0, 1):
            self.optimizer.zero_grad(set_to_none=True)
            started = time.perf_counter()
            work = self._per_task_gradients(batch, epoch)
            self.dist.synchronize_work(work, self._head_params)
            engine_seconds = time.perf_counter() - started
            stacked = work.losses  # stacked once per step: the hooks, telemetry and the update share it
            detached = stacked.detach()
            state = StepState(epoch=epoch, step=self.global_step, batch=batch, losses=detached,
                              grads=work.jacobian)
            if attempt == 0 and any([cb.after_gradients(self, state) for cb in self.callbacks]):
                continue
            break

        def recompute() -> Tensor:
            with torch.no_grad():
                return self.dist.mean_losses(self.forward_losses(batch)[0])

        # extra: the shared features of this forward pass (LDC-MTL's router) and the batch (its double loop)
        ctx = StepContext(step=self.global_step, epoch=epoch, losses=detached, recompute_losses=recompute,
                          extra={"features": work.forward.features, "batch": batch})
        self.method.before_backward(ctx)
        info: dict[str, Any] = {"losses": detached}
        started = time.perf_counter()
        solver_seconds = self._apply_update(work, state, stacked)
        self.dist.average_gradients(self._optimized_params, work.mode)
        info["engine_seconds"] = engine_seconds + time.perf_counter() - started - (solver_seconds or 0.0)
        if solver_seconds is not None:
            info["solver_seconds"] = solver_seconds
        if len(self.tasks) > 1:
            if work.gramian is not None:
                info["cosines"] = cosines_to_mean(work.gramian)
            elif work.jacobian is not None:
                info["cosines"] = jacobian_cosines_to_mean(work.jacobian)
        self.optimizer_step(state, ctx)
        self.global_step += 1
        if self.method.last_weights is not None:
            info["weights"] = self.method.last_weights.detach()
        info.update(state.info)
        return info

    def update_scale(self, natural_scale: str) -> float:
        """The factor of a method's update in this run (:func:`mtlflow.engine.step.update_scale`)."""
        return step_rules.update_scale(natural_scale, len(self.tasks), self.config.rescale)

    def optimizer_step(self, state: StepState, ctx: StepContext | None = None) -> None:
        """Clipping, the optimizer step and the hooks around it (:func:`mtlflow.engine.step.optimizer_step`)."""
        step_rules.optimizer_step(self, state, ctx)

    def _reuses_weights(self) -> bool:
        """An amortised step: the method's ``update_weights_every`` N > 1 and this step is not a multiple of N."""
        return step_rules.reuses_weights(self.update_weights_every, self.global_step, self.reused_weights is not None)

    def _per_task_gradients(self, batch: Any, epoch: int) -> _StepWork:
        """Forward pass and exactly the per-task gradient information this step's mode needs."""
        mode = self.gradient_mode
        if mode.computes_task_gradients and self._reuses_weights():
            mode = GradientMode.REUSE
        if mode is GradientMode.JACOBIAN and self._jacobian_backend.runs_forward:
            forward, grads = self._jacobian_backend.jacobian(self.step_problem(batch))
            self._check_finite(forward.stacked, epoch)
            return _StepWork(mode, forward, jacobian=grads)
        if mode is GradientMode.GRAMIAN:
            with self._autogram.hooked(self.model):
                forward = self.forward_pass(batch)
            self._check_finite(forward.stacked, epoch)
            return _StepWork(mode, forward, gramian=self._autogram.gramian(forward.stacked))
        forward = self.forward_pass(batch)
        self._check_finite(forward.stacked, epoch)
        if mode is GradientMode.JACOBIAN:
            grads = self._jacobian_backend.differentiate(forward, self.shared, self.task_params, retain_graph=False)
            return _StepWork(mode, forward, jacobian=grads)
        if mode is GradientMode.REPRESENTATION:
            if not isinstance(forward.features, Tensor):
                raise InvalidParameterError(f"{self.bench.name}'s shared features are not one tensor; "
                                            "use grad_wrt=parameters and a method that does not need them")
            return _StepWork(mode, forward, representation=representation_jacobian(forward, self.task_params))
        # losses / reuse: the update back-propagates through this graph, so a callback's Jacobian keeps it. Asked
        # per step: a callback may need gradients only on some steps (COST: its checked and redone steps)
        needed = any(cb.needs_jacobian for cb in self.callbacks)
        grads = task_jacobian(forward.losses, self.shared, retain_graph=True) if needed else None
        return _StepWork(mode, forward, jacobian=grads)

    def _apply_update(self, work: _StepWork, state: StepState, stacked: Tensor) -> float | None:
        """Write the method's update into ``.grad`` (heads: plain gradients); returns the solver time.
        ``stacked``: ``work.losses``, stacked once by the caller."""
        method = self.method
        scale = self.update_scale(method.natural_scale)
        losses = stacked.detach()
        if work.mode is GradientMode.LOSSES:
            objective = method.objective(stacked)
            (objective * scale if scale != 1.0 else objective).backward()
            return None
        if work.mode is GradientMode.REUSE:
            method.last_weights = self.reused_weights  # what this step applies (also after a resume)
            backward_heads(work.forward.losses, self.task_params)
            backward_shared_weighted(work.forward.losses, self.reused_weights * scale, self.shared)
            return None
        if work.mode is GradientMode.GRAMIAN:
            # heads first: a method may rescale its heads' gradients inside the solver (IMTL, DB-MTL)
            backward_heads(work.forward.losses, self.task_params)
            started = time.perf_counter()
            with blas_on_one_thread():
                weights = self._solve_weights(work.gramian, losses)
            solver_seconds = time.perf_counter() - started
            backward_shared_weighted(work.forward.losses, weights * scale, self.shared)
            return solver_seconds
        started = time.perf_counter()
        with blas_on_one_thread():  # every method's K x K solves (mtlflow.core.numerics.one_blas_thread)
            if work.mode is GradientMode.JACOBIAN:
                direction = method.combine(work.jacobian, losses)
                self._remember_weights()
            elif isinstance(method, GramianWeighting):  # representation mode
                rep = work.representation
                direction = self._solve_weights(self.dist.representation_gramian(rep), losses).to(rep) @ rep
            else:
                direction = method.combine(work.representation, losses)
        solver_seconds = time.perf_counter() - started
        step_rules.check_finite_update(method.name, direction, self.global_step)
        if scale != 1.0:
            direction = direction * scale
        if work.mode is GradientMode.JACOBIAN:
            write_flat_grad(self.shared, direction)
            state.direction = direction
        else:
            features = work.forward.features
            # shared parameters only: task parameters inside the trunk (SegNet-MTAN's attention masks)
            # already got their plain gradient from representation_jacobian
            features.backward(direction.view_as(features).to(features.dtype), inputs=list(self.shared))
        return solver_seconds

    def _solve_weights(self, gramian: Tensor, losses: Tensor) -> Tensor:
        weights = self.method.weights_from_gramian(gramian, losses).to(losses)
        if not torch.isfinite(weights).all():
            raise NonFiniteLossError(f"{self.method.name} produced non-finite weights at step {self.global_step}; "
                                     "check the losses or lower --lr")
        self.method.last_weights = weights.detach()
        self._remember_weights()
        return weights

    def _remember_weights(self) -> None:
        if self.update_weights_every > 1 and self.method.last_weights is not None:
            self.reused_weights = self.method.last_weights.detach().clone()

    # -- epochs --------------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any]:
        start_epoch = 1
        if resume and self.dist.from_rank0((self.out_dir / "checkpoint.pt").is_file):
            start_epoch = self._restore(rundir.load_checkpoint(self._run_record, self.device)) + 1
        self.dist.sync_parameters(self.model, "the start of training")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_run_json(self._run_record, "running", self.outcome)
        for cb in self.callbacks:
            cb.on_train_start(self)
        bar = self._progress_bar(start_epoch)
        try:
            for epoch in range(start_epoch, self.config.epochs + 1):
                if self._patience_exhausted():  # checked before each epoch: a resumed run decides the same
                    break
                self._run_epoch(epoch, bar)
            result = self._finish()  # inside: a model.pt that cannot be written (full disk) fails the run too
        except BaseException as exc:
            # Ctrl-C and SIGTERM (mtlflow.core.errors.Terminated) stop a healthy run that --resume continues
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            rundir.write_run_json(self._run_record, status, self.outcome, error=f"{type(exc).__name__}: {exc}")
            for cb in self.callbacks:
                cb.on_train_failed(self, exc)
            raise
        finally:
            if bar is not None:
                bar.close()
        rundir.write_run_json(self._run_record, "completed", self.outcome)
        for cb in self.callbacks:
            cb.on_train_end(self, result)
        return result

    def _patience_exhausted(self) -> bool:
        """Early stopping: ``patience`` epochs without a better validation score, and ``min_steps`` done."""
        patience = self.config.patience
        if patience is None or not self.history:
            return False
        since_best = len(self.history) - 1 - best_epoch_index(self.history)
        return since_best >= patience and self.global_step >= (self.config.min_steps or 0)

    def steps_per_epoch(self) -> int:
        """Optimizer steps of one epoch (per process under torchrun; capped by ``max_steps_per_epoch``)."""
        n = self.dist.steps_per_epoch(len(self.data.splits["train"]), self.config.batch_size)
        return min(n, self.config.max_steps_per_epoch or n)

    def _progress_bar(self, start_epoch: int):
        if not self.progress or not self.dist.is_main:
            return None
        from tqdm.auto import tqdm

        steps = self.steps_per_epoch()
        return tqdm(total=steps * self.config.epochs, initial=steps * (start_epoch - 1), unit="step",
                    desc=f"{self.bench.name}/{self.config.method}", dynamic_ncols=True, mininterval=1.0)

    def _run_epoch(self, epoch: int, bar) -> None:
        """Train one epoch, evaluate it, record it, then write ``metrics.json`` and the checkpoint."""
        telemetry = EpochTelemetry(len(self.tasks), self.device)
        for cb in self.callbacks:
            cb.on_epoch_start(self, epoch)
        self._train_steps(epoch, telemetry, bar)
        telemetry.end_training()
        self.dist.sync_parameters(self.model, f"the end of epoch {epoch}")
        record = self._epoch_record(epoch, self._evaluate(epoch), telemetry)
        self.method.on_epoch_end(epoch)
        for cb in self.callbacks:
            cb.on_epoch_end(self, record)
        self.history.append(record)
        if self.config.selection == BEST_VAL and best_epoch_index(self.history) == len(self.history) - 1:
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        rundir.write_metrics(self._run_record, self.history, self.outcome)
        rundir.save_checkpoint(self._run_record, self._checkpoint(epoch))
        self.dist.barrier()

    def _train_steps(self, epoch: int, telemetry: EpochTelemetry, bar) -> None:
        """The epoch's optimizer steps (``steps_per_epoch``), each recorded in ``telemetry`` and on the bar."""
        limit = self.steps_per_epoch()
        postfix_at = 0.0
        for batch in self._loader(epoch):
            if telemetry.steps >= limit:
                break
            t0 = time.perf_counter()
            info = self.train_step(batch, epoch)
            telemetry.add_step(info, time.perf_counter() - t0)
            if bar is not None:
                bar.update(1)
                if t0 - postfix_at >= 1.0:  # the shown loss is read from the device once a second at most
                    postfix_at = t0
                    bar.set_postfix(epoch=epoch, loss=f"{float(info['losses'].sum()):.4f}", refresh=False)

    def _evaluate(self, epoch: int) -> dict[str, dict[str, dict[str, float]]]:
        """Metrics of every evaluation split and task (rank 0 evaluates; a diverged model fails the run)."""
        splits = self.dist.from_rank0(lambda: {
            split: evaluate_model(self.model, self.bench, self.data.splits[split], self.tasks, self.task_index,
                                  self.config.eval_batch_size, self.device) for split in self.eval_splits})
        check_finite_evaluation(splits, f"after epoch {epoch}")
        return splits

    def _epoch_record(self, epoch: int, splits: dict[str, Any], telemetry: EpochTelemetry) -> dict[str, Any]:
        """The epoch's entry of ``metrics.json``; steps the scheduler on the validation metrics."""
        names = [t.name for t in self.tasks]
        first_val = self.history[0]["splits"]["val"] if self.history else splits["val"]
        record: dict[str, Any] = {
            "epoch": epoch,
            "splits": splits,
            "val_score": validation_score(splits["val"], first_val, {t.name: t.primary for t in self.tasks},
                                          self._metric_specs()),
            **telemetry.timing(names, self.config.batch_size * self.dist.world_size),
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        if self.scheduler is not None:
            record["scheduler_monitor"] = self.scheduler.step(splits["val"])
        record.update(telemetry.step_statistics(names))
        return record

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint(self, epoch: int) -> rundir.Checkpoint:
        """The training state after ``epoch`` (:func:`mtlflow.engine.rundir.save_checkpoint` writes it)."""
        return rundir.Checkpoint(
            epoch=epoch, global_step=self.global_step, model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(), method=self.method.state_dict(),
            callbacks={cb.name: cb.state_dict() for cb in self.callbacks}, reused_weights=self.reused_weights,
            best_state=self.best_state,
            scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
            rng=capture_rng_state(), history=self.history)

    def _restore(self, ckpt: rundir.Checkpoint) -> int:
        """Continue from a checkpoint's training state; returns its epoch."""
        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.method.load_state_dict(ckpt.method)
        for cb in self.callbacks:
            cb.load_state_dict(ckpt.callbacks.get(cb.name, {}))
        self.reused_weights = ckpt.reused_weights
        self.best_state = ckpt.best_state
        if self.scheduler is not None and ckpt.scheduler is not None:
            self.scheduler.load_state_dict(ckpt.scheduler)
        restore_rng_state(ckpt.rng)
        self.history = ckpt.history
        self.global_step = ckpt.global_step
        return ckpt.epoch

    # -- outputs -------------------------------------------------------------------------------
    def _metric_specs(self) -> dict[str, dict[str, dict[str, bool]]]:
        return {t.name: t.metric_specs() for t in self.tasks}

    def _finish(self) -> dict[str, Any]:
        final = select_final(self.history, self.config.selection)
        if self.config.selection == BEST_VAL:  # the model is the selected epoch's, like its metrics
            self.model.load_state_dict(self.best_state)
        self.outcome = training_outcome(self.history, self.config, self.global_step, len(self.data.splits["val"]))
        rundir.write_metrics(self._run_record, self.history, self.outcome, final)
        rundir.save_model(self._run_record, self.model)
        return {"final": final, "epochs": len(self.history), "training": self.outcome}


NOT_CONVERGED = "not converged: train longer"


def fit_budget(config: RunConfig, train_rows: int, world_size: int = 1) -> dict[str, Any]:
    """The run's budget on ``train_rows`` training rows: the batch size lowered so that an epoch has at least
    ``min_steps_per_epoch`` optimizer steps (batch <= rows / N), and the epochs raised so that the run has at
    least ``min_steps`` (``max_steps_per_epoch`` counted); the requested values are kept beside them."""
    batch_size = config.batch_size
    if config.min_steps_per_epoch is not None:
        batch_size = max(1, min(batch_size, train_rows // (config.min_steps_per_epoch * world_size)))
    steps_per_epoch = max(1, math.ceil(train_rows / (batch_size * world_size)))
    steps_per_epoch = min(steps_per_epoch, config.max_steps_per_epoch or steps_per_epoch)
    epochs = max(config.epochs, math.ceil((config.min_steps or 0) / steps_per_epoch))
    return {"train_rows": train_rows, "requested_batch_size": config.batch_size, "batch_size": batch_size,
            "steps_per_epoch": steps_per_epoch, "requested_epochs": config.epochs, "max_epochs": epochs,
            "min_steps": config.min_steps, "min_steps_per_epoch": config.min_steps_per_epoch,
            "patience": config.patience}


def training_outcome(history: Sequence[dict[str, Any]], config: RunConfig, steps: int,
                     val_rows: int | None = None) -> dict[str, Any]:
    """How a run ended and whether it converged. A run converged when its validation score stopped improving:
    it stopped early (``patience`` epochs without a better score), or its best epoch is not among its last
    ``patience`` epochs (the last epoch alone without early stopping). Otherwise the score was still improving
    when the budget ran out: "not converged: train longer". A validation split of ``val_rows`` rows too small to
    rank epochs (:func:`~mtlflow.metrics.selection.val_split_too_small`) never calls a run converged."""
    best = best_epoch_index(history)
    window = config.patience or 1
    since_best = len(history) - 1 - best
    stopped_early = config.patience is not None and since_best >= config.patience and len(history) < config.epochs
    too_small = val_split_too_small(val_rows)
    stopped_improving = since_best >= window
    convergence = (too_small or "converged") if stopped_improving else "; ".join(filter(None, [
        f"{NOT_CONVERGED} (the validation score improved within the last {window} epoch(s))", too_small]))
    return {"epochs_run": len(history), "optimizer_steps": steps, "best_epoch": history[best]["epoch"],
            "best_val_score": history[best]["val_score"], "stopped_early": stopped_early,
            "converged": stopped_improving and not too_small, "val_rows": val_rows, "convergence": convergence}


def check_finite_evaluation(splits: Mapping[str, Mapping[str, Mapping[str, float]]], when: str) -> None:
    """Fail like a non-finite training loss (:class:`NonFiniteLossError`, exit 4) when an evaluation loss is NaN
    or infinite, or a metric is infinite: the model diverged. A NaN metric with a finite loss is a metric
    undefined on the split (a ROC-AUC on one class, an R² of constant targets) and passes."""
    bad = [f"{split}/{task}/{name}={value}" for split, tasks in splits.items() for task, values in tasks.items()
           for name, value in values.items() if math.isinf(value) or (name == "loss" and math.isnan(value))]
    if bad:
        raise NonFiniteLossError(f"non-finite evaluation {when} ({', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''}"
                                 "): the model diverged; lower --lr, set --clip-grad-norm, or check the data")

