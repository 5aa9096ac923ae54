"""The learned front's metrics (PaLoRA Fig. 5b and Figs. 12-13) on hand-checked fronts, through
``mtlflow.pareto.front`` (the code the trainer and the aggregate call)."""

from __future__ import annotations

import pytest
import torch

from mtlflow.pareto.front import aggregate_fronts, front_record, summarise_points

TASKS = ["a", "b"]
PRIMARY = {"a": "loss", "b": "loss"}
SPECS = {t: {"loss": {"higher_is_better": False, "unit_interval": False}} for t in TASKS}
REFERENCE = [1.0, 1.0]


def _points(errors):
    return [{"a": {"loss": ea}, "b": {"loss": eb}} for ea, eb in errors]


def test_a_front_of_identical_points_counts_one_non_dominated_point():
    # every preference gave the same model: the front learned nothing and must not score the maximum
    summary = summarise_points(_points([(0.3, 0.4)] * 11), TASKS, PRIMARY, SPECS, REFERENCE)
    assert summary["non_dominated"] == 1
    assert summary["pareto_mask"] == [True] * 11


def test_non_dominated_count_is_the_number_of_distinct_pareto_optimal_vectors():
    # by hand: (0.6, 0.6) is dominated by (0.5, 0.5); the duplicate (0.1, 0.9) counts once -> 3
    errors = [(0.1, 0.9), (0.1, 0.9), (0.5, 0.5), (0.9, 0.1), (0.6, 0.6)]
    summary = summarise_points(_points(errors), TASKS, PRIMARY, SPECS, REFERENCE)
    assert summary["pareto_mask"] == [True, True, True, True, False]
    assert summary["non_dominated"] == 3


def test_spearman_between_preference_and_error_matches_a_hand_computation():
    prefs = torch.tensor([[0.0, 1.0], [0.25, 0.75], [0.5, 0.5], [0.75, 0.25], [1.0, 0.0]], dtype=torch.float64)
    # task a: error falls strictly as λ_a grows -> ρ = -1
    # task b: ranks of λ_b (5,4,3,2,1), of its errors (2,1,4,3,5): Σd² = 36, ρ = 1 - 6·36/(5·24) = -0.8
    errors = [(0.9, 0.2), (0.7, 0.1), (0.5, 0.4), (0.3, 0.3), (0.1, 0.5)]
    record = front_record(prefs, {"val": _points(errors)}, TASKS, PRIMARY, SPECS, REFERENCE)
    rho = record["splits"]["val"]["spearman"]
    assert rho["a"] == pytest.approx(-1.0, abs=1e-12)
    assert rho["b"] == pytest.approx(-0.8, abs=1e-12)


def test_spearman_is_undefined_for_a_constant_task_error_and_the_aggregate_carries_it():
    prefs = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    errors = [(0.4, 0.2), (0.4, 0.3), (0.4, 0.1)]
    # ranks of λ_b (3,2,1), of its errors (2,3,1): Σd² = 2, ρ = 1 - 6·2/(3·8) = 0.5
    record = front_record(prefs, {"val": _points(errors)}, TASKS, PRIMARY, SPECS, REFERENCE)
    assert record["splits"]["val"]["spearman"] == {"a": None, "b": pytest.approx(0.5, abs=1e-12)}
    merged = aggregate_fronts([record, record], "val", TASKS, PRIMARY, SPECS)
    assert merged["spearman"] == {"a": None, "b": pytest.approx(0.5, abs=1e-12)}
    assert merged["non_dominated"] == 1   # (0.4, 0.1) dominates both other points


@pytest.mark.parametrize("a, b, expected", [
    ((1.0, 2.0), (1.0, 3.0), True),    # equal in one error, lower in the other
    ((1.0, 2.0), (2.0, 3.0), True),    # lower in both
    ((1.0, 3.0), (1.0, 2.0), False),   # the other way round
    ((1.0, 2.0), (1.0, 2.0), False),   # a point does not dominate itself
    ((0.0, 5.0), (1.0, 2.0), False),   # a trade-off: neither dominates
])
def test_dominance_is_lower_or_equal_everywhere_and_lower_somewhere(a, b, expected) -> None:
    from mtlflow.pareto.front import dominates

    assert dominates(a, b) is expected
