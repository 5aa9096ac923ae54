"""tuned_sweep end to end with kfp.local's SubprocessRunner on the analytic toy problem: real subprocesses, one
tune_study task per study on a shared journal, the retrain and comparison, and the exit handler's status record.
The pipeline's tune.json chooses what `mtlflow tune` chooses for the same request on the same prepared data."""

from __future__ import annotations

import json

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs.tune import tune
from mtlflow.pipelines import runner

TINY = {"benchmark": "toy", "data_options": {"steps_per_epoch": 20}, "methods": ["ls", "famo"], "budget_trials": 2,
        "retrain_seeds": 2, "startup_trials": 2, "pruner": "none", "selection": "holdout", "epochs": 2,
        "train_options": {"device": "cpu"}}


@pytest.mark.slow
def test_tuned_sweep_runs_locally_and_chooses_what_mtlflow_tune_chooses(tmp_path):
    report = runner.run_local(TINY, workdir=tmp_path / "pipeline", pipeline="tuned_sweep")
    assert report == tmp_path / "pipeline" / "report.html" and "famo" in report.read_text()
    result = json.loads((tmp_path / "pipeline" / "tune.json").read_text())
    assert list(result["studies"]) == ["ls", "famo", "stl-f1", "stl-f2"]
    assert all(s["spent"]["trials"] == 2 for s in result["studies"].values())
    run = json.loads((tmp_path / "pipeline" / "pipeline_run.json").read_text())
    assert run["status"]["state"] == "SUCCEEDED" and run["status"]["pipeline"] == "tuned_sweep"
    # one task per study ran under the optuna branch; the katib branch did not run
    artifacts = tmp_path / "pipeline" / "artifacts"
    assert len({p.parent for p in artifacts.rglob("tune-study/executor_output.json")}) == 4
    assert not list(artifacts.rglob("launch-katib"))
    options = {"methods_to_tune": TINY["methods"], "budget_trials": 2, "retrain_seeds": 2, "startup_trials": 2,
               "pruner": "none", "selection": "holdout", "train_options": {"device": "cpu", "epochs": 2}}
    direct = tune(tmp_path / "direct", data_dir=next(artifacts.rglob("prepare-data/data")), progress=False, **options)
    for name, study in direct["studies"].items():
        assert result["studies"][name]["chosen"] == study["chosen"]
        assert result["studies"][name]["best_value"] == study["best_value"]


def test_katib_is_refused_locally_with_the_way_to_run_it(tmp_path):
    with pytest.raises(InvalidParameterError, match="tuner katib .* runs only on a cluster"):
        runner.run_local({**TINY, "tuner": "katib"}, workdir=tmp_path, pipeline="tuned_sweep")
