"""Multi-task scores on hand-computed cases: Δm%, ranks with ties, mean rank, Pareto sets, hypervolume."""

from __future__ import annotations

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.scoring import delta_m, hypervolume, mean_rank, pareto_mask, rank_with_ties
from mtlflow.metrics.task import metric_error

SPECS = {
    "cls": {"acc": {"higher_is_better": True}, "loss": {"higher_is_better": False}},
    "reg": {"mae": {"higher_is_better": False}, "rmse": {"higher_is_better": False},
            "loss": {"higher_is_better": False}},
}


# -- Δm% ------------------------------------------------------------------------------------------

def test_delta_m_worked_example() -> None:
    refs = {"cls": {"acc": 0.80, "loss": 0.5}, "reg": {"mae": 2.0, "rmse": 4.0, "loss": 1.0}}
    values = {"cls": {"acc": 0.84, "loss": 9.0}, "reg": {"mae": 2.5, "rmse": 3.0, "loss": 9.0}}
    # By hand, one term per metric (the training loss is excluded by default):
    #   cls/acc  (higher is better): -(0.84 - 0.80) / 0.80 = -0.05
    #   reg/mae  (lower is better):  +(2.5  - 2.0)  / 2.0  = +0.25
    #   reg/rmse (lower is better):  +(3.0  - 4.0)  / 4.0  = -0.25
    #   Δm = 100 * (-0.05 + 0.25 - 0.25) / 3 = -5/3 % (better than the references)
    assert delta_m(values, refs, SPECS) == pytest.approx(-5.0 / 3.0, abs=1e-12)


def test_delta_m_is_zero_against_itself_and_signs_follow_direction() -> None:
    refs = {"cls": {"acc": 0.80}, "reg": {"mae": 2.0}}
    assert delta_m(refs, refs, SPECS) == 0.0
    # higher accuracy alone: negative (better); higher MAE alone: positive (worse)
    assert delta_m({"cls": {"acc": 0.88}, "reg": {"mae": 2.0}}, refs, SPECS) == pytest.approx(-5.0)
    assert delta_m({"cls": {"acc": 0.80}, "reg": {"mae": 2.2}}, refs, SPECS) == pytest.approx(5.0)


def test_delta_m_metric_selection_and_negative_reference() -> None:
    refs = {"cls": {"acc": 0.80}, "reg": {"mae": 2.0, "rmse": -4.0}}
    values = {"cls": {"acc": 0.84}, "reg": {"mae": 2.5, "rmse": -3.0}}
    # only acc: -(0.04 / 0.8) = -5 %
    assert delta_m(values, refs, SPECS, metrics={"cls": ["acc"], "reg": []}) == pytest.approx(-5.0)
    # a negative reference is normalised by its magnitude: (-3 - (-4)) / 4 = +25 %
    assert delta_m(values, refs, SPECS, metrics={"cls": [], "reg": ["rmse"]}) == pytest.approx(25.0)


def test_delta_m_rejects_undefined_cases() -> None:
    with pytest.raises(InvalidParameterError, match="is 0"):
        delta_m({"cls": {"acc": 0.5}}, {"cls": {"acc": 0.0}}, SPECS)
    with pytest.raises(InvalidParameterError, match="lack task"):
        delta_m({"cls": {"acc": 0.5}}, {"reg": {"mae": 1.0}}, SPECS)
    with pytest.raises(InvalidParameterError, match="no metric"):
        delta_m({"cls": {"acc": 0.5, "loss": 1.0}}, {"cls": {"loss": 1.0}}, SPECS)


# -- ranks ----------------------------------------------------------------------------------------

def test_rank_with_ties_higher_is_better() -> None:
    # 0.9 and 0.9 share ranks 1 and 2 -> 1.5; 0.8 is 3rd; 0.7 is 4th
    assert rank_with_ties([0.9, 0.8, 0.9, 0.7], higher_is_better=True) == [1.5, 3.0, 1.5, 4.0]


def test_rank_with_ties_lower_is_better() -> None:
    # 1 -> 1, 2 -> 2, the two 3s share ranks 3 and 4 -> 3.5, 5 -> 5
    assert rank_with_ties([3.0, 1.0, 3.0, 2.0, 5.0], higher_is_better=False) == [3.5, 1.0, 3.5, 2.0, 5.0]
    # three-way tie in the middle: ranks 2, 3, 4 -> 3
    assert rank_with_ties([0.0, 1.0, 1.0, 1.0, 2.0], higher_is_better=False) == [1.0, 3.0, 3.0, 3.0, 5.0]
    assert rank_with_ties([5.0, 5.0, 5.0], higher_is_better=True) == [2.0, 2.0, 2.0]
    assert rank_with_ties([7.0], higher_is_better=True) == [1.0]


def test_mean_rank_with_ties_ignores_loss() -> None:
    results = {
        "A": {"cls": {"acc": 0.9, "loss": 5.0}, "reg": {"mae": 1.0, "rmse": 1.0, "loss": 5.0}},
        "B": {"cls": {"acc": 0.9, "loss": 0.1}, "reg": {"mae": 2.0, "rmse": 3.0, "loss": 0.1}},
        "C": {"cls": {"acc": 0.8, "loss": 0.2}, "reg": {"mae": 1.0, "rmse": 2.0, "loss": 0.2}},
    }
    # acc:  A 1.5, B 1.5, C 3      mae: A 1.5, C 1.5, B 3      rmse: A 1, C 2, B 3
    # MR:   A (1.5 + 1.5 + 1) / 3 = 4/3;  B (1.5 + 3 + 3) / 3 = 2.5;  C (3 + 1.5 + 2) / 3 = 13/6
    ranks = mean_rank(results, SPECS)
    assert ranks == pytest.approx({"A": 4 / 3, "B": 2.5, "C": 13 / 6})
    # restricting the metrics changes the ranking: on acc alone A and B tie
    only_acc = mean_rank(results, SPECS, metrics={"cls": ["acc"], "reg": []})
    assert only_acc == pytest.approx({"A": 1.5, "B": 1.5, "C": 3.0})
    assert mean_rank({}, SPECS) == {}


# -- Pareto sets ----------------------------------------------------------------------------------

def test_pareto_mask_dominated_and_duplicates() -> None:
    points = [(1, 2), (2, 1), (2, 2), (1, 2), (3, 0.5), (1, 3)]
    # (2, 2) is dominated by (1, 2); (1, 3) by (1, 2) (equal in one coordinate, worse in the other);
    # the duplicate (1, 2) points do not dominate each other, so both stay.
    assert pareto_mask(points) == [True, True, False, True, True, False]


def test_pareto_mask_single_point_and_chain() -> None:
    assert pareto_mask([(0.3, 0.7)]) == [True]
    assert pareto_mask([(3, 3, 3), (2, 2, 2), (1, 1, 1)]) == [False, False, True]
    assert pareto_mask([(1, 0), (0, 1)]) == [True, True]


# -- hypervolume ----------------------------------------------------------------------------------

def test_hypervolume_two_points_by_hand() -> None:
    # [0.2,1]x[0.5,1] (0.8*0.5 = 0.4) ∪ [0.5,1]x[0.2,1] (0.5*0.8 = 0.4), overlap [0.5,1]² (0.25)
    # -> 0.4 + 0.4 - 0.25 = 0.55
    assert hypervolume([(0.2, 0.5), (0.5, 0.2)], (1.0, 1.0)) == pytest.approx(0.55)


def test_hypervolume_points_outside_reference_contribute_nothing() -> None:
    base = [(0.2, 0.5), (0.5, 0.2)]
    assert hypervolume(base + [(1.5, 0.1)], (1.0, 1.0)) == pytest.approx(0.55)
    assert hypervolume(base + [(1.0, 0.1)], (1.0, 1.0)) == pytest.approx(0.55)  # on the boundary
    assert hypervolume([(1.5, 0.1), (0.1, 2.0)], (1.0, 1.0)) == 0.0
    # a dominated point adds nothing
    assert hypervolume(base + [(0.6, 0.6)], (1.0, 1.0)) == pytest.approx(0.55)


def test_hypervolume_three_dimensions() -> None:
    assert hypervolume([(0.0, 0.0, 0.0)], (1.0, 1.0, 1.0)) == pytest.approx(1.0)
    # boxes 1*1*0.5 and 0.5*0.5*1 overlapping in [0.5,1]³ (0.125): 0.5 + 0.25 - 0.125
    assert hypervolume([(0.0, 0.0, 0.5), (0.5, 0.5, 0.0)], (1.0, 1.0, 1.0)) == pytest.approx(0.625)


def test_hypervolume_rejects_dimension_mismatch() -> None:
    with pytest.raises(InvalidParameterError):
        hypervolume([(0.1, 0.2, 0.3)], (1.0, 1.0))


def test_metric_error_orientation() -> None:
    assert metric_error(0.9, higher_is_better=True, unit_interval=True) == pytest.approx(0.1)
    assert metric_error(3.0, higher_is_better=True, unit_interval=False) == -3.0
    assert metric_error(2.5, higher_is_better=False, unit_interval=False) == 2.5


def test_delta_m_leaves_out_metrics_whose_reference_has_no_relative_change() -> None:
    from mtlflow.metrics.scoring import comparable_metrics

    references = {"a": {"loss": 0.3, "f1": 0.0, "acc": 0.8, "roc_auc": float("nan")}, "b": {"mae": 2.0}}
    usable, excluded = comparable_metrics(references)
    assert usable == {"a": ["acc"], "b": ["mae"]} and excluded == {"a": ["f1", "roc_auc"]}
    specs = {"a": {"acc": {"higher_is_better": True}}, "b": {"mae": {"higher_is_better": False}}}
    values = {"a": {"acc": 0.88, "f1": 0.5}, "b": {"mae": 1.0}}
    # by hand: acc +10 % (an improvement, -10), mae -50 % (-50): mean -30
    assert delta_m(values, references, specs, usable) == pytest.approx(-30.0)
