"""The DVC route's baselines stage (`mtlflow stage baselines`): on a table every kind is fitted into
runs/baselines/<kind> with its test metrics in metrics/baselines.json, and the aggregate stage finds exactly those
directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from mtlflow.jobs import stages

ROOT = Path(__file__).resolve().parents[3]


def test_the_baselines_stage_fits_every_kind_of_a_table_and_aggregate_finds_them(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=90)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "churn.csv").write_text(
        "x,churned\n" + "".join(f"{v:.4f},{int(v > 0)}\n" for v in x))
    (tmp_path / "specs" / "churn.yaml").write_text(
        "name: churn\nsource: {table: churn.csv}\ntasks: [{name: churned, type: binary}]\n")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(spec="specs/churn.yaml", data_options={}, methods=["ls"], method_hparams={"ls": {}})
    params["dvc"] = {"reference_tasks": ["churned"], "experiment_method": "ls"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    Path("params.yaml").write_text(yaml.safe_dump(params))
    loaded = stages.load_params()
    assert stages._baseline_dirs() == []  # before the stage ran: no baseline rows, no error
    stages.stage_prepare(loaded)
    stages.stage_baselines(loaded)
    metrics = json.loads(Path("metrics/baselines.json").read_text())
    assert sorted(metrics) == ["hgb", "linear", "trivial"]
    assert metrics["trivial"]["churned.roc_auc"] == 0.5  # one constant score
    assert metrics["hgb"]["churned.roc_auc"] > 0.9  # the label is x > 0
    assert stages._baseline_dirs() == [stages.BASELINES / k for k in ("hgb", "linear", "trivial")]
