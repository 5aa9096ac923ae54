"""Scores: the error messages name the problem, and mean rank takes its columns from the first method.

Each test pins a behaviour that the mutation run (docs/development/mutation-testing.md) found unchecked: an
error raised with a wrong or empty message, and the mean rank built from another method's columns.
"""

from __future__ import annotations

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.scoring import delta_m, hypervolume, mean_rank, rank_with_ties

SPECS = {"a": {"acc": {"higher_is_better": True}, "err": {"higher_is_better": False}},
         "b": {"acc": {"higher_is_better": True}}}


def test_delta_m_with_no_metric_selected_says_there_is_nothing_to_compare() -> None:
    refs = {"a": {"acc": 0.5}}
    with pytest.raises(InvalidParameterError) as caught:
        delta_m({"a": {"acc": 0.6}}, refs, SPECS, metrics={"a": []})
    assert str(caught.value) == "Δm: no metric to compare"


def test_hypervolume_dimension_mismatch_names_the_points_shape_and_the_reference_dimension() -> None:
    with pytest.raises(InvalidParameterError) as caught:
        hypervolume([[0.1, 0.2, 0.3], [0.2, 0.1, 0.3]], reference=[1.0, 1.0])
    assert str(caught.value) == ("hypervolume: points of shape (2, 3) do not match a "
                                 "2-dimensional reference point")


def test_mean_rank_of_a_single_method_is_one() -> None:
    # with one method every metric ranks it first
    assert mean_rank({"ls": {"a": {"acc": 0.3, "err": 2.0, "loss": 9.0}}}, SPECS) == {"ls": 1.0}


def test_mean_rank_columns_are_the_first_methods_metrics() -> None:
    # "x" also reports a.err; the columns are those of the first method "ls": a.acc and b.acc.
    # a.acc: ls 0.9 (rank 1), x 0.8 (rank 2); b.acc: ls 0.1 (rank 2), x 0.7 (rank 1) -> both MR 1.5.
    results = {"ls": {"a": {"acc": 0.9}, "b": {"acc": 0.1}},
               "x": {"a": {"acc": 0.8, "err": 0.0}, "b": {"acc": 0.7}}}
    assert mean_rank(results, SPECS) == {"ls": 1.5, "x": 1.5}
    # had a.err (lower is better: x 0.0 first) counted, MR would be ls 5/3 and x 4/3


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_nan_scores_rank_after_every_number_and_tie_with_each_other(higher_is_better: bool) -> None:
    nan = float("nan")
    best, worst = (0.7, 0.5) if higher_is_better else (0.5, 0.7)
    assert rank_with_ties([worst, nan, best, nan], higher_is_better) == [2.0, 3.5, 1.0, 3.5]
    # 17 NaNs and one number: numpy's default (unstable) sort reorders NaNs from 17 items on; the NaNs share
    # ranks 2..18, mean 10, whatever their order
    assert rank_with_ties([nan] * 8 + [best] + [nan] * 9, higher_is_better) == [10.0] * 8 + [1.0] + [10.0] * 9
