"""Task specs of the user's own data: validation with key paths and lines, label and feature encoding,
splits, masked losses and batching, each against a hand computation or NumPy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from mtlflow import benchmarks
from mtlflow.benchmarks._spec.schema import SpecError, read_spec
from mtlflow.benchmarks.spec import IndexBatches, InMemoryBatches
from mtlflow.core.errors import DataError, InvalidParameterError


def write(tmp_path: Path, spec: dict, frame: pd.DataFrame | None = None, table: str = "table.csv") -> Path:
    if frame is not None:
        if table.endswith(".parquet"):
            frame.to_parquet(tmp_path / table, index=False)
        else:
            frame.to_csv(tmp_path / table, index=False)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "source": {"table": table}, **spec}, sort_keys=False))
    return path


def frame(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "age": rng.normal(40, 10, n).round(1),
        "plan": rng.choice(["basic", "pro"], n),
        "churned": rng.choice(["yes", "no"], n),
        "spend": rng.normal(100, 20, n).round(2),
        "species": rng.choice([2, 10, 1], n),
        "customer": rng.integers(0, 12, n),
    })


TASKS = [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"},
         {"name": "species", "type": "multiclass"}]


def prepared(tmp_path: Path, spec: dict, data: pd.DataFrame, table: str = "table.csv"):
    bench = benchmarks.build("spec", spec=str(write(tmp_path, spec, data, table)))
    bench.prepare(tmp_path / "data")
    return bench, bench.load(tmp_path / "data")


# -- validation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ({"tasks": [{"name": "a", "type": "binray"}]}, "spec.yaml:6: tasks[0].type: 'binray' is not valid"),
    ({"tasks": [{"name": "a", "type": "binary"}, {"name": "a", "type": "regression"}]},
     "task name(s) ['a'] appear more than once"),
    ({"tasks": [{"name": "a", "type": "binary", "colour": 1}]}, "spec.yaml:7: tasks[0].colour: is not a spec key"),
    ({}, "spec.yaml:1: tasks: is required"),
    ({"tasks": [{"name": "tags", "type": "multilabel"}]}, "tasks[0]: a multilabel task needs columns"),
    ({"tasks": [{"name": "a", "type": "regression", "metrics": ["mae", "f1"]}]},
     "metric(s) ['f1'] are not regression metrics"),
    ({"tasks": [{"name": "a", "type": "binary", "metrics": ["acc"], "primary": "f1"}]},
     "primary 'f1' is not among the task's metrics ['acc']"),
    ({"tasks": TASKS, "split": {"val": 0.5, "test": 0.5}}, "split: val + test = 1 leaves no training rows"),
    ({"tasks": TASKS, "split": {"stratify": "spend"}}, "split.stratify 'spend' must name a binary or multiclass task"),
    ({"tasks": TASKS, "model": {"factory": "no_colon"}}, "factory 'no_colon' must be module:function"),
])
def test_spec_errors_name_the_key_path_and_line(tmp_path: Path, spec: dict, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        read_spec(write(tmp_path, spec))
    message = str(caught.value)
    assert expected in message, message
    assert message.startswith(str(tmp_path / "spec.yaml")), message
    assert "\n" not in message


def test_the_published_json_schema_is_the_spec_models() -> None:
    """docs/reference/spec.schema.json is what `mtlflow config schema --of spec` prints (regenerate it with
    that command after changing the spec's keys)."""
    from mtlflow.benchmarks._spec.schema import spec_json_schema

    published = Path(__file__).parents[3] / "docs" / "reference" / "spec.schema.json"
    assert json.loads(published.read_text()) == json.loads(json.dumps(spec_json_schema()))


def test_rev_needs_a_repository(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: x\nsource:\n  table: t.csv\n  rev: v2\ntasks:\n  - {name: a, type: binary}\n")
    with pytest.raises(SpecError, match=r"spec.yaml:2: source: rev needs repo"):
        read_spec(path)


# -- labels, features, split ------------------------------------------------------------------------
def test_labels_are_encoded_per_kind_and_missing_ones_are_counted(tmp_path: Path) -> None:
    data = frame()
    data.loc[[0, 5], "churned"] = None
    data.loc[[3], "spend"] = None
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"]}}, data)
    schema = bench.schema
    assert schema["tasks"][0]["positive"] == "yes"  # the larger of two text values
    assert schema["tasks"][2]["classes"] == ["1", "2", "10"]  # numbers in numeric order
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    counts = manifest["label_counts"]
    assert sum(counts["churned"].values()) == len(data) - 2
    assert sum(counts["spend"].values()) == len(data) - 1
    assert sum(counts["species"].values()) == len(data)
    # labels read back through the split's rows equal the table's
    split = np.load(tmp_path / "data" / "split.npy")
    rows = np.flatnonzero(split == 0)
    train = loaded.splits["train"]
    churned = train.targets[0].numpy()
    expected = data["churned"].map({"yes": 1.0, "no": 0.0}).to_numpy()[rows]
    np.testing.assert_array_equal(np.isnan(churned), np.isnan(expected))
    np.testing.assert_array_equal(churned[~np.isnan(churned)], expected[~np.isnan(expected)])
    species = train.targets[2].numpy()
    np.testing.assert_array_equal(species, data["species"].map({1: 0, 2: 1, 10: 2}).to_numpy()[rows])
    # regression targets: standardised with the training rows' statistics, paired with the scale
    spend = data["spend"].to_numpy()
    known = spend[rows][~np.isnan(spend[rows])]
    pairs = train.targets[1].numpy()
    np.testing.assert_allclose(pairs[:, 1], known.std(), rtol=1e-6)
    np.testing.assert_allclose(pairs[:, 0], (spend[rows] - known.mean()) / known.std(), rtol=1e-5)
    assert bench.tasks[1].hv_reference == pytest.approx(2 * known.std())


def test_explicit_positive_value_and_bad_values(tmp_path: Path) -> None:
    bench, loaded = prepared(tmp_path, {"tasks": [{"name": "churned", "type": "binary", "positive": "no"}]},
                             frame())
    assert bench.schema["tasks"][0]["positive"] == "no"
    (tmp_path / "bad").mkdir()
    with pytest.raises(SpecError, match=r"tasks\[0\].positive: positive value 'maybe' does not occur"):
        prepared(tmp_path / "bad", {"tasks": [{"name": "churned", "type": "binary", "positive": "maybe"}]}, frame())


def test_features_are_standardised_with_training_rows_and_one_hot_with_training_categories(tmp_path: Path) -> None:
    data = frame()
    data.loc[[1, 2], "age"] = None
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"], "categorical": ["plan"]},
                                        "split": {"column": "part"}},
                             data.assign(part=["train"] * 40 + ["val"] * 10 + ["test"] * 10,
                                         plan=["basic"] * 40 + ["pro"] * 20))
    x = torch.cat([loaded.splits[s].inputs for s in ("train", "val", "test")]).numpy()
    age = data["age"].to_numpy()
    train_age = age[:40][~np.isnan(age[:40])]
    expected = np.where(np.isnan(age), 0.0, (age - train_age.mean()) / train_age.std())
    np.testing.assert_allclose(x[:, 0], expected, rtol=1e-5, atol=1e-6)
    # 'pro' never occurs in training rows: no column of its own, its rows are all-zero
    assert bench.schema["features"]["categorical"] == [{"name": "plan", "categories": ["basic"]}]
    np.testing.assert_array_equal(x[:, 1], [1.0] * 40 + [0.0] * 20)


def test_embedding_codes_are_fitted_on_training_categories_and_unseen_values_share_index_0(tmp_path: Path) -> None:
    data = frame().assign(part=["train"] * 40 + ["val"] * 10 + ["test"] * 10,
                          plan=["basic", "pro", "team", None] * 10 + ["pro", "enterprise"] * 10)
    features = {"numeric": ["age"], "categorical": ["plan", "customer"], "encoding": "embedding"}
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": features, "split": {"column": "part"},
                                        "model": {"hidden": [8]}}, data)
    features = bench.schema["features"]
    assert features["categorical"][0] == {"name": "plan", "categories": ["basic", "pro", "team"], "embedding_dim": 2}
    customers = sorted({str(c) for c in data["customer"][:40]})
    assert features["categorical"][1]["categories"] == customers
    assert features["categorical"][1]["embedding_dim"] == min(50, (len(customers) + 1) // 2)
    x = torch.cat([loaded.splits[s].inputs for s in ("train", "val", "test")]).numpy()
    training = {"basic": 1, "pro": 2, "team": 3}  # 1 + the position among the sorted training categories
    expected = [training.get(v, 0) if isinstance(v, str) else 0 for v in data["plan"]]  # None, 'enterprise': 0
    np.testing.assert_array_equal(x[:, 1], expected)
    np.testing.assert_array_equal(x[:, 2], [customers.index(str(c)) + 1 if str(c) in customers else 0
                                            for c in data["customer"]])
    # the trunk looks every code up in its column's table and feeds [numeric, embeddings] to the MLP
    model = bench.make_model()
    trunk = model.trunk
    assert [e.num_embeddings for e in trunk.embeddings] == [4, len(customers) + 1]
    assert [e.embedding_dim for e in trunk.embeddings] == [2, features["categorical"][1]["embedding_dim"]]
    batch = torch.from_numpy(x[:5])
    by_hand = torch.cat([batch[:, :1], trunk.embeddings[0].weight[batch[:, 1].long()],
                         trunk.embeddings[1].weight[batch[:, 2].long()]], dim=1)
    assert torch.equal(trunk(batch), trunk.mlp(by_hand))
    with pytest.raises(SpecError, match=r"spec.yaml:\d+: features.embedding_dim: Input should be greater than 0"):
        read_spec(write(tmp_path, {"tasks": TASKS, "features": {"categorical": ["plan"], "encoding": "embedding",
                                                                "embedding_dim": 0}}))
    with pytest.raises(SpecError, match=r"features: embedding_dim is for encoding: embedding"):
        read_spec(write(tmp_path, {"tasks": TASKS, "features": {"categorical": ["plan"], "embedding_dim": 4}}))


def test_stratified_and_grouped_splits(tmp_path: Path) -> None:
    data = frame(400)
    bench, _ = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"]},
                                   "split": {"stratify": "churned", "val": 0.25, "test": 0.25, "seed": 3}}, data)
    split = np.load(tmp_path / "data" / "split.npy")
    for value in ("yes", "no"):
        rows = data["churned"].to_numpy() == value
        shares = np.bincount(split[rows], minlength=3) / rows.sum()
        np.testing.assert_allclose(shares, [0.5, 0.25, 0.25], atol=1.5 / rows.sum())
    grouped = tmp_path / "g"
    grouped.mkdir()
    prepared(grouped, {"tasks": TASKS, "features": {"numeric": ["age"]}, "split": {"group": "customer"}}, data)
    split = np.load(grouped / "data" / "split.npy")
    for customer in np.unique(data["customer"]):
        assert len(set(split[data["customer"].to_numpy() == customer])) == 1


def prepare_csv_and_parquet(tmp_path: Path, data: pd.DataFrame) -> None:
    """``data`` prepared from a CSV (under ``c/``) and from a Parquet file (under ``p/``); their features and
    splits must be equal."""
    spec = {"tasks": TASKS, "features": {"numeric": ["age"], "categorical": ["plan"]}}
    (tmp_path / "c").mkdir()
    (tmp_path / "p").mkdir()
    prepared(tmp_path / "c", spec, data)
    prepared(tmp_path / "p", spec, data, table="table.parquet")
    for name in ("features.npy", "split.npy"):
        np.testing.assert_array_equal(np.load(tmp_path / "c" / "data" / name), np.load(tmp_path / "p" / "data" / name))


def test_parquet_and_csv_give_the_same_prepared_arrays(tmp_path: Path) -> None:
    prepare_csv_and_parquet(tmp_path, frame())


def test_na_strings_are_missing_in_parquet_as_in_csv(tmp_path: Path) -> None:
    """pandas writes "NA" text cells to Parquet as text; pyarrow's CSV reader reads them as missing. Both
    files must prepare to the same arrays and label counts (a feature with "NA" cells is numeric either way,
    a label's "NA" is no class)."""
    data = frame()
    data["age"] = data["age"].astype(str)
    data.loc[[3, 17], "age"] = "NA"
    data["churned"] = data["churned"].astype(object)
    data.loc[[5, 8], "churned"] = "NA"
    data["spend"] = data["spend"].astype(str)
    data.loc[9, "spend"] = "null"
    prepare_csv_and_parquet(tmp_path, data)
    with np.load(tmp_path / "c" / "data" / "labels.npz") as csv_labels, \
            np.load(tmp_path / "p" / "data" / "labels.npz") as parquet_labels:
        for key in csv_labels:
            np.testing.assert_array_equal(csv_labels[key], parquet_labels[key])
        assert np.isnan(parquet_labels["task0"][[5, 8]]).all() and np.isnan(parquet_labels["task1"][9])
    counts = [json.loads((tmp_path / d / "data" / "manifest.json").read_text())["label_counts"] for d in ("c", "p")]
    assert counts[0] == counts[1]
    assert sum(counts[1]["churned"].values()) == 58


@pytest.mark.parametrize("change, spec, expected", [
    (None, {"tasks": [{"name": "churn", "type": "binary"}]}, "tasks[0].name: column 'churn' is not in the table"),
    (None, {"tasks": [{"name": "plan", "type": "regression"}]}, "regression target 'plan' is not numeric (e.g. "),
    ("one_class", {"tasks": [{"name": "churned", "type": "binary"}]}, "class column 'churned' holds a single class"),
    ("no_class", {"tasks": [{"name": "churned", "type": "binary"}]},
     "tasks[0].name: class column 'churned' has no labels: every cell is empty"),
    ("no_class", {"tasks": [{"name": "churned", "type": "multiclass"}]},
     "tasks[0].name: class column 'churned' has no labels: every cell is empty"),
    (None, {"tasks": [{"name": "species", "type": "binary"}]}, "binary column 'species' has 3 values"),
    (None, {"tasks": TASKS, "features": {"numeric": ["plan"]}}, "features.numeric[0]: feature 'plan' is not numeric"),
    (None, {"tasks": TASKS, "split": {"column": "plan"}}, "split column 'plan' holds ['basic', 'pro'], not only"),
    ("tiny", {"tasks": [{"name": "spend", "type": "regression"}], "split": {"val": 0.1, "test": 0.1}},
     "split: the val split has no rows (4 rows in all)"),
])
def test_data_errors_name_the_key_path(tmp_path: Path, change: str | None, spec: dict, expected: str) -> None:
    data = frame()
    if change == "one_class":
        data["churned"] = "yes"
    if change == "no_class":
        data["churned"] = None
    if change == "tiny":
        data = data.head(4)
    with pytest.raises(SpecError) as caught:
        prepared(tmp_path, spec, data)
    assert expected in str(caught.value), str(caught.value)
    assert str(caught.value).startswith(str(tmp_path / "spec.yaml") + ":")
    assert not (tmp_path / "data").exists()


def test_missing_table_and_unknown_suffix(tmp_path: Path) -> None:
    missing = benchmarks.build("spec", spec=str(write(tmp_path, {"tasks": TASKS}, table="nothere.csv")))
    with pytest.raises(SpecError, match=r"spec.yaml:3: source.table: file not found: .*nothere.csv"):
        missing.prepare(tmp_path / "d")
    (tmp_path / "t.xlsx").write_bytes(b"x")
    with pytest.raises(SpecError, match="cannot tell the format of .*t.xlsx.*set source.format"):
        benchmarks.build("spec", spec=str(write(tmp_path, {"tasks": TASKS}, table="t.xlsx"))).prepare(tmp_path / "d")


# -- training-side behaviour ---------------------------------------------------------------------------
def test_masked_losses_ignore_missing_labels(tmp_path: Path) -> None:
    data = frame()
    data.loc[:29, "churned"] = None
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"]}}, data)
    train = loaded.splits["train"]
    _, targets = train.__getitems__(list(range(len(train))))
    logits = torch.linspace(-2, 2, len(train))
    labels = targets[0]
    present = ~torch.isnan(labels)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[present], labels[present])
    assert bench.tasks[0].loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)


def test_batches_cover_every_row_once_and_gather_the_right_rows(tmp_path: Path) -> None:
    data = frame(100).assign(row=np.arange(100))  # a feature that tells the rows apart
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["row"]}}, data)
    train = loaded.splits["train"]
    loader = bench.make_loader(train, 16, shuffle=True, generator=torch.Generator().manual_seed(5))
    seen, batches = [], []
    for x, targets in loader:
        batches.append(x)
        matches = (train.inputs[:, None, :] == x[None, :, :]).all(-1)  # which stored row each batch row is
        seen += matches.float().argmax(0).tolist()
        assert len(targets) == 3 and len(targets[0]) == len(x)
    assert sorted(seen) == list(range(len(train)))
    again = [x for x, _ in bench.make_loader(train, 16, shuffle=True, generator=torch.Generator().manual_seed(5))]
    assert torch.equal(torch.cat(again), torch.cat(batches))  # the same seed, the same order
    assert [len(b) for b in IndexBatches(10, 4, False, None)] == [4, 4, 2]
    # without workers the batches skip DataLoader's machinery; with a worker they go through it: the same
    # batches, in the same order, either way
    assert isinstance(loader, InMemoryBatches) and len(loader) == len(batches) == 5
    through_workers = bench.make_loader(train, 16, shuffle=True, generator=torch.Generator().manual_seed(5),
                                        num_workers=1)
    assert isinstance(through_workers, DataLoader)
    worker_batches = list(through_workers)
    assert len(worker_batches) == 5
    assert all(torch.equal(a, b) for a, (b, _) in zip(batches, worker_batches, strict=True))


def test_model_heads_fit_the_task_kinds(tmp_path: Path) -> None:
    bench, loaded = prepared(tmp_path, {"tasks": TASKS + [{"name": "tags", "type": "multilabel",
                                                            "columns": ["t1", "t2", "t3"]}],
                                        "features": {"numeric": ["age"]}, "model": {"hidden": [8], "dropout": 0.1}},
                             frame().assign(t1=[1, 0, 0] * 20, t2=[0, 1] * 30, t3=[0, 0, 1] * 20))
    model = bench.make_model()
    outputs = model(loaded.splits["val"].inputs)
    assert [o.shape[-1] for o in outputs] == [1, 1, 3, 3]
    fresh = benchmarks.build("spec", spec=bench.config["spec"])
    with pytest.raises(InvalidParameterError, match="sized by its prepared data; prepare it first"):
        fresh.make_model()
    rebuilt = benchmarks.build("spec", **bench.config)  # what a run directory records
    assert rebuilt.make_model().state_dict().keys() == model.state_dict().keys()


def test_factory_errors_are_one_line(tmp_path: Path) -> None:
    """Refused by prepare itself (issue 29, item 9), which then leaves no output behind."""
    with pytest.raises(SpecError, match=r"model.factory: cannot import no_such_module_xyz:build \(ModuleNotFoundError: "
                                        r"No module named 'no_such_module_xyz'\)"):
        prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"]},
                            "model": {"factory": "no_such_module_xyz:build"}}, frame())
    assert not (tmp_path / "data").exists()


def test_data_of_another_spec_is_refused(tmp_path: Path) -> None:
    bench, _ = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age"]}}, frame())
    other = dict(bench.config["spec"], split={**bench.config["spec"]["split"], "seed": 9})
    with pytest.raises(DataError, match=r"was prepared from another spec \(split differ\)"):
        benchmarks.build("spec", spec=other).load(tmp_path / "data")


# -- spec init -----------------------------------------------------------------------------------------
def test_spec_init_reads_the_kinds_off_the_columns(tmp_path: Path) -> None:
    from mtlflow.benchmarks._spec.infer import infer_spec

    data = frame().assign(note=[f"free text {i}" for i in range(60)], split=["train"] * 40 + ["val", "test"] * 10)
    data.to_csv(tmp_path / "t.csv", index=False)
    (tmp_path / "specs").mkdir()
    text = infer_spec(tmp_path / "t.csv", ["churned", "spend"],
                      tmp_path / "specs" / "t.yaml")
    spec = yaml.safe_load(text)
    assert spec["source"] == {"table": "../t.csv"}  # relative to the spec's folder
    assert spec["tasks"] == [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"}]
    assert spec["features"] == {"numeric": ["age", "species", "customer"], "categorical": ["plan"]}
    assert spec["split"] == {"column": "split"}
    assert "# left out (more than 50 distinct text values, e.g. ids): note" in text
    # the written spec prepares as it is
    (tmp_path / "specs" / "t.yaml").write_text(text)
    benchmarks.build("spec", spec=str(tmp_path / "specs" / "t.yaml")).prepare(tmp_path / "data")
    with pytest.raises(SpecError, match=r"--tasks churn: not columns of .*t.csv \(columns: age, plan"):
        infer_spec(tmp_path / "t.csv", ["churn"], tmp_path / "x.yaml")
    molecules = pd.DataFrame({"SMILES": ["CCO", "c1ccccc1"], "toxic": [0, 1]})
    molecules.to_csv(tmp_path / "m.csv", index=False)
    spec = yaml.safe_load(infer_spec(tmp_path / "m.csv", ["toxic"], tmp_path / "m.yaml"))
    assert spec["source"] == {"table": "m.csv", "smiles": "SMILES"} and "features" not in spec


@pytest.mark.parametrize("column, cells, explicit, expected", [
    ("age", {3: float("inf")}, True,
     "features.numeric[0]: feature 'age' holds 1 infinite or out-of-range value(s) (|x| > 3.4e+38, e.g. inf)"),
    ("age", {3: 1e308, 7: -1e300}, True,
     "features.numeric[0]: feature 'age' holds 2 infinite or out-of-range value(s) (|x| > 3.4e+38, e.g. 1e+308)"),
    ("age", {5: float("-inf")}, False, "features: feature 'age' holds 1 infinite or out-of-range value(s)"),
    ("spend", {0: 1e308}, True, "tasks[1].name: regression target 'spend' holds 1 infinite or out-of-range value(s)"),
])
def test_infinite_or_overflowing_cells_are_refused_with_the_column_and_count(
        tmp_path: Path, column: str, cells: dict, explicit: bool, expected: str) -> None:
    """A single inf or 1e308 cell made the column's mean and standard deviation overflow (the whole feature became
    a constant) or dropped a target from MAE; features and targets are float32 in the model, so |x| > float32's
    maximum cannot be represented either."""
    data = frame()
    for row, value in cells.items():
        data.loc[row, column] = value
    spec = {"tasks": TASKS, **({"features": {"numeric": ["age", "customer"]}} if explicit else {})}
    with pytest.raises(SpecError) as caught:
        prepared(tmp_path, spec, data)
    assert expected in str(caught.value), str(caught.value)
    assert not (tmp_path / "data").exists()


def test_a_large_but_representable_value_is_kept_and_missing_features_are_counted(tmp_path: Path) -> None:
    data = frame()
    data.loc[[1, 2, 50], "age"] = None
    data.loc[4, "age"] = 3e38  # below float32's maximum: standardised, finite, not refused
    bench, loaded = prepared(tmp_path, {"tasks": TASKS, "features": {"numeric": ["age", "customer"]}}, data)
    x = torch.cat([loaded.splits[s].inputs for s in ("train", "val", "test")]).numpy()
    assert np.isfinite(x).all() and np.unique(x[:, 0]).size > 2
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["missing_feature_values"] == {"age": 3, "customer": 0}
    assert [c["missing"] for c in bench.schema["features"]["numeric"]] == [3, 0]
