"""Trainer callbacks: extensions that observe or alter training without being a method.

COST's teleportation (a wrapper around any method) and the metric exporters are callbacks. Every
hook is optional; the trainer calls them in this order within one step::

    forward -> losses -> [per-task gradients] -> after_gradients (may ask to redo the step)
    -> method update -> before_optimizer_step -> optimizer.step() -> after_optimizer_step

A callback's state goes into the checkpoint through ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from mtlflow.benchmarks.base import Benchmark, BenchmarkData
    from mtlflow.config.run import RunConfig
    from mtlflow.methods.base import Method, StepContext
    from mtlflow.metrics.task import TaskSpec
    from mtlflow.models.base import MultiTaskModel


@runtime_checkable
class TrainerView(Protocol):
    """What methods and callbacks may use of the trainer (:class:`mtlflow.engine.trainer.Trainer` is one).

    Nothing else of the trainer is theirs to touch: ``tests/unit/engine/test_trainer_view.py`` checks that
    the code of methods, COST, PaLoRA's front and the exporters reads only these members."""

    #: the run's configuration
    config: RunConfig
    bench: Benchmark
    data: BenchmarkData
    model: MultiTaskModel
    method: Method
    device: torch.device
    #: the trained tasks and their indices among the benchmark's tasks
    tasks: list[TaskSpec]
    task_index: list[int]
    #: the shared parameters (every task's output depends on them)
    shared: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    callbacks: list[Callback]
    #: optimizer steps taken so far, and the metrics recorded after every finished epoch
    global_step: int
    history: list[dict[str, Any]]
    out_dir: Path

    def steps_per_epoch(self) -> int: ...

    def inputs_targets(self, batch: Any) -> tuple[Any, list[Tensor]]: ...

    def task_losses(self, preds: Sequence[Tensor], targets: Sequence[Tensor]) -> list[Tensor]: ...

    def forward_losses(self, batch: Any) -> tuple[Tensor, list[Tensor]]: ...

    def update_scale(self, natural_scale: str) -> float:
        """The factor of a method's update: K for "mean" methods when the run rescales, else 1."""
        ...

    def optimizer_step(self, state: StepState, ctx: StepContext | None = None) -> None:
        """Clipping, then the optimizer step between the callbacks' hooks (and the method's, given ``ctx``)."""
        ...


@dataclass
class StepState:
    """What callbacks see of the current step."""

    epoch: int
    step: int
    batch: Any
    losses: Tensor
    #: per-task gradients w.r.t. the shared parameters ``[K, P]`` when they were computed
    grads: Tensor | None = None
    #: the update written into the shared parameters' ``.grad`` (after rescaling), when known
    direction: Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Base class of trainer callbacks; override the hooks you need."""

    name: ClassVar[str] = "callback"
    #: ask the trainer for per-task gradients every step, even when the method does not need them
    needs_jacobian: ClassVar[bool] = False

    def on_train_start(self, trainer: TrainerView) -> None:
        """After the model, method and optimizer exist and any checkpoint was restored."""

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        """Before the first step of ``epoch``."""

    def after_gradients(self, trainer: TrainerView, state: StepState) -> bool:
        """After the losses (and per-task gradients) of a step; return True to redo the step at the
        current parameters (e.g. after a teleport changed them)."""
        return False

    def before_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        """After ``.grad`` holds the final update, before ``optimizer.step()``."""

    def after_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        """After ``optimizer.step()`` and the method's own hook."""

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        """After evaluation; may add telemetry fields to the epoch ``record`` before it is written."""

    def on_train_end(self, trainer: TrainerView, result: dict[str, Any]) -> None:
        """After the final metrics and model were written."""

    def on_train_failed(self, trainer: TrainerView, exc: BaseException) -> None:
        """When training stops with ``exc`` (a NaN/Inf loss, a solver failure, an interrupt), after
        ``run.json`` records the failure and before ``exc`` propagates; must not raise."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
