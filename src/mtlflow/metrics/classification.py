"""Streaming classification metrics that need the whole split: F1, ROC-AUC, and accuracy with labels
that may be missing.

Binary tasks predict one logit per sample; labels are 0/1, and a missing label is NaN or negative
(Tox21's empty cells, padded samples of multi-input benchmarks). Missing labels count nowhere.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.metrics.task import CountingAccuracy, Metric


def valid_label_mask(target: Tensor) -> Tensor:
    """True where a label is present: finite and non-negative."""
    return torch.isfinite(target) & (target >= 0) if target.is_floating_point() else target >= 0


def masked_binary_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean BCE (with logits) over the present labels; 0 when a batch has none (Tox21's missing cells)."""
    logits = logits.reshape(target.shape)
    mask = valid_label_mask(target)
    safe = torch.where(mask, target, torch.zeros_like(target)).to(logits.dtype)
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, safe, reduction="none")
    return (losses * mask).sum() / mask.sum().clamp_min(1)


def masked_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy over samples whose class label is >= 0; 0 when none is (padded samples)."""
    mask = target >= 0
    losses = torch.nn.functional.cross_entropy(logits, target.clamp_min(0).long(), reduction="none")
    return (losses * mask).sum() / mask.sum().clamp_min(1)


class MaskedAccuracy(CountingAccuracy):
    """Top-1 accuracy of class logits ``[B, C]`` over samples whose label is >= 0."""

    def update(self, pred: Tensor, target: Tensor) -> None:
        mask = target >= 0
        self.correct += int((pred.argmax(dim=-1)[mask] == target[mask]).sum())
        self.total += int(mask.sum())


class BinaryF1(Metric):
    """F1 of the positive class, predicting positive when the logit is > 0 (probability > 0.5).

    F1 = 2 TP / (2 TP + FP + FN) over the whole split, as the CelebA trainers of Nash-MTL/FAMO
    accumulate TP, FP and FN per epoch (their 1e-8 guards change nothing but 0/0, which is 0 here).
    """

    name = "f1"
    higher_is_better = True
    unit_interval = True

    def reset(self) -> None:
        self.tp = self.fp = self.fn = 0

    def update(self, pred: Tensor, target: Tensor) -> None:
        pred = pred.reshape(target.shape)
        mask = valid_label_mask(target)
        positive = (pred > 0)[mask]
        truth = target[mask] > 0.5
        self.tp += int((positive & truth).sum())
        self.fp += int((positive & ~truth).sum())
        self.fn += int((~positive & truth).sum())

    def compute(self) -> float:
        denom = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denom if denom else 0.0


class BinaryAccuracy(CountingAccuracy):
    """Share of present labels predicted correctly at logit 0."""

    def update(self, pred: Tensor, target: Tensor) -> None:
        pred = pred.reshape(target.shape)
        mask = valid_label_mask(target)
        self.correct += int(((pred > 0)[mask] == (target[mask] > 0.5)).sum())
        self.total += int(mask.sum())


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve = P(score of a positive > score of a negative) + ½ P(tie).

    Computed from average ranks (the Mann-Whitney U statistic), so ties count one half. NaN when the
    labels hold a single class.
    """
    from scipy.stats import rankdata

    labels = labels.astype(bool)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class RocAuc(Metric):
    """ROC-AUC of the logits over the present labels of the whole split (NaN if one class is absent)."""

    name = "roc_auc"
    higher_is_better = True
    unit_interval = True

    def reset(self) -> None:
        self.scores: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def update(self, pred: Tensor, target: Tensor) -> None:
        pred = pred.reshape(target.shape)
        mask = valid_label_mask(target)
        self.scores.append(pred[mask].detach().float().cpu().numpy())
        self.labels.append((target[mask] > 0.5).cpu().numpy())

    def compute(self) -> float:
        if not self.scores:
            return float("nan")
        return roc_auc(np.concatenate(self.scores), np.concatenate(self.labels))
