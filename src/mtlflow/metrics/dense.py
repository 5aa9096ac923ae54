"""Streaming metrics and losses of dense prediction (NYUv2, CityScapes), over a whole split.

Definitions follow the MTAN / Nash-MTL / FAMO evaluation (methods-cost.md §3):

* segmentation: confusion matrix over pixels with a label in ``[0, C)`` (``-1`` = ignore);
  mIoU = mean over classes of TP / (TP + FP + FN), pixel accuracy = trace / total. Classes that
  occur neither in the labels nor in the predictions of the split are left out of the mean (the
  official code's ``torch.mean`` would return NaN for them);
* depth: absolute and relative error over pixels with a non-zero ground truth, pooled over the
  split (the official code averages per-batch means, which depends on the batch size);
* surface normals: the angle between the predicted and true unit normals, in degrees, over pixels
  with a non-zero true normal: mean, median and the share of pixels within 11.25°, 22.5° and 30°.
  The median (``np.median``'s) is read from a 0.005° histogram (exact to a bin) so that no
  per-pixel state is kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.metrics.task import Metric, StreamingMean

#: Width of the histogram bins of the normal-angle median, in degrees.
ANGLE_BIN_DEGREES = 0.005
_ANGLE_BINS = int(round(180.0 / ANGLE_BIN_DEGREES)) + 1


# -- losses ------------------------------------------------------------------------------------

def segmentation_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Pixel-wise cross-entropy over labelled pixels (``-1`` ignored); 0 for an unlabelled batch."""
    target = target.long()
    valid = target >= 0
    if not bool(valid.any()):
        return logits.sum() * 0.0
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-1)


def depth_valid_mask(target: Tensor) -> Tensor:
    """``[B, 1, H, W]`` True where the ground-truth depth is non-zero."""
    return (target != 0).any(dim=1, keepdim=True)


def depth_loss(pred: Tensor, target: Tensor) -> Tensor:
    """L1 over pixels with ground truth (MTAN's masked depth loss)."""
    mask = depth_valid_mask(target).to(pred.dtype)
    return ((pred - target).abs() * mask).sum() / mask.sum().clamp_min(1)


def normal_valid_mask(target: Tensor) -> Tensor:
    """``[B, H, W]`` True where the true normal is non-zero."""
    return (target != 0).any(dim=1)


def normal_loss(pred: Tensor, target: Tensor) -> Tensor:
    """1 - mean cosine between predicted and true unit normals over valid pixels (MTAN)."""
    mask = normal_valid_mask(target).to(pred.dtype)
    return 1 - ((pred * target).sum(dim=1) * mask).sum() / mask.sum().clamp_min(1)


# -- segmentation --------------------------------------------------------------------------------

class _ConfusionMetric(Metric):
    """Accumulates the ``C x C`` confusion matrix (rows: truth, columns: prediction)."""

    n_classes: int = 0

    def reset(self) -> None:
        self.matrix = torch.zeros(self.n_classes, self.n_classes, dtype=torch.int64)

    def update(self, pred: Tensor, target: Tensor) -> None:
        n = self.n_classes
        labels = pred.argmax(dim=1).reshape(-1).cpu()
        truth = target.reshape(-1).long().cpu()
        keep = (truth >= 0) & (truth < n)
        counts = torch.bincount(truth[keep] * n + labels[keep], minlength=n * n)
        self.matrix += counts.reshape(n, n)


class _MeanIoU(_ConfusionMetric):
    name = "miou"
    higher_is_better = True
    unit_interval = True

    def compute(self) -> float:
        m = self.matrix.double()
        tp = m.diagonal()
        union = m.sum(0) + m.sum(1) - tp
        present = union > 0
        return float((tp[present] / union[present]).mean()) if bool(present.any()) else 0.0


class _PixelAccuracy(_ConfusionMetric):
    name = "pix_acc"
    higher_is_better = True
    unit_interval = True

    def compute(self) -> float:
        total = int(self.matrix.sum())
        return float(self.matrix.diagonal().sum()) / total if total else 0.0


def segmentation_metrics(n_classes: int) -> tuple[type[Metric], type[Metric]]:
    """mIoU and pixel-accuracy metric classes for ``n_classes`` classes."""
    miou = type(f"MeanIoU{n_classes}", (_MeanIoU,), {"n_classes": n_classes})
    acc = type(f"PixelAccuracy{n_classes}", (_PixelAccuracy,), {"n_classes": n_classes})
    return miou, acc


# -- depth --------------------------------------------------------------------------------------

class _DepthError(StreamingMean):
    higher_is_better = False

    def _errors(self, pred: Tensor, target: Tensor) -> Tensor:
        raise NotImplementedError

    def update(self, pred: Tensor, target: Tensor) -> None:
        mask = depth_valid_mask(target)
        self.add(self._errors(pred.float().expand_as(target)[mask.expand_as(target)],
                              target.float()[mask.expand_as(target)]))


class DepthAbsoluteError(_DepthError):
    name = "abs_err"

    def _errors(self, pred: Tensor, target: Tensor) -> Tensor:
        return (pred - target).abs()


class DepthRelativeError(_DepthError):
    name = "rel_err"

    def _errors(self, pred: Tensor, target: Tensor) -> Tensor:
        return (pred - target).abs() / target.abs()


# -- surface normals ------------------------------------------------------------------------------

def normal_angles(pred: Tensor, target: Tensor) -> Tensor:
    """Angles in degrees between predicted and true normals at the valid pixels (flat)."""
    mask = normal_valid_mask(target)
    pred_n = torch.nn.functional.normalize(pred.float(), dim=1)
    cos = (pred_n * target.float()).sum(dim=1).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos[mask]))


class _NormalAngleMetric(StreamingMean):
    """Keeps the sum, the count and a histogram of the angles; computes their mean unless overridden."""

    def reset(self) -> None:
        super().reset()
        self.histogram = torch.zeros(_ANGLE_BINS, dtype=torch.int64)
        self.within: dict[float, int] = {}

    def update(self, pred: Tensor, target: Tensor) -> None:
        angles = normal_angles(pred, target).cpu().double()
        self.add(angles)
        bins = torch.clamp((angles / ANGLE_BIN_DEGREES).floor().long(), 0, _ANGLE_BINS - 1)
        self.histogram += torch.bincount(bins, minlength=_ANGLE_BINS)
        for threshold in self.thresholds():
            self.within[threshold] = self.within.get(threshold, 0) + int((angles < threshold).sum())

    def thresholds(self) -> tuple[float, ...]:
        return ()


class NormalAngleMean(_NormalAngleMetric):
    name = "angle_mean"
    higher_is_better = False


class NormalAngleMedian(_NormalAngleMetric):
    name = "angle_median"
    higher_is_better = False

    def compute(self) -> float:
        """``np.median`` of the angles (mean of the two middle ones for an even count), from the histogram."""
        if self.count == 0:
            return 0.0
        cumulative = torch.cumsum(self.histogram, 0)

        def order_statistic(rank: int) -> float:  # the rank-th smallest angle (1-based), within half a bin
            index = int(torch.searchsorted(cumulative, torch.tensor(rank)))
            before = int(cumulative[index - 1]) if index > 0 else 0
            return (index + (rank - before - 0.5) / int(self.histogram[index])) * ANGLE_BIN_DEGREES

        if self.count % 2:
            return order_statistic((self.count + 1) // 2)
        return 0.5 * (order_statistic(self.count // 2) + order_statistic(self.count // 2 + 1))


def _within_metric(threshold: float, label: str) -> type[Metric]:
    def compute(self) -> float:
        return self.within.get(threshold, 0) / max(self.count, 1)

    return type(f"NormalWithin{label}", (_NormalAngleMetric,), {
        "name": f"within_{label}", "higher_is_better": True, "unit_interval": True,
        "thresholds": lambda self: (threshold,), "compute": compute})


NormalWithin11 = _within_metric(11.25, "11.25")
NormalWithin22 = _within_metric(22.5, "22.5")
NormalWithin30 = _within_metric(30.0, "30")
NORMAL_METRICS: tuple[type[Metric], ...] = (NormalAngleMean, NormalAngleMedian, NormalWithin11, NormalWithin22,
                                            NormalWithin30)
DEPTH_METRICS: tuple[type[Metric], ...] = (DepthAbsoluteError, DepthRelativeError)
