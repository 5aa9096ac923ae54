"""Streaming per-task metrics.

Each metric accumulates over batches (``update``) and reports one float (``compute``). Whether higher
is better is part of the metric, so Δm%, mean rank and hypervolume can orient every value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor


class Metric:
    """Base class: ``reset``, ``update(pred, target)``, ``compute() -> float``."""

    name: ClassVar[str]
    higher_is_better: ClassVar[bool]
    #: True when the value lies in [0, 1] so that its error is ``1 - value`` (accuracy, F1, IoU).
    unit_interval: ClassVar[bool] = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, pred: Tensor, target: Tensor) -> None:
        raise NotImplementedError

    def compute(self) -> float:
        raise NotImplementedError


class CountingAccuracy(Metric):
    """Share of correct predictions; subclasses say in ``update`` what is counted and what is correct."""

    name = "acc"
    higher_is_better = True
    unit_interval = True

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def compute(self) -> float:
        return self.correct / max(self.total, 1)


class Accuracy(CountingAccuracy):
    """Top-1 accuracy of class logits ``[B, C]`` against integer labels ``[B]``."""

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.correct += int((pred.argmax(dim=-1) == target).sum())
        self.total += int(target.numel())


class StreamingMean(Metric):
    """The mean of per-element values pooled over every batch of the split; ``update`` passes each
    batch's values to :meth:`add`. 0 before any value."""

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0

    def add(self, values: Tensor) -> None:
        self.sum += float(values.sum())
        self.count += int(values.numel())

    def compute(self) -> float:
        return self.sum / max(self.count, 1)


class MeanAbsoluteError(StreamingMean):
    name = "mae"
    higher_is_better = False

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.add((pred.reshape(target.shape) - target).abs())


class ObjectiveValue(StreamingMean):
    """The mean of the prediction itself: for analytic problems whose 'prediction' is the loss."""

    name = "value"
    higher_is_better = False

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.add(pred.detach())


def metric_error(value: float, higher_is_better: bool, unit_interval: bool) -> float:
    """Turn a metric value into an error (lower is better) for hypervolume and Pareto sets."""
    if not higher_is_better:
        return value
    return 1.0 - value if unit_interval else -value


@dataclass(frozen=True)
class TaskSpec:
    """One task: its loss, its metrics and the metric used for Pareto sets and hypervolume.

    ``loss(pred, target)`` returns the batch-mean loss. ``metrics`` are factories of
    :class:`Metric`. ``hv_reference`` is the reference value of the primary
    metric's error (see :func:`metric_error`) used for the hypervolume.
    """

    name: str
    loss: Callable[[Tensor, Tensor], Tensor]
    metrics: tuple[type[Metric], ...]
    primary: str
    hv_reference: float

    def metric_specs(self) -> dict[str, dict[str, bool]]:
        specs = {m.name: {"higher_is_better": m.higher_is_better, "unit_interval": m.unit_interval}
                 for m in self.metrics}
        specs["loss"] = {"higher_is_better": False, "unit_interval": False}
        return specs
