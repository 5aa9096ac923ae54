"""Shared implementation of the tabular benchmarks from Mulan ARFF files in ``shared/realdata``
(multi-target regression: scm20d; multi-label classification: yeast).

Preparation reads the ARFF with ``scipy.io.arff``, keeps the feature and target columns, draws a
seeded random train/val/test split and stores ``table.pt`` (raw values) and ``split.json``.
Loading standardises the features with training statistics (missing features, ``?`` in ARFF, become
the training mean, i.e. 0) and, for regression, the targets (losses in standard units, metrics in
original units, see :mod:`mtlflow.metrics.regression`). Model: an MLP trunk (two hidden ReLU layers)
with one linear output per task.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from mtlflow.benchmarks._graphs import (
    SPLIT_FILE,
    random_split_ids,
    read_split,
    standardise,
    standardised_targets,
    write_split,
)
from mtlflow.benchmarks._molnet import verify_realdata_file
from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset, load_tensor_file
from mtlflow.benchmarks.realdata import realdata_path
from mtlflow.core.errors import DataError
from mtlflow.metrics.task import TaskSpec
from mtlflow.metrics.task_types import TaskType
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.mlp import MLPTrunk


def _fraction(v: Any) -> bool:
    return isinstance(v, (int, float)) and 0 < v < 1


def read_arff(path: Path) -> tuple[np.ndarray, list[str]]:
    """All columns of an (optionally gzipped) ARFF file as float64 (nominal ``{0,1}`` -> 0/1, ``?`` -> NaN)."""
    from scipy.io import arff

    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt") as fh:
                data, meta = arff.loadarff(fh)
        else:
            data, meta = arff.loadarff(path)
    except (OSError, ValueError, arff.ArffError) as exc:
        raise DataError(f"cannot read ARFF file {path} ({exc}); restore the shared realdata folder") from None
    names = list(meta.names())
    columns = []
    for name, kind in zip(names, meta.types(), strict=True):
        column = data[name]
        if kind == "nominal":
            column = np.array([float(v.decode()) if v not in (b"?", "?") else np.nan for v in column])
        columns.append(np.asarray(column, dtype=np.float64))
    return np.stack(columns, axis=1), names


class TabularBenchmark(Benchmark):
    """A realdata ARFF table: subclasses pick the file and the target columns."""

    realdata_file: ClassVar[tuple[str, ...]]
    #: the target columns by ARFF attribute name, each one task of ``task_type``
    label_names: ClassVar[tuple[str, ...]]
    task_type: ClassVar[TaskType]
    #: overrides of the task type's defaults (``metrics``, ``primary``, ``hv_reference``)
    task_options: ClassVar[dict[str, Any]] = {}
    #: number of feature columns (the model's input size, known before any data is read)
    n_features: ClassVar[int]

    config_fields = {
        "val_fraction": ConfigField(0.1, "share of rows for validation", _fraction, "in (0, 1)"),
        "test_fraction": ConfigField(0.2, "share of rows for test", _fraction, "in (0, 1)"),
        "seed": ConfigField(0, "seed of the random split", lambda v: isinstance(v, int) and not isinstance(v, bool),
                            "an integer"),
        "hidden": ConfigField(256, "width of the MLP trunk", lambda v: isinstance(v, int) and v > 0,
                              "a positive integer"),
    }
    # mtlflow's recipe: no MTL paper uses these tables
    train_defaults = {"epochs": 100, "batch_size": 128, "lr": 1e-3, "optimizer": "adam"}
    cpu_smoke = {"data_options": {}, "train_options": {"epochs": 2, "batch_size": 256}}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [self.task_type.task(name, **self.task_options) for name in self.label_names]

    def target_columns(self, names: Sequence[str]) -> list[int]:
        """Positions of the target columns (``label_names``) among the ARFF attributes ``names``."""
        missing = [n for n in self.label_names if n not in names]
        if missing:
            raise DataError(f"{self.realdata_file[-1]} lacks target column(s) {missing}; restore the shared realdata "
                            "folder")
        return [list(names).index(n) for n in self.label_names]

    def _fix(self) -> str:
        return f"re-run `mtlflow prepare --benchmark {self.name}`"

    def _source(self) -> Path:
        path = realdata_path(*self.realdata_file)
        if path is None:
            raise DataError(f"real data file {'/'.join(self.realdata_file)} not found; set MTLFLOW_REALDATA to the "
                            "shared realdata folder")
        return path

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        cfg = self.config
        if cfg["val_fraction"] + cfg["test_fraction"] >= 1:
            raise DataError("val_fraction + test_fraction must be below 1")
        path = self._source()
        digest = verify_realdata_file(path)
        table, names = read_arff(path)
        targets = self.target_columns(names)
        features = [i for i in range(len(names)) if i not in targets]
        ids = list(range(len(table)))
        n_test = int(round(cfg["test_fraction"] * len(ids)))
        n_val = int(round(cfg["val_fraction"] * len(ids)))
        split = random_split_ids(ids, n_val, n_test, cfg["seed"])
        torch.save({"x": torch.from_numpy(table[:, features]), "y": torch.from_numpy(table[:, targets]),
                    "feature_names": [names[i] for i in features], "target_names": [names[i] for i in targets]},
                   out_dir / "table.pt")
        write_split(out_dir / SPLIT_FILE, split, cfg["seed"], "seeded random split: test first, then val, rest train")
        return {"source": {"file": str(path), "sha256": digest}, "rows": len(ids), "features": len(features),
                "split_sizes": {k: len(v) for k, v in split.items()},
                "missing_feature_share": float(np.isnan(table[:, features]).mean())}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        fix = self._fix()
        blob = load_tensor_file(data_dir / "table.pt", f"{self.name} table", fix)
        if not isinstance(blob, dict) or not {"x", "y"} <= set(blob):
            raise DataError(f"{data_dir / 'table.pt'} lacks x/y; {fix}")
        if blob["x"].shape[1] != self.n_features:
            raise DataError(f"{data_dir / 'table.pt'} has {blob['x'].shape[1]} feature columns, expected "
                            f"{self.n_features}; {fix}")
        split = read_split(data_dir / SPLIT_FILE, fix)
        rows = {name: torch.tensor(ids, dtype=torch.int64) for name, ids in split.items()}
        x, _, _ = standardise(blob["x"], rows["train"])
        x = torch.nan_to_num(x, nan=0.0)
        if self.task_type.standardised:
            targets = standardised_targets(blob["y"], rows["train"])
        else:
            targets = blob["y"].float()
        return {name: MultiTaskTensorDataset(x[r], list(targets[r].unbind(dim=1))) for name, r in rows.items()}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = MLPTrunk(self.n_features, [self.config["hidden"]] * 2)
        return MultiTaskModel(trunk, [nn.Linear(trunk.out_features, 1) for _ in names], names)
