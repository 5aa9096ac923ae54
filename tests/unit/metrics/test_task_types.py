"""Task kinds: their default losses and metrics, checked by hand and against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtlflow.metrics.classification import masked_binary_cross_entropy, masked_cross_entropy
from mtlflow.metrics.regression import MAE, standardised_mse, with_scale
from mtlflow.metrics.task_types import BINARY, MULTICLASS, MULTILABEL, REGRESSION, TASK_TYPES, MacroF1


def test_macro_f1_by_hand_over_batches_with_missing_labels() -> None:
    metric = MacroF1()
    logits = torch.eye(3)[[0, 1, 1, 2, 0]]  # predictions 0 1 1 2 0
    metric.update(logits[:3], torch.tensor([0, 1, 2]))
    metric.update(logits[3:], torch.tensor([2, -1]))  # the -1 row counts nowhere
    # class 0: TP 1, FP 0, FN 0 -> 1; class 1: TP 1, FP 1 -> 2/3; class 2: TP 1, FN 1 -> 2/3
    assert metric.compute() == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    # a class never labelled nor predicted is left out of the mean
    only = MacroF1()
    only.update(torch.eye(4)[[0, 1]], torch.tensor([0, 1]))
    assert only.compute() == pytest.approx(1.0)
    assert MacroF1().compute() == 0.0


def test_r_squared_matches_numpy_and_ignores_missing_targets() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=50)
    p = y + rng.normal(scale=0.5, size=50)
    y_missing = y.copy()
    y_missing[[3, 7]] = np.nan
    metric = REGRESSION.task("t", hv_reference=1.0).metrics[2]()
    assert metric.name == "r2"
    scale = torch.tensor(4.0)
    for chunk in (slice(0, 20), slice(20, 50)):
        metric.update(torch.tensor(p[chunk]), with_scale(torch.tensor(y_missing[chunk]), scale))
    keep = ~np.isnan(y_missing)
    expected = 1 - ((p[keep] - y[keep]) ** 2).sum() / ((y[keep] - y[keep].mean()) ** 2).sum()
    assert metric.compute() == pytest.approx(expected, rel=1e-12)
    constant = type(metric)()
    constant.update(torch.zeros(3), with_scale(torch.ones(3), scale))
    assert math.isnan(constant.compute())


def test_each_kind_builds_its_default_task() -> None:
    assert set(TASK_TYPES) == {"binary", "multilabel", "multiclass", "regression"}
    binary = BINARY.task("toxic")
    assert (binary.loss, binary.primary, binary.hv_reference) == (masked_binary_cross_entropy, "roc_auc", 1.0)
    assert [m.name for m in binary.metrics] == ["roc_auc", "f1", "acc"]
    assert MULTILABEL.task("tags").primary == "f1"
    multiclass = MULTICLASS.task("species")
    assert multiclass.loss is masked_cross_entropy and [m.name for m in multiclass.metrics] == ["acc", "macro_f1"]
    regression = REGRESSION.task("price", hv_reference=10.0)
    assert regression.loss is standardised_mse and regression.primary == "mae" and regression.hv_reference == 10.0
    assert REGRESSION.standardised and not BINARY.standardised


def test_overrides_are_checked() -> None:
    assert BINARY.task("t", metrics=(MAE,), primary="mae").primary == "mae"
    with pytest.raises(ValueError, match="primary metric 'f1' of task 't' is not among its metrics"):
        BINARY.task("t", metrics=(MAE,), primary="f1")
    with pytest.raises(ValueError, match="regression task 'price' needs a hypervolume reference"):
        REGRESSION.task("price")
