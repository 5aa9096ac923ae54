"""The tuning report (mtlflow.jobs.tune_report) of a small tuning run on the quadratic problem
(tune_problems.Quadratic): the report renders (verdict against tuned LS, tuned and defaults tables, gains, budget,
figure), the defaults runs use the retrain seeds, the tuning gain equals a hand computation from the runs' own
metrics, and the gain pairs seeds by seed, not by position."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

import pytest

from mtlflow import jobs
from mtlflow.jobs import tune_report
from mtlflow.jobs.tune import tune
from mtlflow.metrics.intervals import mean_interval

HERE = Path(__file__).resolve().parent
LR_ONLY = {"*": {"lr": {"scale": "log", "low": 1e-3, "high": 1.0}, "weight_decay": None}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LS and DWA tuned with single-task references (3 trials each), retrained and at their defaults with 2 seeds."""
    sys.path.insert(0, str(HERE))
    try:
        root = tmp_path_factory.mktemp("tune-report")
        jobs.prepare("tune_problems:Quadratic", root / "data")
        tune(root / "out", ["ls", "dwa"], data_dir=root / "data", budget_trials=3, retrain_seeds=2, references=True,
             search_spaces=LR_ONLY, selection="holdout", progress=False)
    finally:
        sys.path.remove(str(HERE))
    return root / "out"


def test_the_report_shows_the_tuned_and_defaults_tables_gains_budget_and_figure(tuned: Path) -> None:
    result = json.loads((tuned / "tune.json").read_text())
    assert result["report"] == {"html": "tune-report.html", "markdown": "tune-results.md"}
    html = (tuned / "tune-report.html").read_text()
    md = (tuned / "tune-results.md").read_text()
    assert "Verdict (tuned, against tuned ls)" in html and 'src="data:image/png;base64,' in html
    for section in ("### Tuned", "### Tuning gain", "### Defaults", "### Budget spent per study"):
        assert section in md
    for name, study in result["studies"].items():  # every study's budget row, as tune.json counts it
        spent = study["spent"]
        assert f"| {name} | {spent['steps']} ({spent['budget_steps']}) | {spent['trials']} |" in md
    # the defaults runs: every method at its defaults, with the retrain seeds
    for name, dirs in result["defaults"]["runs"].items():
        seeds = [jobs.read_run(d)["run"]["config"]["seed"] for d in dirs]
        assert seeds == result["retrain_seeds"] and result["studies"][name]["kind"] == "method"
        assert all("lr" not in jobs.read_run(d)["run"]["config"].get("hparams", {}) for d in dirs)
    # re-rendering a finished run gives the same Markdown
    before = md
    tune_report.write_tune_report(tuned)
    assert (tuned / "tune-results.md").read_text() == before


def _final(run_dir: str) -> dict:
    return jobs.read_run(run_dir)["metrics"]["final"]["test"]


def test_the_tuning_gain_is_tuned_minus_defaults_per_seed_from_the_runs(tuned: Path) -> None:
    data = tune_report.load(tuned)
    result = data.result
    refs = [d for s in result["studies"].values() if s["kind"] == "reference" for d in s["retrained"]]
    reference = {}
    for task in result["tasks"]:
        values = [_final(d)[task]["value"] for d in refs if task in _final(d)]
        reference[task] = statistics.fmean(values)

    def delta_m(final: dict) -> float:  # lower is better: 100 / T * sum (m - r) / r
        return 100 * statistics.fmean((final[t]["value"] - reference[t]) / reference[t] for t in result["tasks"])

    gains = data.gains()
    assert set(gains) == {"ls", "dwa"}
    for name, (_, gain) in gains.items():
        tuned_runs = {jobs.read_run(d)["run"]["config"]["seed"]: _final(d) for d in result["studies"][name]["retrained"]}
        default_runs = {jobs.read_run(d)["run"]["config"]["seed"]: _final(d) for d in result["defaults"]["runs"][name]}
        assert gain.seeds == (1, 2)
        for task in result["tasks"]:
            by_hand = [tuned_runs[s][task]["value"] - default_runs[s][task]["value"] for s in gain.seeds]
            assert gain.estimates[f"{task} value"].mean == pytest.approx(statistics.fmean(by_hand), rel=1e-9)
        by_hand = [delta_m(tuned_runs[s]) - delta_m(default_runs[s]) for s in gain.seeds]
        assert gain.estimates["Δm%"].mean == pytest.approx(statistics.fmean(by_hand), rel=1e-6)
        # the tuned learning rate beats lr 0.01 on the bowl: every task's value falls
        assert all(gain.verdicts[f"{t} value"] == "better" for t in result["tasks"])


def test_the_gain_pairs_seeds_by_seed_not_by_position(tuned: Path) -> None:
    data = tune_report.load(tuned)
    _, tuned_row = tune_report.row_of(data.tuned, data.result["studies"]["ls"]["retrained"])
    _, default_row = tune_report.row_of(data.defaults, data.result["defaults"]["runs"]["ls"])
    tuned_row = dataclasses.replace(tuned_row, seeds=(1, 2), delta_m=dataclasses.replace(
        tuned_row.delta_m, per_seed=(1.0, 5.0)))
    default_row = dataclasses.replace(default_row, seeds=(2, 1), delta_m=dataclasses.replace(
        default_row.delta_m, per_seed=(1.0, 0.0)))  # seed 2: 1.0, seed 1: 0.0
    gain = tune_report.tuning_gain(data.tuned, tuned_row, data.defaults, default_row)
    assert gain.estimates["Δm%"] == mean_interval([1.0 - 0.0, 5.0 - 1.0])
    assert gain.verdicts["Δm%"] == "worse"  # both differences positive: Δm% rose
    with pytest.raises(ValueError, match="share no seed"):
        tune_report.tuning_gain(data.tuned, tuned_row, data.defaults, dataclasses.replace(default_row, seeds=(7, 8)))
