"""The DVC tune stage (`mtlflow stage tune`): params.yaml's tune section on the sweep's data, every trial under the
sweep's budget (its epochs), the same job as `mtlflow tune` (runs/tune holds its work directory and tune.json) and
metrics/tune.json for `dvc metrics`; a bad tune section is one line naming the valid keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import stages

HERE = Path(__file__).resolve().parent
PARAMS = {
    "benchmark": "tune_problems:Quadratic", "data_options": {}, "spec": "", "spec_rev": "", "methods": ["ls"],
    "seeds": [0], "method_hparams": {"ls": {}}, "epochs": 2, "train_options": {"min_steps": 1, "patience": 5},
    "reference_seeds": [0], "dvc": {"reference_tasks": ["bowl1", "bowl2"], "experiment_method": "ls"},
    "tune": {"methods": ["ls"], "budget_trials": 2, "seed": 0, "retrain_seeds": 2, "pruner": "none",
             "selection": "holdout", "search_spaces": {"*": {"lr": {"scale": "log", "low": 0.001, "high": 1.0},
                                                           "weight_decay": None}}},
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(params: dict) -> stages.DvcParams:
    Path("params.yaml").write_text(yaml.safe_dump(params))
    return stages.load_params()


def test_the_tune_stage_runs_the_tuning_job_under_the_sweeps_budget(project: Path) -> None:
    params = _write(PARAMS)
    stages.stage_prepare(params)
    stages.stage_tune(params)
    result = json.loads((project / stages.TUNE / "tune.json").read_text())
    assert list(result["studies"]) == ["ls", "stl-bowl1", "stl-bowl2"] and result["retrain_seeds"] == [1, 2]
    assert result["train_options"]["epochs"] == PARAMS["epochs"]  # the sweep's budget, not tune's default
    assert all(t["epochs"] == PARAMS["epochs"] for s in result["studies"].values() for t in s["trials"])
    assert all(s["spent"]["trials"] == 2 for s in result["studies"].values())
    metrics = json.loads((project / stages.TUNE_METRICS).read_text())
    best = json.loads((project / stages.TUNE / result["comparison"]["results"]).read_text())["best_method"]
    assert metrics["best_method"] == best
    assert metrics["ls.lr"] == result["studies"]["ls"]["chosen"]["train_options"]["lr"]


def test_a_bad_tune_section_names_the_valid_keys(project: Path) -> None:
    params = _write({**PARAMS, "tune": {"methods": ["ls"], "trials": 3}})
    with pytest.raises(InvalidParameterError, match="tune section must be a mapping of methods, budget_trials"):
        stages.tune_config(params)
    params = _write({**PARAMS, "tune": {"methods": ["ls"], "retrain_seeds": 0}})
    with pytest.raises(InvalidParameterError, match="retrain_seeds must be an integer >= 1"):
        stages.tune_config(params)
