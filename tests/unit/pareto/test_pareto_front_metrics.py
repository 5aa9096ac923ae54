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


def test_the_aggregate_of_seeds_keeps_the_grid_and_the_spread_of_their_hypervolumes():
    from mtlflow.core.errors import InvalidParameterError

    prefs = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    one = front_record(prefs, {"val": _points([(0.2, 0.8), (0.5, 0.5), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    two = front_record(prefs, {"val": _points([(0.1, 0.7), (0.4, 0.4), (0.7, 0.1)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    merged = aggregate_fronts([one, two], "val", TASKS, PRIMARY, SPECS)
    per_seed = [one["splits"]["val"]["hypervolume"], two["splits"]["val"]["hypervolume"]]
    assert merged["split"] == "val" and merged["reference_point"] == REFERENCE
    assert merged["preferences"] == one["preferences"]
    assert merged["hypervolume_per_seed"] == per_seed
    # two seeds: the sample standard deviation is |h1 - h2| / √2
    assert merged["hypervolume_seed_std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2 ** 0.5, rel=1e-12)
    assert aggregate_fronts([one], "val", TASKS, PRIMARY, SPECS)["hypervolume_seed_std"] == 0.0
    with pytest.raises(InvalidParameterError) as caught:
        aggregate_fronts([one, two], "test", TASKS, PRIMARY, SPECS)
    assert str(caught.value) == "the preference front of 2 run(s) lacks the 'test' split"
    other_grid = front_record(prefs.flip(0), {"val": _points([(0.1, 0.7)] * 3)}, TASKS, PRIMARY, SPECS, REFERENCE)
    with pytest.raises(InvalidParameterError) as caught:
        aggregate_fronts([one, other_grid], "val", TASKS, PRIMARY, SPECS)
    assert str(caught.value).startswith("the runs of one method were evaluated on different preference grids")


def test_front_methods_list_the_methods_their_front_dominates():
    from mtlflow.pareto.front import attach_fronts

    prefs = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    front = front_record(prefs, {"val": _points([(0.2, 0.8), (0.4, 0.4), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS,
                         REFERENCE)
    # LS comes first and has no front. By hand: the front's (0.4, 0.4) dominates LS's (0.5, 0.5); no front
    # point has an error ≤ 0.1 on task a, so none dominates MGDA's (0.1, 0.9)
    rows = {"ls": {"primary_errors": [0.5, 0.5]}, "palora": {"primary_errors": [0.4, 0.4]},
            "mgda": {"primary_errors": [0.1, 0.9]}}
    groups = {"ls": [{"metrics": {}}], "palora": [{"metrics": {"preference_front": front}}] * 2,
              "mgda": [{"metrics": {}}]}
    assert attach_fronts(rows, groups, "val", TASKS, PRIMARY, SPECS) == ["palora"]
    assert rows["palora"]["preference_front"]["dominates"] == ["ls"]  # never itself, never mgda
    assert "preference_front" not in rows["ls"] and "preference_front" not in rows["mgda"]


def test_the_report_tables_of_a_front_method_show_its_reference_point_and_grid():
    from mtlflow.pareto.front import attach_fronts, front_tables

    prefs = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    front = front_record(prefs, {"val": _points([(0.2, 0.8), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    rows = {"palora": {"primary_errors": [0.5, 0.5], "seeds": [0, 1], "hypervolume": 0.25},
            "ls": {"primary_errors": [0.9, 0.9]}}
    attach_fronts(rows, {"palora": [{"metrics": {"preference_front": front}}] * 2, "ls": [{"metrics": {}}]},
                  "val", TASKS, PRIMARY, SPECS)
    summary = {"preference_front_methods": ["palora"], "tasks": TASKS, "primary_metrics": PRIMARY,
               "hypervolume_reference_point": REFERENCE, "split": "val", "methods": rows}
    (title, overview_header, overview), (grid_title, header, grid) = front_tables(summary)
    assert title == "Pareto-front methods (val split, hypervolume reference point [1.0, 1.0])"
    assert overview_header == ["method", "seeds", "grid points", "HV of the mean front ↑", "HV per seed ↑",
                               "distinct non-dominated ↑", "Spearman ρ(λ_t, error_t) per task ↓",
                               "HV of the centre point ↑", "single-point methods it dominates"]
    merged = rows["palora"]["preference_front"]
    # by hand: each task's error rises with its own weight over the two grid points, ρ = +1 for both
    assert overview == [["palora", "2", "2", f"{merged['hypervolume']:.4f}",
                         f"{merged['hypervolume_seed_mean']:.4f} ± 0.0000", "2/2", "+1.00, +1.00", "0.2500", "ls"]]
    del rows["ls"]
    attach_fronts(rows, {"palora": [{"metrics": {"preference_front": front}}]}, "val", TASKS, PRIMARY, SPECS)
    assert front_tables(summary)[0][2][0][-1] == "none"  # a front that dominates no single-point method
    assert grid_title == "palora: front on the preference grid (mean over seeds)"
    assert header == ["λ", "a loss", "b loss", "non-dominated"]
    assert grid == [["0.00, 1.00", "0.2000", "0.8000", "yes"], ["1.00, 0.00", "0.8000", "0.2000", "yes"]]


def test_the_front_tables_mark_dominated_grid_points_and_undefined_correlations():
    from mtlflow.pareto.front import attach_fronts, front_tables

    prefs = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    # task a's error is constant (ρ undefined: "–"); by hand (0.4, 0.2) dominates the two other points, and
    # LS's (0.5, 0.5) and MGDA's (0.6, 0.3); task b: ranks of λ_b (3, 2, 1), of its errors (2, 3, 1), ρ = 0.5
    front = front_record(prefs, {"val": _points([(0.4, 0.8), (0.4, 0.9), (0.4, 0.2)])}, TASKS, PRIMARY, SPECS,
                         REFERENCE)
    rows = {"palora": {"primary_errors": [0.4, 0.4], "seeds": [0], "hypervolume": 0.36},
            "ls": {"primary_errors": [0.5, 0.5]}, "mgda": {"primary_errors": [0.6, 0.3]}}
    attach_fronts(rows, {"palora": [{"metrics": {"preference_front": front}}], "ls": [{"metrics": {}}],
                         "mgda": [{"metrics": {}}]}, "val", TASKS, PRIMARY, SPECS)
    summary = {"preference_front_methods": ["palora"], "tasks": TASKS, "primary_metrics": PRIMARY,
               "hypervolume_reference_point": REFERENCE, "split": "val", "methods": rows}
    (_, _, overview), (_, _, grid) = front_tables(summary)
    assert overview[0][5:7] == ["1/3", "–, +0.50"] and overview[0][-1] == "ls, mgda"
    assert [row[-1] for row in grid] == ["", "", "yes"]


def test_the_selected_front_is_the_mean_of_the_window_and_none_when_an_epoch_of_it_has_no_front():
    from mtlflow.core.errors import InvalidParameterError
    from mtlflow.pareto.front import select_front

    prefs = torch.tensor([[0.1, 0.9], [0.9, 0.1]], dtype=torch.float64)  # not exact in float32
    first = front_record(prefs, {"val": _points([(0.2, 0.8), (0.6, 0.4)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    second = front_record(prefs, {"val": _points([(0.4, 0.6), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    history = [{"epoch": 1, "preference_front": first}, {"epoch": 2, "preference_front": second}]
    mean = select_front(history, "last-k:2", TASKS, PRIMARY, SPECS)
    assert mean["selection"] == {"rule": "last-k:2", "epochs": [1, 2]}
    assert mean["preferences"] == [[0.1, 0.9], [0.9, 0.1]]
    assert [p["a"]["loss"] for p in mean["splits"]["val"]["metrics"]] == pytest.approx([0.3, 0.7])
    assert select_front(history, "last", TASKS, PRIMARY, SPECS)["splits"]["val"]["metrics"] == \
        second["splits"]["val"]["metrics"]
    # an epoch of the window without a front (or no epoch at all): no front to select
    assert select_front([history[0], {"epoch": 2}], "last-k:2", TASKS, PRIMARY, SPECS) is None
    assert select_front([{"epoch": 1}, history[1]], "last-k:2", TASKS, PRIMARY, SPECS) is None
    assert select_front([], "last", TASKS, PRIMARY, SPECS) is None
    moved = front_record(prefs.flip(0), {"val": _points([(0.4, 0.6), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    with pytest.raises(InvalidParameterError) as caught:
        select_front([history[0], {"epoch": 2, "preference_front": moved}], "last-k:2", TASKS, PRIMARY, SPECS)
    assert str(caught.value).startswith("the selected epochs' fronts were evaluated on different preference grids")


def test_the_front_figure_draws_every_split_s_errors_labelled_by_lambda_one():
    import matplotlib.pyplot as plt

    from mtlflow.pareto.front import front_figure, front_plot

    prefs = torch.tensor([[0.1, 0.9], [0.6, 0.4], [0.9, 0.1]], dtype=torch.float64)
    front = front_record(prefs, {"val": _points([(0.2, 0.8), (0.5, 0.5), (0.8, 0.3)]),
                                 "test": _points([(0.3, 0.7), (0.6, 0.4), (0.9, 0.2)])},
                         TASKS, PRIMARY, SPECS, REFERENCE)
    fig = front_figure(front, TASKS, PRIMARY, "palora on toy")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[0.2, 0.5, 0.8], [0.3, 0.6, 0.9]]  # task a's errors
    assert [list(line.get_ydata()) for line in lines] == [[0.8, 0.5, 0.3], [0.7, 0.4, 0.2]]  # task b's errors
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [f"{split} (HV {front['splits'][split]['hypervolume']:.4f}, "
                      f"{front['splits'][split]['non_dominated']}/3 non-dominated)" for split in ("val", "test")]
    assert [t.get_text() for t in ax.texts] == ["0.1", "0.6", "0.9"] * 2  # λ₁ at every point
    assert [t.xy for t in ax.texts][:3] == [(0.2, 0.8), (0.5, 0.5), (0.8, 0.3)]
    # each label sits 3 points up and right of its marker, not on it (nor at data point (3, 3))
    assert {(t.anncoords, t.xyann) for t in ax.texts} == {("offset points", (3, 3))}
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("a error (loss)", "b error (loss)")
    assert ax.get_title() == "palora on toy (labels: λ₁)"
    plt.close(fig)

    three = ["a", "b", "c"]
    specs3 = {t: {"loss": {"higher_is_better": False, "unit_interval": False}} for t in three}
    grid = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    points = [{"a": {"loss": 0.1 * i}, "b": {"loss": 0.2}, "c": {"loss": 0.3 + 0.1 * i}} for i in range(3)]
    record = front_record(grid, {"val": points}, three, {t: "loss" for t in three}, specs3, [1.0, 1.0, 1.0])
    fig = front_figure(record, three, {t: "loss" for t in three}, "three")
    ax = fig.axes[0]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[0, 1, 2]] * 3  # parallel coordinates
    assert [y for line in ax.get_lines() for y in line.get_ydata()] == pytest.approx(
        [0.0, 0.2, 0.3, 0.1, 0.2, 0.4, 0.2, 0.2, 0.5])
    assert len(ax.get_legend().get_texts()) == 1  # one legend entry per split
    assert [t.get_text() for t in ax.get_xticklabels()] == three and ax.get_ylabel() == "error of the primary metric"
    assert ax.get_title() == "three" and not ax.texts
    plt.close(fig)
    assert front_plot(front, TASKS, PRIMARY, "png").startswith(b"\x89PNG")


def test_fronts_with_the_same_grid_but_another_reference_point_are_not_averaged():
    from mtlflow.core.errors import InvalidParameterError

    prefs = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    one = front_record(prefs, {"val": _points([(0.2, 0.8), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    moved = front_record(prefs, {"val": _points([(0.2, 0.8), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, [2.0, 2.0])
    with pytest.raises(InvalidParameterError) as caught:
        aggregate_fronts([one, moved], "val", TASKS, PRIMARY, SPECS)
    assert str(caught.value) == ("the runs of one method were evaluated on different preference grids or reference "
                                 "points; use the same eval_subdivisions for all of them")


def test_the_front_figure_names_each_axis_s_own_primary_metric_and_colours_lines_by_split():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from mtlflow.pareto.front import front_figure

    primary = {"a": "loss", "b": "mse"}
    specs = {"a": SPECS["a"], "b": {"mse": {"higher_is_better": False, "unit_interval": False}}}
    prefs = torch.tensor([[0.2, 0.8], [0.8, 0.2]], dtype=torch.float64)
    points = [{"a": {"loss": 0.2}, "b": {"mse": 0.8}}, {"a": {"loss": 0.7}, "b": {"mse": 0.1}}]
    fig = front_figure(front_record(prefs, {"val": points}, TASKS, primary, specs, REFERENCE), TASKS, primary, "t")
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("a error (loss)", "b error (mse)")
    plt.close(fig)

    three = ["a", "b", "c"]
    specs3 = {t: {"loss": {"higher_is_better": False, "unit_interval": False}} for t in three}
    grid = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    points = [{"a": {"loss": 0.1 * i}, "b": {"loss": 0.2}, "c": {"loss": 0.3 + 0.1 * i}} for i in range(3)]
    record = front_record(grid, {"val": points, "test": points}, three, {t: "loss" for t in three}, specs3,
                          [1.0, 1.0, 1.0])
    fig = front_figure(record, three, {t: "loss" for t in three}, "three")
    lines = fig.axes[0].get_lines()
    # three lines per split, each split in its own colour, its legend label on its first line
    assert [to_rgba(line.get_color()) for line in lines] == [to_rgba("C0")] * 3 + [to_rgba("C1")] * 3
    assert [not line.get_label().startswith("_") for line in lines] == [True, False, False] * 2
    plt.close(fig)


def test_the_front_record_names_its_objective_and_rounds_the_grid_to_twelve_digits():
    from mtlflow.pareto.front import OBJECTIVE

    prefs = torch.tensor([[1 / 3, 2 / 3], [2 / 3, 1 / 3]], dtype=torch.float64)
    record = front_record(prefs, {"val": _points([(0.2, 0.8), (0.8, 0.2)])}, TASKS, PRIMARY, SPECS, REFERENCE)
    assert set(record) == {"preferences", "reference_point", "objective", "splits"}
    assert record["objective"] == OBJECTIVE
    # twelve digits: a grid read back from JSON compares equal to the same grid rebuilt in another process
    assert record["preferences"] == [[0.333333333333, 0.666666666667], [0.666666666667, 0.333333333333]]


def test_vectors_exactly_the_tolerance_apart_are_one_point():
    from mtlflow.pareto.front import distinct_count

    assert distinct_count([[0.0, 0.0], [0.25, 0.0]], tol=0.25) == 1  # |a - b| = tol, exact in binary
    assert distinct_count([[0.0, 0.0], [0.5, 0.0]], tol=0.25) == 2


def test_the_error_of_a_bounded_higher_is_better_metric_is_one_minus_it():
    tasks, primary = ["a", "b"], {"a": "acc", "b": "loss"}
    specs = {"a": {"acc": {"higher_is_better": True, "unit_interval": True}}, "b": SPECS["b"]}
    prefs = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    record = front_record(prefs, {"val": [{"a": {"acc": 0.75}, "b": {"loss": 0.5}}]}, tasks, primary, specs,
                          REFERENCE)
    assert record["splits"]["val"]["errors"] == [[0.25, 0.5]]
