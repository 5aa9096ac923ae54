"""The four kinds of supervised task and their defaults: loss, metrics, primary metric.

A task spec (:class:`~mtlflow.metrics.task.TaskSpec`) is built from its kind; a benchmark or a user's
spec file overrides the metrics, the primary metric or the hypervolume reference only where it has a
reason to. Every default loss is a masked mean over the labelled rows, so a row whose label is missing
adds nothing to that task's loss or metrics:

- ``binary``: one logit, labels 0/1 (missing: NaN or negative); masked BCE; ROC-AUC, F1, accuracy.
- ``multilabel``: L logits, labels ``[B, L]`` of 0/1; masked BCE over present labels; F1, ROC-AUC and
  accuracy pooled over the labels (micro averages).
- ``multiclass``: C logits, an integer class (missing: -1); masked cross-entropy; accuracy, macro F1.
- ``regression``: one output in standard units, targets ``(standardised value, scale)``; MSE in
  standard units; MAE and RMSE in the original units, R² (see :mod:`mtlflow.metrics.regression`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mtlflow.metrics.classification import (
    BinaryAccuracy,
    BinaryF1,
    MaskedAccuracy,
    RocAuc,
    masked_binary_cross_entropy,
    masked_cross_entropy,
)
from mtlflow.metrics.regression import MAE, RMSE, RSquared, standardised_mse
from mtlflow.metrics.task import Metric, TaskSpec


class MacroF1(Metric):
    """F1 averaged over the classes (one-vs-rest) of class logits ``[B, C]``, labels >= 0 only.

    Counts come from the confusion matrix of the whole split; a class with neither a label nor a
    prediction is left out of the mean (its F1 is 0/0).
    """

    name = "macro_f1"
    higher_is_better = True
    unit_interval = True

    def reset(self) -> None:
        self.confusion: Tensor | None = None

    def update(self, pred: Tensor, target: Tensor) -> None:
        n_classes = pred.shape[-1]
        mask = target >= 0
        truth, guess = target[mask].long(), pred.argmax(dim=-1)[mask]
        counts = torch.bincount(truth * n_classes + guess, minlength=n_classes * n_classes).view(n_classes, n_classes)
        self.confusion = counts if self.confusion is None else self.confusion + counts

    def compute(self) -> float:
        if self.confusion is None:
            return 0.0
        tp = self.confusion.diagonal().double()
        denominator = self.confusion.sum(0).double() + self.confusion.sum(1).double()  # 2 TP + FP + FN
        present = denominator > 0
        if not bool(present.any()):
            return 0.0
        return float((2 * tp[present] / denominator[present]).mean())


@dataclass(frozen=True)
class TaskType:
    """The defaults of one kind of task. ``hv_reference`` is the primary metric's error (see
    :func:`~mtlflow.metrics.task.metric_error`) used as the hypervolume reference; None when it
    depends on the target's units, so whoever builds the task must give it."""

    name: str
    loss: Callable[[Tensor, Tensor], Tensor]
    metrics: tuple[type[Metric], ...]
    primary: str
    hv_reference: float | None
    #: True when the targets are standardised with training statistics before training
    standardised: bool = False

    def task(self, name: str, *, metrics: tuple[type[Metric], ...] | None = None, primary: str | None = None,
             hv_reference: float | None = None) -> TaskSpec:
        """A task of this kind named ``name``; ``None`` arguments take the kind's defaults."""
        chosen = metrics or self.metrics
        primary = primary or self.primary
        if primary not in {m.name for m in chosen}:
            raise ValueError(f"primary metric {primary!r} of task {name!r} is not among its metrics "
                             f"{[m.name for m in chosen]}")
        reference = self.hv_reference if hv_reference is None else hv_reference
        if reference is None:
            raise ValueError(f"{self.name} task {name!r} needs a hypervolume reference in the target's units")
        return TaskSpec(name, self.loss, tuple(chosen), primary=primary, hv_reference=reference)


BINARY = TaskType("binary", masked_binary_cross_entropy, (RocAuc, BinaryF1, BinaryAccuracy), "roc_auc", 1.0)
MULTILABEL = TaskType("multilabel", masked_binary_cross_entropy, (BinaryF1, RocAuc, BinaryAccuracy), "f1", 1.0)
MULTICLASS = TaskType("multiclass", masked_cross_entropy, (MaskedAccuracy, MacroF1), "acc", 1.0)
REGRESSION = TaskType("regression", standardised_mse, (MAE, RMSE, RSquared), "mae", None, standardised=True)

TASK_TYPES: dict[str, TaskType] = {t.name: t for t in (BINARY, MULTILABEL, MULTICLASS, REGRESSION)}
