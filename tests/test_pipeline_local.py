"""The main pipeline end to end with kfp.local's SubprocessRunner (real subprocesses, real artifacts)."""

from __future__ import annotations

import json

import pytest

from mtlflow.errors import InvalidParameterError, UnknownNameError
from pipelines import runner

TINY_PARAMS = {
    "data_options": {"n_train": 300, "n_val": 100, "n_test": 100},
    "methods": ["ls", "fairgrad"],
    "seeds": [0],
    "epochs": 1,
    "train_options": {"batch_size": 100, "device": "auto"},
}


@pytest.mark.slow
def test_main_pipeline_runs_locally(tmp_path):
    report = runner.run_local(TINY_PARAMS, workdir=tmp_path)
    assert report == tmp_path / "report.html"
    html = report.read_text()
    assert "fairgrad" in html and "data:image/png;base64," in html
    summary = json.loads((tmp_path / "results" / "results.json").read_text())
    assert set(summary["methods"]) == {"ls", "fairgrad"}
    assert {s["task"] for s in summary["references"]["sources"]} == {"left", "right"}
    assert all("delta_m" in row for row in summary["methods"].values())
    assert summary["selection_rules"] == ["last"]
    # every trained run and its evaluation are real files in the kfp.local artifact tree
    artifact_root = tmp_path / "artifacts"
    evaluations = list(artifact_root.rglob("evaluate/evaluation"))
    assert len(evaluations) == 2
    assert {json.loads(p.read_text())["method"] for p in evaluations} == {"ls", "fairgrad"}


def test_invalid_parameters_are_rejected_before_running(tmp_path):
    with pytest.raises(UnknownNameError, match="valid methods"):
        runner.run_local({**TINY_PARAMS, "methods": ["ls", "nope"]}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="empty"):
        runner.run_local({**TINY_PARAMS, "methods": []}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="epochs"):
        runner.run_local({**TINY_PARAMS, "epochs": -1}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="unknown pipeline parameter"):
        runner.run_local({**TINY_PARAMS, "bogus": 1}, workdir=tmp_path)
    assert not (tmp_path / "artifacts").exists()
