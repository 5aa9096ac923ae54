"""The epoch-selection rules and the validation score early stopping watches, against hand computations."""

from __future__ import annotations

import math

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.selection import best_epoch_index, parse_selection, select_final, validation_score

SPECS = {"digit": {"acc": {"higher_is_better": True, "unit_interval": True}},
         "mass": {"mae": {"higher_is_better": False, "unit_interval": False}},
         "auc": {"roc_auc": {"higher_is_better": True, "unit_interval": True}}}
PRIMARY = {"digit": "acc", "mass": "mae"}


def test_the_validation_score_is_the_mean_relative_change_of_the_primary_errors():
    first = {"digit": {"loss": 1.0, "acc": 0.60}, "mass": {"loss": 9.0, "mae": 200.0}}
    later = {"digit": {"loss": 0.5, "acc": 0.80}, "mass": {"loss": 4.0, "mae": 150.0}}
    # digit error 0.4 -> 0.2: -50 %; mass error 200 g -> 150 g: -25 %; the grams do not outweigh the accuracy
    assert validation_score(later, first, PRIMARY, SPECS) == pytest.approx((-0.5 - 0.25) / 2, rel=1e-12)
    assert validation_score(first, first, PRIMARY, SPECS) == 0.0
    worse = {"digit": {"loss": 1.0, "acc": 0.50}, "mass": {"loss": 9.0, "mae": 300.0}}
    assert validation_score(worse, first, PRIMARY, SPECS) == pytest.approx((0.25 + 0.5) / 2, rel=1e-12)


def test_a_first_error_of_zero_scores_the_change_itself_and_an_undefined_metric_falls_back_to_the_loss():
    perfect = {"digit": {"loss": 0.1, "acc": 1.0}}
    later = {"digit": {"loss": 0.1, "acc": 0.9}}
    assert validation_score(later, perfect, {"digit": "acc"}, SPECS) == pytest.approx(0.1, rel=1e-12)
    first = {"auc": {"loss": 2.0, "roc_auc": math.nan}}
    now = {"auc": {"loss": 1.5, "roc_auc": math.nan}}  # one class in the val split: the loss decides
    assert validation_score(now, first, {"auc": "roc_auc"}, SPECS) == pytest.approx(-0.25, rel=1e-12)


def _epoch(epoch: int, score: float, value: float) -> dict:
    return {"epoch": epoch, "val_score": score,
            "splits": {"val": {"t": {"acc": value}}, "test": {"t": {"acc": value + 0.5}}}}


def test_best_val_selects_the_epoch_of_the_lowest_score_and_the_earliest_of_ties():
    history = [_epoch(1, 0.0, 0.1), _epoch(2, -0.3, 0.2), _epoch(3, -0.1, 0.3), _epoch(4, -0.3, 0.4)]
    assert best_epoch_index(history) == 1
    final = select_final(history, "best-val")
    assert final == {"val": {"t": {"acc": 0.2}}, "test": {"t": {"acc": 0.7}}}
    assert select_final(history, "last")["test"]["t"]["acc"] == 0.9
    assert select_final(history, "last-k:2")["val"]["t"]["acc"] == pytest.approx(0.35, rel=1e-12)


@pytest.mark.parametrize("rule, parsed", [("last", ("last", 1)), ("best-val", ("best-val", 1)),
                                          ("last-k:3", ("last-k", 3))])
def test_selection_rules_parse(rule, parsed):
    assert parse_selection(rule) == parsed


@pytest.mark.parametrize("rule", ["best", "best-val:2", "last-k:0", "last-k:x", ""])
def test_invalid_selection_rules_name_the_valid_ones(rule):
    with pytest.raises(InvalidParameterError, match="use 'last', 'last-k:K' with K >= 1 or 'best-val'"):
        parse_selection(rule)
