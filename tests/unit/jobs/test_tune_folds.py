"""k-fold selection of `mtlflow tune` (mtlflow.jobs.tune_folds): the rule that triggers it (the task with the
fewest labelled validation rows), folds that partition train + val and never hold a test row, a budget that counts
every fold's steps, a search that never reads the test split, and the final retrain on the ordinary split."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from mtlflow import jobs
from mtlflow.benchmarks import row_hashes
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import tune_folds
from mtlflow.jobs.data import load_prepared
from mtlflow.jobs.tune import tune

HERE = Path(__file__).resolve().parent
LR_ONLY = {"*": {"lr": {"scale": "log", "low": 1e-3, "high": 1.0}, "weight_decay": None}}
#: a short budget for the spec tables: two epochs, a floor of one step (the spec default is 500 steps)
SHORT = {"epochs": 2, "min_steps": 1}


def table(n: int, missing_share: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Rows with distinct continuous features (so that a row is identified by its features), a binary task with
    ``missing_share`` of its labels blank and a regression task."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    frame = pd.DataFrame({"x": x, "noise": rng.normal(size=n), "churned": np.where(x > 0.2, "yes", "no"),
                          "spend": np.round(2 * x + 0.1 * rng.normal(size=n), 5)})
    frame.loc[rng.choice(n, round(missing_share * n), replace=False), "churned"] = None
    return frame


def prepare(root: Path, frame: pd.DataFrame) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    frame.to_csv(root / "table.csv", index=False)
    tasks = [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"}]
    (root / "spec.yaml").write_text(yaml.safe_dump({"name": "mine", "source": {"table": "table.csv"},
                                                    "tasks": tasks}, sort_keys=False))
    jobs.prepare("spec", root / "data", spec=str(root / "spec.yaml"))
    return root / "data"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(tmp_path_factory.mktemp("tiny"), table(160))


def load(path: Path):
    return load_prepared(path)[1]


def rows_of(dataset) -> set[bytes]:
    return {row.tobytes() for row in dataset.inputs.numpy()}


def test_the_task_with_fewest_labelled_validation_rows_decides(tmp_path: Path, tiny: Path) -> None:
    """A tiny table selects by k-fold; a table whose validation split is big selects on it; one whose validation
    split is big but whose sparsest task has fewer than 100 labelled rows there selects by k-fold again."""
    cases = {"tiny": tiny, "big": prepare(tmp_path / "big", table(1400)),
             "sparse": prepare(tmp_path / "sparse", table(1400, missing_share=0.5))}
    modes = {}
    for name, path in cases.items():
        val = load(path).splits["val"]
        rows = tune_folds.validation_rows(load(path), ["churned", "spend"])
        assert rows == {"churned": int((~val.targets[0].isnan()).sum()), "spend": len(val)}
        modes[name] = tune_folds.resolve_selection("auto", 5, rows)["mode"], min(rows.values()), len(val)
    assert modes["tiny"][0] == "kfold" and modes["tiny"][1] < 100
    assert modes["big"][0] == "holdout" and modes["big"][1] >= 100
    assert modes["sparse"][0] == "kfold" and modes["sparse"][1] < 100 <= modes["sparse"][2]
    assert tune_folds.resolve_selection("holdout", 5, {"t": 3})["mode"] == "holdout"  # forced either way
    assert tune_folds.resolve_selection("kfold", 5, {"t": 500})["mode"] == "kfold"
    with pytest.raises(InvalidParameterError, match="unknown selection"):
        tune_folds.resolve_selection("loo", 5, {"t": 3})


def test_the_folds_partition_train_and_val_and_never_hold_a_test_row(tiny: Path) -> None:
    data = load(tiny)
    train, val, test = (rows_of(data.splits[s]) for s in ("train", "val", "test"))
    assert len(train) == len(data.splits["train"]) and len(test) == len(data.splits["test"])  # rows are distinct
    assignment = tune_folds.assign_folds(tune_folds.row_keys(tiny, data, seed=3), 5)
    folds = tune_folds.fold_data(data, assignment)
    held_out = [rows_of(f.splits["val"]) for f in folds]
    assert set().union(*held_out) == train | val and sum(map(len, held_out)) == len(train | val)  # a partition
    sizes = [len(h) for h in held_out]
    assert max(sizes) - min(sizes) <= 1
    for fold, out in zip(folds, held_out, strict=True):
        assert set(fold.splits) == {"train", "val"}
        trained_on = rows_of(fold.splits["train"])
        assert trained_on == (train | val) - out and not (trained_on | out) & test


def test_a_rows_fold_depends_on_the_row_and_the_seed_not_on_the_row_order(tiny: Path) -> None:
    data = load(tiny)
    keys = tune_folds.row_keys(tiny, data, seed=0)
    stored = row_hashes.read(tiny)
    assert len(keys) == len(stored["train"]) + len(stored["val"])
    # the key is the row's content digest salted with the seed: recomputed here from row_hashes.npz
    expected = [row_hashes.digest(int(h).to_bytes(8, "little"), salt=0) for h in stored["train"]]
    assert keys[:len(stored["train"])].tolist() == expected
    folds = tune_folds.assign_folds(keys, 5)
    order = np.random.default_rng(1).permutation(len(keys))
    assert (tune_folds.assign_folds(keys[order], 5) == folds[order]).all()
    assert not (tune_folds.assign_folds(tune_folds.row_keys(tiny, data, seed=1), 5) == folds).all()
    with pytest.raises(InvalidParameterError, match="needs at least 5 train \\+ val rows"):
        tune_folds.assign_folds(keys[:4], 5)


def fold_steps(trial_dir: Path) -> list[int]:
    """Each fold run's optimizer steps, summed from its metrics.json (independently of the job's reading)."""
    return [sum(e["steps"] for e in json.loads((f / "metrics.json").read_text())["epochs"])
            for f in sorted(trial_dir.glob("fold-*"))]


def test_a_kfold_study_counts_every_folds_steps_and_retrains_on_the_ordinary_split(tmp_path: Path,
                                                                                   tiny: Path) -> None:
    result = tune(tmp_path / "out", ["ls"], data_dir=tiny, budget_trials=3, retrain_seeds=1, references=False,
                  search_spaces=LR_ONLY, train_options=SHORT, folds=3, compare=False, progress=False)
    selection = result["selection"]
    assert selection["mode"] == "kfold" and selection["folds"] == 3 and not result["warnings"]
    data = load(tiny)
    pooled = len(data.splits["train"]) + len(data.splits["val"])
    assert sum(selection["fold_rows"]) == pooled
    study = result["studies"]["ls"]
    whole = 0
    for trial in study["trials"]:
        trial_dir = tmp_path / "out" / trial["run_dir"]
        steps = fold_steps(trial_dir)
        assert trial["steps"] == sum(steps)
        if trial["outcome"] == "complete":
            assert len(steps) == 3  # every fold ran; a pruned trial stops in fold 0
            whole = sum(steps)
        for fold in sorted(trial_dir.glob("fold-*")):
            record = json.loads((fold / "metrics.json").read_text())
            assert set(record["epochs"][0]["splits"]) == {"val"}
    # a whole trial: each fold trains 2 epochs on the other folds' rows, at the spec's floor of 8 steps an epoch
    batch = jobs.plan_train(tiny, **SHORT).config.batch_size
    expected = sum(2 * math.ceil(r / min(batch, r // 8)) for r in (pooled - n for n in selection["fold_rows"]))
    assert whole == expected == study["spent"]["trial_steps"]
    assert study["spent"]["budget_steps"] == 3 * whole
    assert study["spent"]["steps"] == sum(t["steps"] for t in study["trials"]) <= 3 * whole
    retrained = json.loads((Path(study["retrained"][0]) / "run.json").read_text())
    assert retrained["budget"]["train_rows"] == len(data.splits["train"])  # the ordinary split, not a fold


def test_a_kfold_search_never_reads_the_test_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    poisoned = tmp_path / "poisoned"
    jobs.prepare("tune_problems:Quadratic", poisoned, poison_test=True, steps_per_epoch=5)
    result = tune(tmp_path / "out", ["ls"], data_dir=poisoned, budget_trials=3, retrain_seeds=0, references=False,
                  search_spaces=LR_ONLY, selection="kfold", folds=3, progress=False)
    assert result["selection"]["fold_rows"] == [2, 2, 2]  # 5 train rows and 1 val row
    assert result["studies"]["ls"]["spent"]["trials"] >= 3
