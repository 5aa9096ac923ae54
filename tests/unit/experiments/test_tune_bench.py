"""The Cost table of docs/guides/tuning.md is the render of the stored benchmark summary
(docs/results/tune-bench.json, written by `python -m mtlflow.experiments.tune_bench --write-docs`), its verdicts
follow the targets, and the grid sampler it measures against visits every point of the grid once."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mtlflow import jobs
from mtlflow.experiments import tune_bench
from mtlflow.jobs.tune import tune

HERE = Path(__file__).resolve().parents[1] / "jobs"


def stored() -> dict:
    if not tune_bench.RESULTS.is_file():
        pytest.skip(f"{tune_bench.RESULTS} is absent; run python -m mtlflow.experiments.tune_bench --write-docs")
    return json.loads(tune_bench.RESULTS.read_text())


def test_the_docs_show_the_stored_summary() -> None:
    summary = stored()
    assert tune_bench.doc_block(tune_bench.DOC.read_text()) == tune_bench.render(summary)
    hv = summary["halving_versus_grid"]
    # the shares are the stored steps' own ratio, and the verdict the stored scores' own comparison
    assert hv["steps_share"] == hv["halving"]["steps"] / hv["grid"]["steps"]
    assert hv["within_interval"] == (hv["halving"]["test_score"]["mean"] <= hv["grid"]["test_score"]["high"])
    assert hv["grid"]["trials"] == len(hv["grid_lrs"])  # the grid is exhaustive


def test_a_missed_target_reads_missed(tmp_path: Path) -> None:
    summary = copy.deepcopy(stored())
    hv = summary["halving_versus_grid"]
    hv["halving"]["steps"] = hv["grid"]["steps"]
    hv["steps_share"] = 1.0
    hv["grid"]["optuna_share"] = {"ls": 0.05}
    table = tune_bench.render(summary).splitlines()
    assert table[2].endswith("| **missed** |") and table[3].endswith("| **missed** |")
    doc = tmp_path / "tuning.md"
    doc.write_text(f"intro\n{tune_bench.BEGIN}\nold\n{tune_bench.END}\noutro\n")
    tune_bench.write_docs(summary, tmp_path / "summary.json", doc)
    assert tune_bench.doc_block(doc.read_text()) == tune_bench.render(summary)
    assert doc.read_text().startswith("intro\n") and doc.read_text().endswith("outro\n")


def test_the_grid_sampler_runs_every_point_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    data = tmp_path / "data"
    jobs.prepare("tune_problems:Quadratic", data)
    grid = [0.01, 0.03, 0.1, 0.25, 0.5]
    result = tune(tmp_path / "out", ["ls"], data_dir=data, budget_trials=len(grid), retrain_seeds=0,
                  references=False, search_spaces={"*": {"lr": {"choices": grid}, "weight_decay": None}},
                  pruner="none", sampler="grid", selection="holdout", progress=False)
    trials = result["studies"]["ls"]["trials"]
    assert sorted(t["params"]["lr"] for t in trials) == grid
    assert result["sampler"]["name"] == "GridSampler"
    best = min((t for t in trials), key=lambda t: t["value"])
    assert result["studies"]["ls"]["chosen"]["train_options"]["lr"] == best["params"]["lr"] == 0.25  # 1 / (1 + 3)
