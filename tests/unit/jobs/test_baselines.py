"""The sweep's baselines (mtlflow.jobs.baselines, mtlflow.metrics.baselines): the trivial predictor's metrics against
hand computations from the table (majority rates, base-rate log-loss, the test variance around the training
mean, the mean absolute deviation from the training median, a multi-label F1 counted by hand), fixed predictions
scored exactly as a trained model is, a boosted model and a linear one beating the trivial baseline where a
feature decides the label, the cache keyed by the data's hash, the run-like directory pairing example by example
with a trained run, and a real table with missing labels."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import churn_csv
from mtlflow import jobs
from mtlflow.cli import baselines as cli_baselines
from mtlflow.cli import main
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import baselines
from mtlflow.metrics import baselines as constants
from mtlflow.metrics import evaluation
from mtlflow.metrics.paired import compare_methods

TRAIN, TEST = 0, 2  # split.npy's codes


def table(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """A table whose labels are functions of ``x`` alone (``noise`` and ``colour`` carry nothing), with missing
    cells in the binary task and class shares far enough apart that the majority class is never a tie."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    frame = pd.DataFrame({
        "x": x, "noise": rng.normal(size=n), "colour": rng.choice(["red", "green", "blue"], n),
        "churned": np.where(x > 0.3, "yes", "no"),
        "spend": np.round(10 * np.exp(x) + 0.1 * rng.normal(size=n), 4),  # skewed: its median is not its mean
        "plan": np.select([x < -0.3, x < 0.8], ["basic", "plus"], "pro"),
        "tag_common": (x > -1.0).astype(int), "tag_rare": (x > 1.2).astype(int)})
    frame.loc[rng.choice(n, n // 6, replace=False), "churned"] = None
    return frame


TASKS = [{"name": "churned", "type": "binary"},
         {"name": "spend", "type": "regression"},                                   # primary MAE: the median
         {"name": "spend_rmse", "type": "regression", "column": "spend", "primary": "rmse"},  # the mean
         {"name": "plan", "type": "multiclass"},
         {"name": "tags", "type": "multilabel", "columns": ["tag_common", "tag_rare"]}]


def prepare(root: Path, frame: pd.DataFrame, tasks: list[dict] = TASKS, **spec) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    frame.to_csv(root / "table.csv", index=False)
    (root / "spec.yaml").write_text(yaml.safe_dump({"name": "mine", "source": {"table": "table.csv"}, "tasks": tasks,
                                                    **spec}, sort_keys=False))
    jobs.prepare("spec", root / "data", spec=str(root / "spec.yaml"))
    return root / "data"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, np.ndarray]:
    root = tmp_path_factory.mktemp("baselines")
    frame = table()
    data = prepare(root, frame)
    return data, frame, np.load(data / "split.npy")


@pytest.fixture(scope="module")
def trivial_dir(prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trivial") / "baseline"
    baselines.baseline(prepared[0], "trivial", out)
    return out


def test_trivial_metrics_are_the_hand_computed_base_rates(prepared, trivial_dir: Path) -> None:
    _, frame, split = prepared
    test = json.loads((trivial_dir / "metrics.json").read_text())["final"]["test"]
    train, held = frame[split == TRAIN], frame[split == TEST]
    # binary: the majority class of the labelled training rows, its rate among the labelled test rows, AUC 0.5,
    # and the log-loss of the smoothed training base rate
    known, known_test = train["churned"].dropna(), held["churned"].dropna()
    positives = int((known == "yes").sum())
    majority = "yes" if positives > len(known) - positives else "no"
    assert test["churned"]["acc"] == pytest.approx((known_test == majority).mean(), abs=1e-12)
    assert test["churned"]["roc_auc"] == 0.5
    rate = (positives + 0.5) / (len(known) + 1)
    y = (known_test == "yes").to_numpy()
    assert test["churned"]["loss"] == pytest.approx(-np.mean(y * np.log(rate) + (1 - y) * np.log(1 - rate)), rel=1e-6)
    # regression, MAE primary: the training median; RMSE primary: the training mean, whose MSE is the test
    # variance around the training mean and whose R² is 1 - that / the test variance around the test mean
    spend = held["spend"].to_numpy()
    assert test["spend"]["mae"] == pytest.approx(np.mean(np.abs(spend - np.median(train["spend"]))), rel=1e-5)
    mse = np.mean((spend - train["spend"].mean()) ** 2)
    assert test["spend_rmse"]["rmse"] ** 2 == pytest.approx(mse, rel=1e-5)
    assert test["spend_rmse"]["r2"] == pytest.approx(1 - mse / np.var(spend), rel=1e-5)
    # multiclass: the training majority class, its share of the test rows
    assert test["plan"]["acc"] == pytest.approx((held["plan"] == train["plan"].mode()[0]).mean(), abs=1e-12)
    # multi-label: each label predicted by its training majority (common: all 1, rare: all 0), F1 pooled by hand
    assert train["tag_common"].mean() > 0.5 > train["tag_rare"].mean()
    tp, fp, fn = int(held["tag_common"].sum()), int((held["tag_common"] == 0).sum()), int(held["tag_rare"].sum())
    assert test["tags"]["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)


def test_the_baseline_directory_holds_the_evaluation_files_of_a_run(prepared, trivial_dir: Path) -> None:
    data, frame, split = prepared
    run = json.loads((trivial_dir / "run.json").read_text())
    assert run["status"] == "completed" and run["config"]["method"] == "baseline-trivial"
    assert jobs.run_label(run) == "baseline-trivial"
    assert run["data_hash"] == json.loads((data / "manifest.json").read_text())["content_hash"]
    record = jobs.read_run(trivial_dir)
    assert record["metrics"]["primary_metrics"] == {"churned": "roc_auc", "spend": "mae", "spend_rmse": "rmse",
                                                    "plan": "acc", "tags": "f1"}
    for name in ("val", "test"):
        path = trivial_dir / jobs.split_evaluation_name(name)
        kept = json.loads(path.read_text())
        assert kept["split"] == name and kept["run"] == str(trivial_dir)
        assert kept["metrics"] == record["metrics"]["final"][name]
        examples = evaluation.read_examples(trivial_dir / kept["per_example"]["file"])
        assert kept["per_example"]["examples"] == int((split == (1 if name == "val" else TEST)).sum())
        assert kept["per_example"]["statistics"] == {"churned": "loss", "spend": "mae", "spend_rmse": "loss",
                                                     "plan": "acc_error", "tags": "loss"}
        # a missing label is NaN, not a perfect prediction
        held = frame[split == (1 if name == "val" else TEST)]
        assert np.isnan(examples["churned"]["error"]).sum() == held["churned"].isna().sum()
    # the paired statistic of an MAE task is the example's absolute error: its mean is the metric
    test_examples = evaluation.read_examples(trivial_dir / "test_evaluation.per_example.npz")
    assert np.mean(test_examples["spend"]["error"]) == pytest.approx(record["metrics"]["final"]["test"]["spend"]["mae"])


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An LS run of a few steps, evaluated with per-example values as `mtlflow evaluate` writes them."""
    run = tmp_path_factory.mktemp("ls") / "run"
    jobs.train(prepared[0], run, method="ls", epochs=2, min_steps=1, batch_size=32, progress=False)
    jobs.evaluate(run, prepared[0], per_example=True)
    return run


def test_fixed_predictions_are_scored_exactly_as_the_model_is(prepared, trained: Path) -> None:
    from mtlflow.engine.rundir import load_model

    data, _, _ = prepared
    bench, model, _ = load_model(trained / "model.pt")
    loaded = jobs.load_prepared(data)[1]
    targets = baselines._targets(bench, loaded.splits["test"], len(bench.tasks))
    outputs = [[] for _ in bench.tasks]
    with torch.no_grad():
        model.eval()
        for batch in bench.make_loader(loaded.splits["test"], batch_size=512):
            for i, out in enumerate(model(bench.unpack(batch)[0])):
                outputs[i].append(out)
    values, examples = constants.evaluate_predictions(bench.tasks, [torch.cat(o) for o in outputs], targets)
    assert values == json.loads((trained / "evaluation.json").read_text())["metrics"]
    kept = evaluation.read_examples(trained / "evaluation.per_example.npz")
    for task in kept:
        for name in ("loss", "error"):
            np.testing.assert_array_equal(examples[task][name], kept[task][name])
    default = inspect.signature(evaluation.evaluate_examples).parameters["batch_size"].default
    assert constants.EVALUATION_BATCH_SIZE == default


def test_a_baseline_pairs_example_by_example_with_a_trained_run(trained: Path, trivial_dir: Path) -> None:
    mine = json.loads((trivial_dir / "test_evaluation.json").read_text())
    theirs = json.loads((trained / "evaluation.json").read_text())
    for key in ("data_hash", "split", "tasks"):
        assert mine[key] == theirs[key]
    assert mine["per_example"]["statistics"] == theirs["per_example"]["statistics"]
    assert mine["per_example"]["examples"] == theirs["per_example"]["examples"]
    errors = [{t: [v["error"]] for t, v in evaluation.read_examples(d / f).items()}
              for d, f in ((trivial_dir, "test_evaluation.per_example.npz"), (trained, "evaluation.per_example.npz"))]
    comparison = compare_methods(*errors, mine["per_example"]["statistics"], n_resamples=200)
    assert set(comparison.as_dict()["tasks"]) == set(mine["tasks"])


@pytest.mark.parametrize("kind", [pytest.param("hgb", marks=pytest.mark.slow), "linear"])
def test_a_model_of_the_deciding_feature_beats_the_trivial_baseline(prepared, trivial_dir: Path, tmp_path: Path,
                                                                    kind: str) -> None:
    out = tmp_path / kind
    result = baselines.baseline(prepared[0], kind, out)
    assert result["source"] == "fitted" and result["method"] == f"baseline-{kind}"
    mine = result["metrics"]["test"]
    trivial = json.loads((trivial_dir / "metrics.json").read_text())["final"]["test"]
    assert mine["churned"]["roc_auc"] > 0.95 > 0.5 == trivial["churned"]["roc_auc"]
    # spend is exp(x): a linear model of x explains most of it, boosting nearly all
    assert mine["spend"]["mae"] < 0.75 * trivial["spend"]["mae"]
    # the trivial baseline (the training mean) explains nothing of the test split: R2 about 0, below 0 when the
    # ~48 test rows' mean differs from the training rows'; the models explain most of it (boosting cannot
    # extrapolate exp(x) to a test row beyond the training range, which caps its R2 on this small split)
    assert mine["spend_rmse"]["r2"] > 0.5 > 0.1 > trivial["spend_rmse"]["r2"]
    assert mine["plan"]["acc"] > trivial["plan"]["acc"] + 0.2
    assert mine["tags"]["f1"] > trivial["tags"]["f1"]
    fitted = json.loads((out / "run.json").read_text())["baseline"]["tasks"]
    assert fitted["churned"]["scoring"] == "roc_auc" and fitted["spend"]["scoring"] == "neg_mean_absolute_error"
    assert len(fitted["tags"]["labels"]) == 2
    labelled = int(pd.notna(prepared[1]["churned"][prepared[2] == TRAIN]).sum())
    assert fitted["churned"]["train_rows"] == labelled  # the rows without a label were dropped for that task


def test_category_codes_are_one_hot_for_the_linear_model(tmp_path: Path) -> None:
    """With ``encoding: embedding`` a category is one code column; a label that is the middle code is not linear
    in the code, and is in its one-hot block."""
    frame = table(seed=1)
    frame["green"] = np.where(frame["colour"] == "green", "yes", "no")
    data = prepare(tmp_path, frame, [{"name": "green", "type": "binary"}],
                   features={"categorical": ["colour"], "numeric": ["x"], "encoding": "embedding"})
    result = baselines.baseline(data, "linear", tmp_path / "linear")
    assert result["metrics"]["test"]["green"]["roc_auc"] == 1.0
    x = np.array([[0.5, 1.0], [0.1, 3.0], [0.2, 0.0]])
    np.testing.assert_array_equal(baselines.one_hot_codes(x, {1: 4}),
                                  [[0.5, 0, 1, 0, 0], [0.1, 0, 0, 0, 1], [0.2, 1, 0, 0, 0]])


def test_the_result_is_cached_by_the_data_hash_and_an_existing_one_reused(prepared, trivial_dir: Path,
                                                                          tmp_path: Path, monkeypatch) -> None:
    def refit(*args, **kwargs):
        raise AssertionError("fitted again")

    monkeypatch.setattr(baselines, "fit_baseline", refit)
    again = baselines.baseline(prepared[0], "trivial", tmp_path / "copy")
    assert again["source"] == "cache"
    assert again["metrics"] == json.loads((trivial_dir / "metrics.json").read_text())["final"]
    assert json.loads((tmp_path / "copy" / "test_evaluation.json").read_text())["run"] == str(tmp_path / "copy")
    assert baselines.baseline(prepared[0], "trivial", tmp_path / "copy")["source"] == "reused"
    with pytest.raises(InvalidParameterError, match="already holds a run or another baseline.*--overwrite"):
        baselines.baseline(prepared[0], "linear", tmp_path / "copy")
    # another data version is another key
    assert baselines.cache_key("trivial", "a" * 64) != baselines.cache_key("trivial", "b" * 64)
    assert baselines.cache_key("trivial", "a" * 64) != baselines.cache_key("linear", "a" * 64)


def test_the_command_line(prepared, tmp_path: Path, capsys) -> None:
    assert cli_baselines.KINDS == baselines.KINDS
    assert main(["baseline", "--data", str(prepared[0]), "--kind", "trivial", "--out", str(tmp_path / "b")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["method"] == "baseline-trivial" and set(printed["test"]) == {t["name"] for t in TASKS}
    with pytest.raises(SystemExit):
        main(["baseline", "--data", str(prepared[0]), "--kind", "forest", "--out", str(tmp_path / "c")])


def test_data_that_is_not_a_table_gets_the_trivial_baseline_only(multimnist_small: Path, tmp_path: Path) -> None:
    result = baselines.baseline(multimnist_small, "trivial", tmp_path / "trivial")
    assert all(0 < values["acc"] < 0.5 for values in result["metrics"]["test"].values())
    with pytest.raises(InvalidParameterError, match="not a table of features.*use --kind trivial"):
        baselines.baseline(multimnist_small, "hgb", tmp_path / "hgb")


@pytest.mark.slow
def test_a_real_table_with_missing_labels(tmp_path: Path) -> None:
    """churn.csv, the docs' example (400 real scm20d rows; 15 % of the binary task's labels missing): the trivial
    baseline's accuracy and MAE by hand, and a boosted model far better on every task -- the table's labels are
    predictable from its other columns."""
    from mtlflow.benchmarks._spec.infer import infer_spec

    frame = pd.read_csv(churn_csv(tmp_path / "churn.csv"))
    (tmp_path / "churn.yaml").write_text(infer_spec(tmp_path / "churn.csv", ["churned", "spend", "plan"],
                                                    tmp_path / "churn.yaml"))
    jobs.prepare("spec", tmp_path / "data", spec=str(tmp_path / "churn.yaml"))
    split = np.load(tmp_path / "data" / "split.npy")
    trivial = baselines.baseline(tmp_path / "data", "trivial", tmp_path / "trivial")["metrics"]["test"]
    train, held = frame[split == TRAIN], frame[split == TEST]
    majority = train["churned"].dropna().mode()[0]
    assert trivial["churned"]["acc"] == pytest.approx((held["churned"].dropna() == majority).mean(), abs=1e-12)
    spend = held["spend"].to_numpy()
    assert trivial["spend"]["mae"] == pytest.approx(np.mean(np.abs(spend - np.median(train["spend"]))), rel=1e-5)
    examples = evaluation.read_examples(tmp_path / "trivial" / "test_evaluation.per_example.npz")
    assert np.isnan(examples["churned"]["error"]).sum() == held["churned"].isna().sum() > 0
    hgb = baselines.baseline(tmp_path / "data", "hgb", tmp_path / "hgb")["metrics"]["test"]
    assert hgb["churned"]["roc_auc"] > 0.8
    assert hgb["spend"]["mae"] < 0.6 * trivial["spend"]["mae"]
    assert hgb["plan"]["acc"] > trivial["plan"]["acc"] + 0.2
