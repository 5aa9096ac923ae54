"""The aggregate's statistics (jobs.summarise) and its report (jobs.report) on hand-made runs whose answers are
known: intervals over seeds, Δ% per task, normalised hypervolume, comparisons, the Pareto set at 95 %, the
warnings and the verdict box; the HTML is self-contained and well formed."""

from __future__ import annotations

import csv
import io
from html.parser import HTMLParser

import numpy as np
import pytest

from mtlflow import jobs
from mtlflow.jobs import report
from mtlflow.jobs.compare.summary import Summary, from_json, to_json
from mtlflow.metrics.intervals import BETTER, INDISTINGUISHABLE, mean_interval

SPECS = {"cls": {"acc": {"higher_is_better": True, "unit_interval": True},
                 "loss": {"higher_is_better": False, "unit_interval": False}},
         "reg": {"mae": {"higher_is_better": False, "unit_interval": False},
                 "loss": {"higher_is_better": False, "unit_interval": False}}}
HV_SCALE = {"cls": 1.0, "reg": 40.0}  # the regression task's error is in grams, say


def fake_run(method: str, seed: int, acc: float, mae: float, tasks=("cls", "reg"), converged: bool | None = None):
    final = {t: ({"acc": acc, "loss": 1 - acc} if t == "cls" else {"mae": mae, "loss": mae}) for t in tasks}
    run = {"benchmark": "spec", "dataset": "fake", "data_hash": "h" * 64,
           "config": {"method": method, "seed": seed, "hparams": {}}}
    metrics = {"tasks": list(tasks), "metric_specs": {t: SPECS[t] for t in tasks},
               "primary_metrics": {"cls": "acc", "reg": "mae"}, "hv_reference": HV_SCALE,
               "final": {"test": final}, "selection": {"rule": "best val"},
               "epochs": [{"epoch": 1, "step_seconds_median": 0.01, "peak_memory_bytes": 1,
                           "splits": {"test": final}}]}
    if converged is not None:
        run["converged"] = converged
    return {"dir": f"/runs/{method}-{'-'.join(tasks)}-{seed}", "run": run, "metrics": metrics}


# ls and "noisy" overlap; "strong" is better on both tasks by far more than the seed spread
RUNS = {"ls": [(0.80, 20.0), (0.82, 22.0), (0.78, 21.0)],
        "noisy": [(0.83, 19.0), (0.77, 23.0), (0.81, 20.5)],
        "strong": [(0.95, 10.0), (0.96, 10.5), (0.94, 9.5)]}
REFS = {"cls": [0.85, 0.87, 0.86], "reg": [18.0, 19.0, 20.0]}


def all_runs(seeds: int = 3):
    return [fake_run(m, s, *values[s]) for m, values in RUNS.items() for s in range(seeds)]


def references(seeds: int = 3):
    return ([fake_run("ls", s, a, 0.0, tasks=("cls",)) for s, a in enumerate(REFS["cls"][:seeds])]
            + [fake_run("ls", s, 0.0, e, tasks=("reg",)) for s, e in enumerate(REFS["reg"][:seeds])])


@pytest.fixture(scope="module")
def summary():
    return jobs.summarise(all_runs(), references(), paper_references=False)


def test_every_metric_is_a_mean_with_the_interval_of_its_seeds(summary):
    row = summary.methods["ls"]
    assert row.intervals["cls"]["acc"] == mean_interval([0.80, 0.82, 0.78])
    assert row.intervals["reg"]["mae"].mean == pytest.approx(21.0)
    low, high = row.intervals["reg"]["mae"].low, row.intervals["reg"]["mae"].high
    assert 20.0 <= low < 21.0 < high <= 22.0
    assert summary.references.intervals["cls"]["acc"] == mean_interval(REFS["cls"])
    assert summary.references.metrics["reg"]["mae"] == pytest.approx(np.mean(REFS["reg"]))


def test_delta_m_and_the_per_task_delta_are_the_hand_formula_per_seed(summary):
    ref_acc, ref_mae = np.mean(REFS["cls"]), np.mean(REFS["reg"])
    row = summary.methods["strong"]
    per_task = {"cls": [-100 * (a - ref_acc) / ref_acc for a, _ in RUNS["strong"]],
                "reg": [100 * (e - ref_mae) / ref_mae for _, e in RUNS["strong"]]}
    for task, values in per_task.items():
        assert row.delta_task[task].mean == pytest.approx(np.mean(values))
    # Δm% averages every non-loss metric of each task: here one per task
    per_seed = [(c + r) / 2 for c, r in zip(per_task["cls"], per_task["reg"], strict=True)]
    assert row.delta_m.per_seed == pytest.approx(per_seed)
    assert to_json(row.delta_m.interval) == pytest.approx(mean_interval(per_seed).as_dict())


def test_hypervolume_is_on_errors_scaled_by_each_tasks_reference_error(summary):
    row = summary.methods["strong"]
    expected = [(1 - (1 - a) / HV_SCALE["cls"]) * (1 - e / HV_SCALE["reg"]) for a, e in RUNS["strong"]]
    assert row.hypervolume_per_seed == pytest.approx(expected)
    assert row.hypervolume == pytest.approx(np.mean(expected))
    assert summary.hypervolume_normalised.reference_point == (1.0, 1.0)
    assert summary.hypervolume_normalised.scale == (1.0, 40.0)


def test_comparisons_say_better_for_a_clear_gap_and_indistinguishable_for_noise(summary):
    assert summary.best_method == "strong" and summary.best_by == "delta_m" and summary.baseline == "ls"
    strong = summary.methods["strong"].versus["ls"]
    assert strong.delta_m.verdict == BETTER and strong.delta_m.probability_of_improvement == 1.0
    assert strong.tasks["cls"].verdict == BETTER and strong.tasks["reg"].verdict == BETTER
    noisy = summary.methods["noisy"].versus["ls"]
    assert noisy.delta_m.verdict == INDISTINGUISHABLE
    assert noisy.delta_m.low < 0 < noisy.delta_m.high
    # P(improvement) of noisy over ls on accuracy, counted by hand over the 9 seed pairs
    wins = sum((a > b) + 0.5 * (a == b) for a, _ in RUNS["noisy"] for b, _ in RUNS["ls"]) / 9
    assert noisy.tasks["cls"].probability_of_improvement == pytest.approx(wins)
    assert "ls" not in summary.methods["ls"].versus and "best" not in summary.methods["strong"].versus


def test_the_pareto_set_at_95_percent_keeps_what_is_not_dominated_with_confidence():
    # "close" is dominated by "top" on the means but not with confidence: it stays in the 95 % set
    runs = [fake_run("top", s, a, e) for s, (a, e) in enumerate([(0.90, 10.0), (0.91, 11.0), (0.89, 12.0)])]
    runs += [fake_run("close", s, a, e) for s, (a, e) in enumerate([(0.91, 10.5), (0.88, 12.5), (0.89, 11.5)])]
    runs += [fake_run("far", s, a, e) for s, (a, e) in enumerate([(0.50, 30.0), (0.52, 31.0), (0.51, 29.0)])]
    result = jobs.summarise(runs, [], paper_references=False)
    assert result.pareto_set == ("top",)
    assert result.pareto_set_confident == ("close", "top")
    assert result.methods["far"].pareto_confident is False


def test_mean_rank_intervals_hold_the_ranks_of_separated_methods(summary):
    assert summary.methods["strong"].mean_rank.mean == 1.0
    assert summary.methods["strong"].mean_rank.interval == (1.0, 1.0)
    for row in summary.methods.values():
        low, high = row.mean_rank.interval
        assert 1.0 <= low <= high <= 3.0


def test_one_seed_prints_no_interval_and_warns():
    result = jobs.summarise(all_runs(seeds=1), references(seeds=1), paper_references=False)
    table = report.markdown_table(result)
    assert "± 0.0000" not in table and "1 seed: no interval" in table
    assert result.methods["strong"].versus["ls"].delta_m.verdict == "no interval"
    assert any(w.startswith("fewer than 3 seeds") for w in result.warnings)
    assert any(w.startswith("single-task references with fewer than 3 seeds") for w in result.warnings)


def test_warnings_for_unconverged_runs_and_degenerate_references():
    runs = all_runs()
    runs[0] = fake_run("ls", 0, *RUNS["ls"][0], converged=False)
    refs = [fake_run("ls", s, 1.0, 0.0, tasks=("cls",)) for s in range(3)]  # a perfect single-task accuracy
    refs += [fake_run("ls", s, 0.0, e, tasks=("reg",)) for s, e in enumerate(REFS["reg"])]
    result = jobs.summarise(runs, refs, paper_references=False)
    assert any(w.startswith("not converged: train longer") and "ls (1 of 3 runs)" in w for w in result.warnings)
    assert any("degenerate single-task reference for cls: acc = 1" in w for w in result.warnings)
    assert not any("fewer than" in w for w in result.warnings)


def test_a_test_split_too_small_for_the_interval_is_a_warning():
    runs = all_runs()
    for r in runs:
        r["metrics"]["split_sizes"] = {"test": 40}
    result = jobs.summarise(runs, references(), paper_references=False)
    p = np.mean([a for values in RUNS.values() for a, _ in values])
    half = 1.96 * np.sqrt(p * (1 - p) / 40)
    assert any(w.startswith("test split too small for the interval printed: cls has 40 test examples, so its acc "
                            f"alone varies by about ±{half:.4f}") for w in result.warnings)
    # a large test split resolves the seed intervals: no warning
    for r in runs:
        r["metrics"]["split_sizes"] = {"test": 100_000}
    assert not any("too small" in w for w in jobs.summarise(runs, references(), paper_references=False).warnings)


@pytest.mark.parametrize("name", ["evaluation.json", "test_evaluation.json"])  # the CLI's, the pipelines' train step's
def test_the_test_split_size_is_read_from_the_per_example_evaluation(tmp_path, name):
    from mtlflow.core import atomic
    from mtlflow.metrics.evaluation import examples_path, write_examples

    runs = sorted(all_runs(), key=lambda r: r["dir"])
    runs[0]["dir"] = str(tmp_path)
    atomic.write_json(tmp_path / name, {"split": "test"})
    errors = np.array([0.0, 1.0, np.nan, 0.0] * 10)  # 30 labelled examples, 10 without a label
    write_examples(examples_path(tmp_path / name), {"cls": {"error": errors, "loss": errors}})
    result = jobs.summarise(runs, references(), paper_references=False)
    assert any("cls has 30 test examples" in w for w in result.warnings)


class _Checker(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.sources = [], [], []

    def handle_starttag(self, tag, attrs):
        self.sources += [v for k, v in attrs if k in ("src", "href")]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def test_the_report_opens_with_the_verdict_and_is_self_contained_and_well_formed(summary):
    png = report.pareto_plot(summary)
    page = report.html_report(summary, png, png)
    assert page.startswith("<!DOCTYPE html>\n<html lang=\"en\">")
    checker = _Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.stack == []
    assert all(s.startswith("data:image/png;base64,") for s in checker.sources) and len(checker.sources) == 2
    assert page.index("Verdict") < page.index("<h2>Results</h2>")
    assert "strong has the lowest Δm%" in page and "noisy" in page
    md = report.markdown_summary(summary)
    assert md.index("## Verdict") < md.index("## Results") and "strong against ls" in md
    assert "(target's units)" in md and "(0-1)" in md
    hostile = report.html_report(from_json(Summary, {**to_json(summary), "dataset": "<script>x</script>"}), png, png)
    assert "<script>" not in hostile and "&lt;script&gt;x&lt;/script&gt;" in hostile


def test_the_tables_carry_intervals_and_verdicts(summary):
    header, rows = report.table_rows(summary)
    assert rows[0][0] == "strong" and header[-4:] == ["MR ↓", "HV (normalised) ↑", "Pareto (95 %)", "step s"]
    ls = next(r for r in rows if r[0] == "ls")
    assert ls[header.index("vs ls")] == "baseline"
    assert next(r for r in rows if r[0] == "noisy")[header.index("vs ls")] == INDISTINGUISHABLE
    header, rows = report.csv_rows(summary)
    table = list(csv.reader(io.StringIO(report._markdown(header, rows).replace("|", ","))))
    assert table  # the CSV columns parse
    strong = dict(zip(header, next(r for r in rows if r[0] == "strong"), strict=True))
    assert float(strong["delta_m%"]) == pytest.approx(summary.methods["strong"].delta_m.mean)
    assert float(strong["delta_m% low"]) == pytest.approx(summary.methods["strong"].delta_m.interval.low)
    assert strong["vs ls verdict"] == BETTER and strong["pareto (95 %)"] == "yes"


def test_one_colour_per_method_in_every_figure(summary, monkeypatch):
    colours = report.method_colours(list(summary.methods))
    figures = []
    monkeypatch.setattr(report, "_figure_png", lambda fig: figures.append(fig) or b"png")
    report.pareto_plot(summary)
    runs = all_runs()
    report.curves_plot(runs, "test")
    from matplotlib.colors import to_hex

    scatter, curves = figures
    drawn = {}
    for ax in scatter.axes:
        for container in ax.containers:  # errorbar: (marker line, caps, bars), labelled by method
            drawn[container.get_label()] = to_hex(container.lines[0].get_color())
    assert drawn == colours
    for line in curves.axes[0].get_lines():
        assert to_hex(line.get_color()) == colours[line.get_label().split(" s")[0]]


def test_three_tasks_get_a_heat_map_of_the_per_task_delta(monkeypatch):
    SPECS["aux"] = SPECS["reg"]
    HV_SCALE["aux"] = 40.0
    try:
        def three(method, seed, acc, mae, tasks=("cls", "reg", "aux")):
            r = fake_run(method, seed, acc, mae, tasks=tasks)
            r["metrics"]["primary_metrics"]["aux"] = "mae"
            if "aux" in r["metrics"]["final"]["test"]:
                r["metrics"]["final"]["test"]["aux"] = {"mae": mae / 2, "loss": mae / 2}
            return r

        runs = [three(m, s, *values[s]) for m, values in RUNS.items() for s in range(3)]
        refs = [three("ls", s, a, 0.0, tasks=("cls",)) for s, a in enumerate(REFS["cls"])]
        refs += [three("ls", s, 0.0, e, tasks=(t,)) for t in ("reg", "aux") for s, e in enumerate(REFS["reg"])]
        result = jobs.summarise(runs, refs, paper_references=False)
        figures = []
        monkeypatch.setattr(report, "_figure_png", lambda fig: figures.append(fig) or b"png")
        report.pareto_plot(result)
        heat, *fronts = figures[0].axes[:4]
        assert heat.get_images() and len(fronts) == 3  # the heat map and the 3 pairwise fronts
        values = heat.get_images()[0].get_array()
        assert values[0, 1] == pytest.approx(result.methods["ls"].delta_task["reg"].mean)
    finally:
        del SPECS["aux"], HV_SCALE["aux"]


def test_the_kubeflow_metrics_carry_the_interval_bounds_and_the_verdicts(tmp_path, monkeypatch):
    from mtlflow.jobs import pipeline_steps

    runs, refs = {r["dir"]: r for r in all_runs()}, {r["dir"]: r for r in references()}
    monkeypatch.setattr(jobs, "read_run", lambda d: {**runs, **refs}[str(d)])

    def aggregate(run_dirs, out_dir, reference_dirs=(), method_set=None, baseline_dirs=()):
        summary = jobs.summarise([runs[d] for d in run_dirs], [refs[d] for d in reference_dirs],
                                 method_set=method_set, paper_references=False)
        report.write_report(summary, [runs[d] for d in run_dirs], tmp_path / "results")
        return summary

    monkeypatch.setattr(jobs, "aggregate", aggregate)
    out = pipeline_steps.aggregate(list(runs), list(refs), ["ls", "noisy", "strong"], str(tmp_path / "results"),
                                   str(tmp_path / "r.html"), str(tmp_path / "s.md"))
    summary = jobs.summarise(list(runs.values()), list(refs.values()), paper_references=False)
    strong = summary.methods["strong"]
    flat = out["metrics"]
    assert flat["strong.delta_m_pct_low"] == strong.delta_m.interval.low
    assert flat["strong.delta_m_pct_high"] == strong.delta_m.interval.high
    assert flat["strong.hypervolume_low"] == strong.hypervolume_interval.low
    assert flat["strong.cls.acc_low"] == strong.intervals["cls"]["acc"].low
    assert flat["strong.prob_improvement_vs_ls"] == 1.0 and "ls.prob_improvement_vs_ls" not in flat
    assert out["metadata"]["verdicts_vs_ls"] == {"noisy": INDISTINGUISHABLE, "strong": BETTER}
    assert out["metadata"]["best_method"] == "strong" and out["metadata"]["pareto_set_confident"] == ["strong"]


def test_a_metric_undefined_for_one_seed_has_no_interval_and_sorts_last():
    runs = all_runs()
    next(r for r in runs if r["run"]["config"]["method"] == "noisy")["metrics"]["final"]["test"]["cls"]["acc"] = \
        float("nan")
    result = jobs.summarise(runs, references(), paper_references=False)
    noisy = result.methods["noisy"]
    assert np.isnan(noisy.intervals["cls"]["acc"].mean) and noisy.intervals["cls"]["acc"].low is None
    assert noisy.versus["ls"].tasks["cls"].verdict == "no interval"
    assert result.best_method == "strong"
    assert [row[0] for row in report.table_rows(result)[1]] == ["strong", "ls", "noisy"]
