"""Streaming benchmark metrics and masked losses on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtlflow.metrics.classification import (
    BinaryAccuracy,
    BinaryF1,
    MaskedAccuracy,
    RocAuc,
    masked_binary_cross_entropy,
    masked_cross_entropy,
    roc_auc,
)
from mtlflow.metrics.dense import (
    DepthAbsoluteError,
    DepthRelativeError,
    NormalAngleMean,
    NormalAngleMedian,
    NormalWithin11,
    NormalWithin22,
    NormalWithin30,
    depth_loss,
    normal_loss,
    segmentation_loss,
    segmentation_metrics,
)
from mtlflow.metrics.regression import MAE, RMSE, standardised_mse, with_scale


def one_hot_logits(labels: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, H, W]`` labels -> ``[B, n, H, W]`` logits whose argmax is the label."""
    return torch.nn.functional.one_hot(labels, n).permute(0, 3, 1, 2).float()


def test_miou_and_pixel_accuracy_over_batches_by_hand() -> None:
    miou_cls, acc_cls = segmentation_metrics(3)
    miou, acc = miou_cls(), acc_cls()
    truth = torch.tensor([[[0, 0, 1, 1], [2, 2, -1, -1]]])
    pred = torch.tensor([[[0, 1, 1, 1], [2, 0, 2, 0]]])
    # second batch: class 2 only, predicted right
    truth2, pred2 = torch.tensor([[[2, 2]]]), torch.tensor([[[2, 2]]])
    for m in (miou, acc):
        m.update(one_hot_logits(pred, 3), truth)
        m.update(one_hot_logits(pred2, 3), truth2)
    # confusion (truth x pred): class0 -> {0: 1, 1: 1}; class1 -> {1: 2}; class2 -> {2: 3, 0: 1}; ignore skipped
    iou = [1 / (2 + 2 - 1), 2 / (2 + 3 - 2), 3 / (4 + 3 - 3)]
    assert miou.compute() == pytest.approx(sum(iou) / 3)
    assert acc.compute() == pytest.approx(6 / 8)
    # a class absent from labels and predictions is left out of the mean
    only = miou_cls()
    only.update(one_hot_logits(torch.tensor([[[0, 1]]]), 3), torch.tensor([[[0, 1]]]))
    assert only.compute() == pytest.approx(1.0)


def test_roc_auc_skips_missing_labels_and_counts_ties_half() -> None:
    metric = RocAuc()
    metric.update(torch.tensor([0.9, 0.1, 0.5, 2.0]), torch.tensor([1.0, 0.0, float("nan"), -1.0]))
    metric.update(torch.tensor([0.4, 0.4, 0.8]), torch.tensor([1.0, 0.0, 0.0]))
    # present pairs: positives {0.9, 0.4}, negatives {0.1, 0.4, 0.8}:
    # 0.9 beats all 3; 0.4 beats 0.1, ties 0.4 (1/2), loses to 0.8 -> (3 + 1.5) / 6
    assert metric.compute() == pytest.approx(4.5 / 6)
    # the rank formula equals the pairwise definition on random data with many ties
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=200).round(1), rng.integers(0, 2, 200)
    pos, neg = scores[labels == 1][:, None], scores[labels == 0][None, :]
    assert roc_auc(scores, labels) == pytest.approx(float(((pos > neg) + 0.5 * (pos == neg)).mean()))
    assert math.isnan(roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_binary_f1_and_accuracy_by_hand() -> None:
    f1, acc = BinaryF1(), BinaryAccuracy()
    logits = torch.tensor([[2.0], [-1.0], [0.5], [-3.0], [1.0], [0.2]])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, float("nan")])
    for m in (f1, acc):
        m.update(logits, labels)
    # TP = 2 (2.0, 1.0), FN = 1 (-1.0), FP = 1 (0.5), TN = 1; the NaN label is skipped
    assert f1.compute() == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert acc.compute() == pytest.approx(3 / 5)
    empty = BinaryF1()
    empty.update(torch.tensor([-1.0]), torch.tensor([0.0]))
    assert empty.compute() == 0.0


def test_masked_classification_losses_and_accuracy() -> None:
    logits = torch.tensor([0.3, -2.0, 1.5])
    target = torch.tensor([1.0, float("nan"), 0.0])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[[0, 2]], target[[0, 2]])
    assert masked_binary_cross_entropy(logits, target) == pytest.approx(float(expected))
    assert float(masked_binary_cross_entropy(logits, torch.full((3,), float("nan")))) == 0.0
    class_logits = torch.randn(4, 5)
    labels = torch.tensor([1, -1, 3, -1])
    expected = torch.nn.functional.cross_entropy(class_logits[[0, 2]], labels[[0, 2]])
    assert masked_cross_entropy(class_logits, labels) == pytest.approx(float(expected))
    acc = MaskedAccuracy()
    acc.update(torch.eye(5)[[1, 0, 2, 4]], labels)
    assert (acc.correct, acc.total) == (1, 2)


def test_depth_errors_and_loss_skip_missing_ground_truth() -> None:
    target = torch.tensor([[[[2.0, 0.0], [4.0, 1.0]]]])
    pred = torch.tensor([[[[3.0, 9.0], [3.0, 1.5]]]])
    absolute, relative = DepthAbsoluteError(), DepthRelativeError()
    for m in (absolute, relative):
        m.update(pred, target)
    assert absolute.compute() == pytest.approx((1 + 1 + 0.5) / 3)
    assert relative.compute() == pytest.approx((1 / 2 + 1 / 4 + 0.5 / 1) / 3)
    assert float(depth_loss(pred, target)) == pytest.approx((1 + 1 + 0.5) / 3)


def unit(deg: float) -> list[float]:
    r = math.radians(deg)
    return [math.sin(r), 0.0, math.cos(r)]


def test_normal_angle_statistics_by_hand() -> None:
    angles = [0.0, 10.0, 20.0, 29.0, 40.0, 5.0]
    truth = torch.tensor([[0.0, 0.0, 1.0]] * 6 + [[0.0, 0.0, 0.0]]).T.reshape(1, 3, 1, 7)  # last pixel: no normal
    pred = torch.tensor([unit(a) for a in angles] + [[1.0, 0.0, 0.0]]).T.reshape(1, 3, 1, 7)
    metrics = [NormalAngleMean(), NormalAngleMedian(), NormalWithin11(), NormalWithin22(), NormalWithin30()]
    for m in metrics:
        m.update(pred[..., :4], truth[..., :4])  # streaming over two batches
        m.update(pred[..., 4:], truth[..., 4:])
    mean, median, w11, w22, w30 = (m.compute() for m in metrics)
    assert mean == pytest.approx(sum(angles) / 6, abs=1e-3)
    assert median == pytest.approx(15.0, abs=0.01)  # np.median of {0, 5, 10, 20, 29, 40}
    assert (w11, w22, w30) == (pytest.approx(3 / 6), pytest.approx(4 / 6), pytest.approx(5 / 6))
    assert [m.name for m in metrics[2:]] == ["within_11.25", "within_22.5", "within_30"]
    loss = normal_loss(pred, truth)
    cosines = torch.cos(torch.deg2rad(torch.tensor(angles)))
    assert float(loss) == pytest.approx(float(1 - cosines.mean()), abs=1e-6)


def test_segmentation_loss_ignores_unlabelled_pixels() -> None:
    logits = torch.randn(1, 4, 2, 3)
    labels = torch.tensor([[[0, -1, 3], [-1, -1, 2]]])
    mask = labels >= 0
    expected = torch.nn.functional.cross_entropy(logits.permute(0, 2, 3, 1)[mask], labels[mask])
    assert float(segmentation_loss(logits, labels)) == pytest.approx(float(expected), rel=1e-6)
    assert float(segmentation_loss(logits, torch.full((1, 2, 3), -1))) == 0.0


def test_standardised_targets_give_errors_in_original_units() -> None:
    y = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])  # standardised values
    target = with_scale(y, torch.tensor([10.0, 0.5]))
    pred = torch.tensor([[1.5, 2.0], [2.0, 7.0]])
    mae0, mae1, rmse0 = MAE(), MAE(), RMSE()
    mae0.update(pred[:, 0], target[:, 0])
    rmse0.update(pred[:, 0], target[:, 0])
    mae1.update(pred[:, 1], target[:, 1])
    assert mae0.compute() == pytest.approx((0.5 + 1.0) / 2 * 10)
    assert rmse0.compute() == pytest.approx(math.sqrt((25 + 100) / 2))
    assert mae1.compute() == pytest.approx(0.0)  # the NaN target is skipped
    assert float(standardised_mse(pred[:, 1], target[:, 1])) == pytest.approx(0.0)
