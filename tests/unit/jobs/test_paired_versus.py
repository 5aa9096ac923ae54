"""The paired per-example comparison of two methods in the sweep's summary (jobs.summarise: ``versus[role]
["paired"]``) on hand-built per-example files whose answer is known: the seed-averaged difference, its paired
bootstrap interval against a brute-force resampling loop with the same generator, the probability of
improvement counted by hand, and the entries that say why there is no paired comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtlflow import jobs
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import report
from mtlflow.jobs.compare.summary import Summary, from_json, to_json
from mtlflow.metrics.evaluation import write_examples
from mtlflow.metrics.paired import N_RESAMPLES, SEED

N = 200
HASH = "h" * 64
SPECS = {"cls": {"acc": {"higher_is_better": True, "unit_interval": True},
                 "loss": {"higher_is_better": False, "unit_interval": False}},
         "reg": {"mae": {"higher_is_better": False, "unit_interval": False},
                 "loss": {"higher_is_better": False, "unit_interval": False}}}
STATISTICS = {"cls": "acc_error", "reg": "mae"}
#: both tasks' paired errors of one kind and unit (absolute errors in grams): the mean over tasks is defined
SAME_UNIT_SPECS = {t: {"mae": {"higher_is_better": False, "unit_interval": False, "unit": "g"},
                       "loss": {"higher_is_better": False, "unit_interval": False}} for t in ("cls", "reg")}


def cls_errors(method: str, seed: int) -> np.ndarray:
    """0/1 errors: ls is wrong on examples 0-59 (and one more per seed), strong on 20 examples that move with the
    seed, inside the 140 that ls gets right -- so averaging over seeds gives fractional per-example errors."""
    e = np.zeros(N)
    if method == "ls":
        e[:60] = 1
        e[100 + seed] = 1
    else:
        e[150 + 5 * seed:170 + 5 * seed] = 1
    return e


def reg_errors(method: str, seed: int) -> np.ndarray:
    """Absolute errors in grams; examples 0-9 have no label (NaN)."""
    rng = np.random.default_rng(100 * seed + (method == "ls"))
    e = rng.gamma(2.0, 1.0, N) + (2.0 if method == "ls" else 1.5)
    e[:10] = np.nan
    return e


def write_run(root: Path, method: str, seed: int, data_hash: str = HASH, n: int = N, per_example: bool = True,
              given: bool = False, same_unit: bool = False) -> dict:
    """A finished run as read_run returns it, with its test evaluation and per-example values on disk: in the run
    directory (the pipelines' ``test_evaluation.json``) or, ``given``, in a separate folder (the DVC stage's).
    ``same_unit``: both tasks' primary metric an absolute error in grams (the cls errors as 0/1 grams)."""
    run_dir = root / f"{method}-s{seed}"
    run_dir.mkdir(parents=True)
    errors = {"cls": cls_errors(method, seed)[:n], "reg": reg_errors(method, seed)[:n]}
    acc, mae = 1 - errors["cls"].mean(), float(np.nanmean(errors["reg"]))
    final = {"cls": {"acc": acc, "loss": 1 - acc}, "reg": {"mae": mae, "loss": mae}}
    specs, statistics, primary = SPECS, STATISTICS, {"cls": "acc", "reg": "mae"}
    if same_unit:
        final["cls"] = {"mae": 1 - acc, "loss": 1 - acc}
        specs, statistics, primary = SAME_UNIT_SPECS, {"cls": "mae", "reg": "mae"}, {"cls": "mae", "reg": "mae"}
    evaluation_file = (root / "evaluations" / f"{method}-s{seed}.json" if given
                       else run_dir / jobs.split_evaluation_name("test"))
    evaluation_file.parent.mkdir(exist_ok=True)
    evaluation = {"run": str(run_dir), "split": "test", "data_hash": data_hash, "metrics": final}
    if per_example:
        npz = evaluation_file.name.removesuffix(".json") + ".per_example.npz"
        write_examples(evaluation_file.parent / npz, {t: {"error": e, "loss": e} for t, e in errors.items()})
        evaluation["per_example"] = {"file": npz, "examples": n, "statistics": statistics}
    evaluation_file.write_text(json.dumps(evaluation))
    run = {"benchmark": "spec", "dataset": "fake", "data_hash": HASH,
           "config": {"method": method, "seed": seed, "hparams": {}}}
    metrics = {"tasks": ["cls", "reg"], "metric_specs": specs, "primary_metrics": primary,
               "hv_reference": {"cls": 1.0, "reg": 40.0}, "final": {"test": final}, "selection": {"rule": "best val"},
               "epochs": [{"epoch": 1, "step_seconds_median": 0.01, "peak_memory_bytes": 1,
                           "splits": {"test": final}}]}
    return {"dir": str(run_dir), "run": run, "metrics": metrics, "evaluation": evaluation_file}


def brute_force(d_cls: np.ndarray, d_reg: np.ndarray, confidence: float) -> tuple[tuple, tuple]:
    """Percentile intervals of the cls mean difference and of the mean over tasks, resampling example indices
    in a plain loop with the generator the summary uses (one draw of N indices per resample, shared by the
    tasks)."""
    rng = np.random.default_rng(SEED)
    per_task, combined = [], []
    for _ in range(N_RESAMPLES):
        i = rng.integers(0, N, N)
        per_task.append(d_cls[i].mean())
        combined.append((d_cls[i].mean() + np.nanmean(d_reg[i])) / 2)
    task_tail, tail = 50 * (1 - confidence), 2.5
    return (tuple(np.percentile(per_task, [task_tail, 100 - task_tail])),
            tuple(np.percentile(combined, [tail, 100 - tail])))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    runs = [write_run(root, m, s) for m in ("ls", "strong") for s in range(3)]
    return jobs.summarise(runs, [], paper_references=False), runs


@pytest.fixture(scope="module")
def same_unit_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("same_unit")
    runs = [write_run(root, m, s, same_unit=True) for m in ("ls", "strong") for s in range(3)]
    return jobs.summarise(runs, [], paper_references=False), runs


def test_errors_in_different_units_are_never_added(sweep):
    """A 0/1 error and an absolute error in grams: no mean over tasks, in the summary, the table or the CSV."""
    summary, _ = sweep
    paired = summary.methods["strong"].versus["ls"].paired
    assert paired.available and paired.combined is None
    assert paired.combined_note == "no mean over tasks: the tasks' paired errors are of different kinds (cls: " \
                                   "acc_error, reg: mae)"
    assert paired.short_verdict == paired.combined_note
    _, rows = report.comparison_rows(summary)
    assert not [r for r in rows if r[2] == report.PAIRED_COMBINED_ROW]
    header, rows = report.csv_rows(summary)
    strong = dict(zip(header, next(r for r in rows if r[0] == "strong"), strict=True))
    assert strong["vs ls paired error difference"] == "" and strong["vs ls paired verdict"] == paired.combined_note


def test_absolute_errors_of_targets_without_a_shared_unit_are_never_added() -> None:
    from mtlflow.jobs.compare.paired import mixed_units

    specs = {t: {"mae": {"higher_is_better": False, "unit_interval": False}} for t in ("a", "b")}
    assert mixed_units({"a": "mae", "b": "mae"}, specs, {"a": "mae", "b": "mae"}) == \
        "each task's mae is in its own target's units"
    assert mixed_units({"a": "acc_error", "b": "acc_error"}, specs, {"a": "acc", "b": "acc"}) is None
    grams = {"a": SAME_UNIT_SPECS["cls"], "b": SAME_UNIT_SPECS["reg"]}  # both specs name the unit "g"
    assert mixed_units({"a": "mae", "b": "mae"}, grams, {"a": "mae", "b": "mae"}) is None


def test_paired_difference_averages_each_example_over_seeds_and_matches_a_brute_force_bootstrap(same_unit_sweep):
    summary, _ = same_unit_sweep
    paired = summary.methods["strong"].versus["ls"].paired
    assert paired.available and paired.n == N and paired.seeds == (3, 3)
    # the rule by hand: each example's error averaged over the method's 3 seeds, then strong - ls
    strong_cls = np.mean([cls_errors("strong", s) for s in range(3)], axis=0)
    ls_cls = np.mean([cls_errors("ls", s) for s in range(3)], axis=0)
    d_cls = strong_cls - ls_cls
    d_reg = np.mean([reg_errors("strong", s) for s in range(3)], axis=0) - np.mean(
        [reg_errors("ls", s) for s in range(3)], axis=0)
    cls = paired.tasks["cls"]
    # ls: 60 + 1 of 200 wrong per seed; strong: 20 of 200 per seed
    assert cls.mean_difference == pytest.approx(20 / 200 - 61 / 200, abs=1e-12)
    # P(d < 0) + ½ P(d = 0) counted by hand: ls wrong, strong right on examples 0-59 and 100-102 (ls wrong there
    # in one seed of 3: 1/3 lower for strong); strong wrong on 150-179 in 1-3 seeds where ls is right
    lower = 60 + 3
    higher = 30
    assert cls.probability_of_improvement == pytest.approx((lower + 0.5 * (N - lower - higher)) / N)
    assert paired.task_confidence == pytest.approx(1 - 0.05 / 2)  # Bonferroni over the 2 tasks
    (task_low, task_high), (low, high) = brute_force(d_cls, d_reg, paired.task_confidence)
    assert (cls.low, cls.high) == pytest.approx((task_low, task_high), abs=1e-12)
    combined = paired.combined
    assert combined.mean_difference == pytest.approx((d_cls.mean() + np.nanmean(d_reg)) / 2, abs=1e-12)
    assert (combined.low, combined.high) == pytest.approx((low, high), abs=1e-12)
    assert paired.tasks["reg"].n == N - 10  # the unlabelled examples are left out, not counted as 0
    assert cls.verdict == combined.verdict == "better"
    assert paired.statistics == {"cls": "mae", "reg": "mae"}


def test_the_paired_difference_of_a_counting_accuracy_is_minus_the_seed_mean_difference(sweep):
    """On one fully labelled test set, the mean 0/1-error difference is exactly minus the difference of the
    seeds' mean accuracies: the two comparisons measure the same difference with different intervals."""
    summary, _ = sweep
    versus = summary.methods["ls"].versus["best"]
    assert summary.best_method == "strong"
    assert versus.paired.tasks["cls"].mean_difference == pytest.approx(-versus.tasks["cls"].difference)
    assert versus.paired.tasks["reg"].mean_difference == pytest.approx(versus.tasks["reg"].difference)
    assert "paired percentile bootstrap over the test examples" in summary.statistics.paired


def test_methods_evaluated_on_different_test_sets_are_not_paired(tmp_path):
    runs = ([write_run(tmp_path, "ls", s) for s in range(2)]
            + [write_run(tmp_path, "strong", s, data_hash="g" * 64) for s in range(2)])
    paired = jobs.summarise(runs, [], paper_references=False).methods["strong"].versus["ls"].paired
    assert to_json(paired) == {"available": False, "verdict": "different test sets",
                               "reason": "strong and ls were evaluated on different test sets (data_hash differ): "
                                         "intervals over seeds only"}
    shorter = tmp_path / "shorter"
    runs = [write_run(shorter, "ls", s) for s in range(2)] + [write_run(shorter, "strong", s, n=150) for s in range(2)]
    paired = jobs.summarise(runs, [], paper_references=False).methods["strong"].versus["ls"].paired
    assert not paired.available and "(examples differ)" in paired.reason


def test_a_method_without_per_example_values_says_so(tmp_path):
    runs = [write_run(tmp_path, "ls", s) for s in range(2)] + [write_run(tmp_path, "strong", 0),
                                                                write_run(tmp_path, "strong", 1, per_example=False)]
    summary = jobs.summarise(runs, [], paper_references=False)
    paired = summary.methods["strong"].versus["ls"].paired
    assert not paired.available
    assert paired.reason.startswith("no per-example values for strong (1 of 2 runs, e.g. ")
    assert paired.reason.endswith(": intervals over seeds only")
    # the report says it where the paired verdict would be, next to the verdict over seeds
    header, rows = report.comparison_rows(summary)
    assert header[-3:] == ["paired Δ error [95 %]", "paired P(improvement)", "paired verdict"]
    strong = [r for r in rows if r[0] == "strong"]
    assert strong and all(r[-1] == "no per-example values" for r in strong if r[2] != "Δm%")


def test_evaluation_files_outside_the_run_directories_are_found_when_given(tmp_path):
    runs = [write_run(tmp_path, m, s, given=True) for m in ("ls", "strong") for s in range(2)]
    summary = jobs.summarise(runs, [], paper_references=False)
    assert not summary.methods["strong"].versus["ls"].paired.available  # not looked for elsewhere
    summary = jobs.summarise(runs, [], paper_references=False, evaluations=[r["evaluation"] for r in runs])
    paired = summary.methods["strong"].versus["ls"].paired
    assert paired.available and paired.seeds == (2, 2)
    # the report's comparison rows carry the paired verdict: per task at the corrected level, combined on Δm%'s row
    _, rows = report.comparison_rows(summary)
    cls_row = next(r for r in rows if r[0] == "strong" and r[2] == "cls acc")
    assert cls_row[-1] == paired.tasks["cls"].verdict == "better"
    assert cls_row[-3].startswith(f"{paired.tasks['cls'].mean_difference:+.4f} [")


def test_an_evaluation_of_another_run_is_refused(tmp_path):
    runs = [write_run(tmp_path, m, 0, given=True) for m in ("ls", "strong")]
    stray = write_run(tmp_path / "other", "fairgrad", 0, given=True)
    with pytest.raises(InvalidParameterError, match="not among the runs compared"):
        jobs.summarise(runs, [], paper_references=False, evaluations=[stray["evaluation"]])


def test_the_csv_carries_the_paired_mean_over_tasks(same_unit_sweep):
    summary, _ = same_unit_sweep
    header, rows = report.csv_rows(summary)
    strong = dict(zip(header, next(r for r in rows if r[0] == "strong"), strict=True))
    combined = summary.methods["strong"].versus["ls"].paired.combined
    assert float(strong["vs ls paired error difference"]) == combined.mean_difference
    assert float(strong["vs ls paired low"]) == combined.low and strong["vs ls paired verdict"] == "better"
    ls = dict(zip(header, next(r for r in rows if r[0] == "ls"), strict=True))
    assert ls["vs ls paired verdict"] == "" and ls["vs best paired verdict"] == "worse"


def test_the_html_colours_a_per_task_paired_verdict_at_its_corrected_level(sweep):
    data = to_json(sweep[0])
    data["methods"]["strong"]["versus"]["ls"]["paired"]["tasks"]["reg"]["verdict"] = "indistinguishable at 97.5 %"
    summary = from_json(Summary, data)
    page = report.html_report(summary, b"", b"")
    assert '<td class="indistinguishable">indistinguishable at 97.5 %</td>' in page
    assert '<td class="better">better</td>' in page and "the sampling of the test set" in page
