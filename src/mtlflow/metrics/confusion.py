"""Confusion matrices of the classification tasks of a trained model (rows: true class, columns: predicted).

A task counts as classification when one of its metrics is a classification metric: top-1 accuracy
on class logits ``[B, C]`` (multi-class: the predicted class is the arg-max) or a binary metric on one
logit per sample (binary: positive when the logit is > 0, i.e. probability > 0.5 -- the same
threshold as :class:`~mtlflow.metrics.classification.BinaryAccuracy`). Samples whose label is missing
(negative or NaN) count nowhere, as in the metrics. Regression and dense tasks have no matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mtlflow.metrics.classification import BinaryAccuracy, BinaryF1, MaskedAccuracy, RocAuc, valid_label_mask
from mtlflow.metrics.task import Accuracy, TaskSpec

if TYPE_CHECKING:
    from mtlflow.benchmarks.base import Benchmark
    from mtlflow.models.base import MultiTaskModel

MULTICLASS, BINARY = "multiclass", "binary"


def classification_kind(task: TaskSpec) -> str | None:
    """``multiclass``, ``binary`` or None (no confusion matrix) from the task's metrics."""
    if any(issubclass(m, (Accuracy, MaskedAccuracy)) for m in task.metrics):
        return MULTICLASS
    if any(issubclass(m, (BinaryAccuracy, BinaryF1, RocAuc)) for m in task.metrics):
        return BINARY
    return None


class ConfusionCounter:
    """Accumulates one task's confusion matrix over batches."""

    def __init__(self, kind: str):
        self.kind = kind
        self.counts: Tensor | None = None

    def update(self, pred: Tensor, target: Tensor) -> None:
        if self.kind == MULTICLASS:
            n_classes = int(pred.shape[-1])
            mask = target >= 0
            predicted, true = pred.argmax(dim=-1)[mask], target[mask].long()
        else:
            n_classes = 2
            logits = pred.reshape(target.shape)
            mask = valid_label_mask(target)
            predicted, true = (logits[mask] > 0).long(), (target[mask] > 0.5).long()
        flat = torch.bincount((true * n_classes + predicted).cpu(), minlength=n_classes * n_classes)
        counts = flat.view(n_classes, n_classes)
        self.counts = counts if self.counts is None else self.counts + counts

    def categories(self) -> list[str]:
        n = 2 if self.counts is None else int(self.counts.shape[0])
        return ["negative", "positive"] if self.kind == BINARY else [str(c) for c in range(n)]

    def matrix(self) -> list[list[int]]:
        n = len(self.categories())
        counts = self.counts if self.counts is not None else torch.zeros(n, n, dtype=torch.long)
        return [[int(v) for v in row] for row in counts.tolist()]


@torch.no_grad()
def confusion_matrices(model: MultiTaskModel, bench: Benchmark, dataset, tasks: Sequence[TaskSpec],
                       target_index: Sequence[int], batch_size: int = 512,
                       device: torch.device | str = "cpu") -> dict[str, dict[str, Any]]:
    """``{task: {"kind", "categories", "matrix"}}`` over ``dataset`` for every classification task."""
    counters = {t.name: ConfusionCounter(kind) for t in tasks if (kind := classification_kind(t))}
    if not counters:
        return {}
    was_training = model.training
    model.eval()
    for batch in bench.make_loader(dataset, batch_size=batch_size, shuffle=False):
        inputs, targets = bench.unpack(batch)
        inputs = inputs.to(device) if hasattr(inputs, "to") else inputs
        preds = model(inputs)
        for task, pred, idx in zip(tasks, preds, target_index, strict=True):
            if task.name in counters:
                counters[task.name].update(pred.float(), targets[idx].to(device))
    model.train(was_training)
    return {name: {"kind": c.kind, "categories": c.categories(), "matrix": c.matrix()} for name, c in counters.items()}
