"""Confusion matrices (mtlflow.metrics.confusion): orientation, missing labels, agreement with the accuracy metrics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mtlflow.metrics.classification import BinaryAccuracy, BinaryF1, MaskedAccuracy, masked_binary_cross_entropy
from mtlflow.metrics.confusion import BINARY, MULTICLASS, ConfusionCounter, classification_kind
from mtlflow.metrics.task import Accuracy, MeanAbsoluteError, TaskSpec


def test_kind_follows_the_task_metrics():
    assert classification_kind(TaskSpec("digit", F.cross_entropy, (Accuracy,), "acc", 1.0)) == MULTICLASS
    assert classification_kind(TaskSpec("office", F.cross_entropy, (MaskedAccuracy,), "acc", 1.0)) == MULTICLASS
    assert classification_kind(TaskSpec("attr", masked_binary_cross_entropy, (BinaryF1, BinaryAccuracy), "f1",
                                        1.0)) == BINARY
    assert classification_kind(TaskSpec("energy", F.l1_loss, (MeanAbsoluteError,), "mae", 10.0)) is None


def test_multiclass_rows_are_true_classes_and_missing_labels_are_skipped():
    logits = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]])
    target = torch.tensor([0, 1, 2, 2, -1])  # the last sample has no label
    counter = ConfusionCounter(MULTICLASS)
    counter.update(logits[:3], target[:3])
    counter.update(logits[3:], target[3:])  # accumulates over batches
    assert counter.categories() == ["0", "1", "2"]
    assert counter.matrix() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    accuracy = MaskedAccuracy()
    accuracy.update(logits, target)
    matrix = counter.matrix()
    assert sum(matrix[i][i] for i in range(3)) / sum(map(sum, matrix)) == accuracy.compute()


def test_binary_matrix_agrees_with_binary_accuracy():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 1, generator=generator)
    target = (torch.rand(200, generator=generator) > 0.4).float()
    target[::7] = float("nan")  # missing labels (Tox21's empty cells)
    counter, accuracy = ConfusionCounter(BINARY), BinaryAccuracy()
    counter.update(logits, target)
    accuracy.update(logits, target)
    (tn, fp), (fn, tp) = counter.matrix()
    assert counter.categories() == ["negative", "positive"]
    assert tn + fp + fn + tp == int(torch.isfinite(target).sum())
    assert (tn + tp) / (tn + fp + fn + tp) == accuracy.compute()
    positives = torch.isfinite(target) & (target > 0.5)
    assert fn + tp == int(positives.sum()) and tp == int((positives & (logits[:, 0] > 0)).sum())
