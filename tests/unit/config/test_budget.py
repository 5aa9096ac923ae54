"""One budget rule everywhere (mtlflow.core.budget): an explicit ``epochs`` is the most epochs a run trains at every
entry point -- ``mtlflow train``, a spec's ``train:`` section, the pipelines' parameters and the DVC route -- a
user's ``train_options`` merge key by key over the default budget and say so, the DVC route takes a spec's own
budget, and a validation split too small to rank epochs never calls a run converged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from mtlflow.cli import main
from mtlflow.config.pipeline import DEFAULT_BUDGET, merged_train_options, pipeline_arguments, plan_runs
from mtlflow.config.run import RunConfig
from mtlflow.core.budget import YIELDING_RULES, layered_budget
from mtlflow.engine.trainer import NOT_CONVERGED, fit_budget, training_outcome
from mtlflow.jobs import pipeline_steps, stages
from mtlflow.metrics.selection import MIN_VAL_ROWS_TO_RANK_EPOCHS, val_split_too_small

ROOT = Path(__file__).resolve().parents[3]
SPEC_BUDGET = {"epochs": 100, "min_steps": 500, "min_steps_per_epoch": 8, "patience": 10}


# -- the rule ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [
    ({}, SPEC_BUDGET),
    ({"epochs": 20}, {"epochs": 20, "min_steps_per_epoch": 8, "patience": 10}),             # min_steps yields
    ({"epochs": 20, "min_steps": 50}, {"epochs": 20, "min_steps": 50, "min_steps_per_epoch": 8, "patience": 10}),
    ({"batch_size": 64}, {**SPEC_BUDGET, "batch_size": 64, "min_steps_per_epoch": None}),  # the 8 yields
    ({"lr": 0.003}, {**SPEC_BUDGET, "lr": 0.003}),                                          # nothing yields
])
def test_a_default_rule_yields_to_the_value_it_would_change_and_every_other_default_is_kept(given, expected):
    options, dropped = layered_budget(SPEC_BUDGET, given)
    assert options == {k: v for k, v in expected.items() if v is not None}
    # independently: a default rule is dropped exactly when its value is given without the rule
    assert dropped == [rule for value, rule in YIELDING_RULES if value in given and rule not in given]


def test_an_explicit_epochs_is_the_most_epochs_whatever_the_table_size():
    # 241 training rows: batch 30, 9 steps an epoch; the default 500 steps would raise 20 epochs to 56
    options, _ = layered_budget(SPEC_BUDGET, {"epochs": 20})
    assert fit_budget(RunConfig(**options), 241)["max_epochs"] == 20
    assert fit_budget(RunConfig(**{**SPEC_BUDGET, "epochs": 20}), 241)["max_epochs"] == 56  # the old whole-dict way


# -- train_options merge key by key and say so ---------------------------------------------------------------
def test_one_overridden_key_keeps_the_default_budget_and_says_so():
    options, note = merged_train_options({"device": "auto", **DEFAULT_BUDGET}, {"lr": 0.003}, epochs_given=False)
    assert options == {"device": "auto", **DEFAULT_BUDGET, "lr": 0.003}
    assert note == ("train_options: lr overridden; the default budget min_steps=500, min_steps_per_epoch=8, "
                    "patience=10 kept")


def test_a_pipeline_epochs_drops_the_default_min_steps_and_says_so():
    resolved, note = pipeline_arguments("benchmark_sweep", {"epochs": 20, "train_options": {"lr": 0.003}})
    assert resolved["epochs"] == 20
    assert resolved["train_options"] == {"device": "auto", "min_steps_per_epoch": 8, "patience": 10, "lr": 0.003}
    assert note.startswith("train_options: lr overridden; the default budget min_steps_per_epoch=8, patience=10 "
                           "kept; min_steps=500 dropped (epochs given")


def test_nothing_given_leaves_the_pipeline_defaults_and_logs_nothing():
    assert pipeline_arguments("benchmark_sweep", {}) == ({}, "")
    assert pipeline_arguments("retrain", {"epochs": 2}) == ({"epochs": 2}, "")  # nothing of its default to drop


def test_params_yaml_lists_the_whole_budget_so_the_merge_changes_nothing_there():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    options, note = merged_train_options(DEFAULT_BUDGET, params["train_options"], epochs_given=True)
    assert options == params["train_options"] and "kept" not in note and "dropped" not in note


# -- every entry point trains the same epochs for the same request ----------------------------------------------
def _table(rows: int = 320, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "churned": np.where(x[:, 0] > 0, "yes", "no"),
                         "spend": np.round(2 * x[:, 1] + 0.3 * rng.normal(size=rows), 4)})


@pytest.fixture
def spec_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DVC project whose data is a spec asking for at most 20 epochs (``train: {epochs: 20}``)."""
    (tmp_path / "specs").mkdir()
    _table().to_csv(tmp_path / "specs" / "t.csv", index=False)
    (tmp_path / "specs" / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "source": {"table": "t.csv"}, "train": {"epochs": 20},
        "tasks": [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"}]}))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())  # the laptop budget: epochs 6, min_steps 40, ...
    params.update(spec="specs/t.yaml", data_options={}, methods=["ls"], method_hparams={"ls": {}})
    params["dvc"] = {"reference_tasks": ["churned", "spend"], "experiment_method": "ls"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _pipeline_run(data: Path, out: Path, params: dict) -> Path:
    """The sweep's train task (the component's body) with the arguments `mtlflow pipeline run` resolves."""
    resolved, _ = pipeline_arguments("benchmark_sweep", params)
    out.mkdir()
    pipeline_steps.train(str(data), {}, str(out / "run"), str(out / "model.pt"), str(out / "report.html"),
                         str(out / "summary.md"), plan_runs(["ls"], [0])[0], resolved["epochs"],
                         {**resolved["train_options"], "device": "cpu"})
    return out / "run"


def test_every_entry_point_trains_the_same_epochs_for_the_same_request(spec_project: Path, capsys) -> None:
    spec = str(spec_project / "specs" / "t.yaml")
    params = stages.load_params()
    stages.stage_prepare(params)
    stages.stage_train(params, "ls", 0)  # DVC: the spec's own budget, not params.yaml's epochs 6 / min_steps 40
    assert "its own budget rule" in capsys.readouterr().err
    runs = {"dvc": stages.RUNS / "ls-s0"}
    for name, extra in {"cli": [], "cli --epochs 20": ["--epochs", "20"]}.items():
        runs[name] = spec_project / name.replace(" ", "_")
        assert main(["train", "--spec", spec, "--out", str(runs[name]), "--no-progress", *extra]) == 0
    runs["pipeline"] = _pipeline_run(stages.DATA, spec_project / "p1", {"spec": spec})
    runs["pipeline epochs=20"] = _pipeline_run(stages.DATA, spec_project / "p2", {"spec": spec, "epochs": 20})
    records = {name: json.loads((run / "run.json").read_text()) for name, run in runs.items()}
    for name, record in records.items():
        assert (record["config"]["epochs"], record["budget"]["max_epochs"], record["config"]["min_steps"]) == \
            (20, 20, None), name
        assert record["training"]["epochs_run"] <= 20, name
    # the same request is the same run: the whole configuration (the device aside) and where it stopped
    configs = {name: {k: v for k, v in r["config"].items() if k != "device"} for name, r in records.items()}
    assert all(config == configs["cli"] for config in configs.values()), configs
    assert len({r["training"]["epochs_run"] for r in records.values()}) == 1


# -- "converged" needs a validation split that can rank epochs ---------------------------------------------------
def _history(scores: list[float]) -> list[dict]:
    return [{"epoch": i + 1, "val_score": s} for i, s in enumerate(scores)]


def test_a_tiny_validation_split_never_calls_a_run_converged():
    # the survey's case: best epoch 2 of 60 (stopped improving long ago) on a 94-row validation split
    history = _history([0.0, -0.5, *[-0.1] * 58])
    small = training_outcome(history, RunConfig(epochs=100, patience=10), 600, val_rows=94)
    assert small["converged"] is False and small["best_epoch"] == 2
    assert small["convergence"].startswith("validation split too small to select epochs (94 rows, fewer than 100)")
    large = training_outcome(history, RunConfig(epochs=100, patience=10), 600, val_rows=MIN_VAL_ROWS_TO_RANK_EPOCHS)
    assert large["converged"] is True and large["convergence"] == "converged"
    # still improving on a tiny split: told to train longer, and that the split cannot tell
    rising = training_outcome(_history([0.0, -0.1, -0.2]), RunConfig(epochs=3, patience=2), 30, val_rows=40)
    assert rising["convergence"].startswith(NOT_CONVERGED) and "validation split too small" in rising["convergence"]


def test_the_threshold_is_where_a_proportions_interval_reaches_ten_points():
    # 1.96 * sqrt(0.25 / n) is the widest 95 % binomial half-width; the rule's n keeps it under 0.1
    n = MIN_VAL_ROWS_TO_RANK_EPOCHS
    assert 1.96 * (0.25 / n) ** 0.5 < 0.1 <= 1.96 * (0.25 / (n - 5)) ** 0.5
    assert val_split_too_small(n) == "" and val_split_too_small(None) == ""
    assert "99 rows" in val_split_too_small(n - 1)


def test_the_budget_rule_is_the_one_documented():
    page = " ".join((ROOT / "docs" / "guides" / "training.md").read_text().split())  # the lines' wrapping aside
    assert "## One budget rule" in page
    for value, rule in YIELDING_RULES:
        assert f"a given `{value}` drops a default `{rule}`" in page
    assert f"fewer than {MIN_VAL_ROWS_TO_RANK_EPOCHS} rows" in page
