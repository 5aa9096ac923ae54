"""Losses and metrics of regression tasks trained on standardised targets.

A benchmark that standardises a target with its training mean and standard deviation ``s`` yields
the target of every sample as the pair ``(standardised value, s)`` (shape ``[..., 2]``). The model
predicts in standard units; the loss works there, and the metrics report errors in the original
units, ``|ŷ - y| * s`` (the mean cancels). No metric needs state from the prepared data, so every
consumer (trainer, ``evaluate``, pipeline components) reports the same units. Missing targets (NaN)
are skipped.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mtlflow.metrics.task import Metric, StreamingMean


def _split(pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Predictions, standardised targets, scales and the mask of present targets, all flat."""
    value, scale = target[..., 0], target[..., 1]
    pred = pred.reshape(value.shape)
    mask = torch.isfinite(value)
    return pred[mask], value[mask], scale[mask], mask


def standardised_mse(pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error in standard units over present targets; 0 for a batch without any."""
    value = target[..., 0]
    pred = pred.reshape(value.shape)
    mask = torch.isfinite(value)
    diff = torch.where(mask, pred - torch.nan_to_num(value).to(pred.dtype), torch.zeros_like(pred))
    return diff.pow(2).sum() / mask.sum().clamp_min(1)


class _OriginalUnitError(StreamingMean):
    higher_is_better = False

    def _errors(self, pred: Tensor, target: Tensor) -> Tensor:
        p, y, s, _ = _split(pred, target)
        return (p.double() - y.double()) * s.double()


class MAE(_OriginalUnitError):
    """Mean absolute error in the target's original units."""

    name = "mae"

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.add(self._errors(pred, target).abs())


class RMSE(_OriginalUnitError):
    """Root mean squared error in the target's original units."""

    name = "rmse"

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.add(self._errors(pred, target).pow(2))

    def compute(self) -> float:
        return math.sqrt(super().compute())


class RSquared(Metric):
    """Coefficient of determination 1 - SSE / SST over the split's present targets.

    The same in standard and original units (a target's scale is one number per task, the mean
    cancels), so it is pooled in standard units from running sums. NaN with fewer than two targets
    or a constant target.
    """

    name = "r2"
    higher_is_better = True

    def reset(self) -> None:
        self.count = 0
        self.sum = self.sum_squares = self.squared_error = 0.0

    def update(self, pred: Tensor, target: Tensor) -> None:
        p, y, _, _ = _split(pred, target)
        y = y.double()
        self.count += int(y.numel())
        self.sum += float(y.sum())
        self.sum_squares += float(y.pow(2).sum())
        self.squared_error += float((p.double() - y).pow(2).sum())

    def compute(self) -> float:
        if self.count < 2:
            return float("nan")
        total = self.sum_squares - self.sum**2 / self.count
        return 1.0 - self.squared_error / total if total > 0 else float("nan")


def with_scale(standardised: Tensor, scale: Tensor) -> Tensor:
    """``[..., K]`` standardised targets and ``[K]`` scales -> ``[..., K, 2]`` target pairs."""
    return torch.stack([standardised, scale.to(standardised.dtype).expand_as(standardised)], dim=-1)
