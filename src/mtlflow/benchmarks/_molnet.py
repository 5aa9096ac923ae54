"""Shared implementation of the MoleculeNet-style benchmarks read from ``shared/realdata/chem`` (Tox21,
QM8): SMILES -> 2-D heavy-atom graphs with torch_geometric's ``from_smiles`` features, a seeded
random split into train/val/test, and the MPNN of :mod:`mtlflow.models.mpnn` with categorical atom
and bond embeddings. Subclasses name the file, the label columns and the task type.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from mtlflow.benchmarks._graphs import (
    GraphBenchmark,
    GraphDataset,
    load_graph_data,
    pack_graphs,
    random_split_ids,
    save_graph_data,
    standardised_targets,
    training_statistics,
)
from mtlflow.benchmarks._molgraphs import categorical_graph_from_smiles, categorical_vocab_sizes
from mtlflow.benchmarks.base import ConfigField
from mtlflow.benchmarks.realdata import realdata_path
from mtlflow.core.errors import DataError
from mtlflow.core.hashing import file_sha256
from mtlflow.metrics.task import TaskSpec
from mtlflow.metrics.task_types import TaskType
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.mpnn import MPNNTrunk, regression_heads


def _optional_positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _fraction(v: Any) -> bool:
    return isinstance(v, (int, float)) and 0 < v < 1


def verify_realdata_file(path: Path) -> str:
    """SHA-256 of a shared realdata file, checked against the folder's ``SHA256SUMS`` when listed there."""
    digest = file_sha256(path)
    for parent in path.parents:
        sums = parent / "SHA256SUMS"
        if sums.is_file():
            relative = "./" + path.relative_to(parent).as_posix()
            for line in sums.read_text().splitlines():
                expected, _, name = line.partition("  ")
                if name.strip() == relative and expected != digest:
                    raise DataError(f"{path} does not match its SHA256SUMS entry (corrupt or edited); restore the "
                                    "shared realdata folder")
            break
    return digest


class MoleculeNetBenchmark(GraphBenchmark):
    """Graph benchmark over one realdata CSV with a ``smiles`` column and one column per task."""

    realdata_file: ClassVar[tuple[str, ...]]
    #: one task per label column of the same name, all of one kind
    task_type: ClassVar[TaskType]
    label_columns: ClassVar[tuple[str, ...]]
    #: overrides of the task type's defaults (``metrics``, ``primary``, ``hv_reference``)
    task_options: ClassVar[dict[str, Any]] = {}

    config_fields = {
        "n_molecules": ConfigField(None, "use this many molecules (seeded subset; default all)",
                                   _optional_positive_int, "a positive integer or null"),
        "val_fraction": ConfigField(0.1, "share of molecules for validation", _fraction, "in (0, 1)"),
        "test_fraction": ConfigField(0.1, "share of molecules for test", _fraction, "in (0, 1)"),
        "seed": ConfigField(0, "seed of the subset and of the random split",
                            lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    }
    # mtlflow's recipe: no MTL paper fixes one for these sets
    train_defaults = {"epochs": 100, "batch_size": 128, "lr": 1e-3, "optimizer": "adam"}
    cpu_smoke = {"data_options": {"n_molecules": 600}, "train_options": {"epochs": 2, "batch_size": 64}}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [self.task_type.task(name, **self.task_options) for name in self.label_columns]

    @property
    def standardise_targets(self) -> bool:
        return self.task_type.standardised

    def _fix(self) -> str:
        return f"re-run `mtlflow prepare --benchmark {self.name}`"

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        import pandas as pd


        cfg = self.config
        path = realdata_path(*self.realdata_file)
        if path is None:
            raise DataError(f"real data file {'/'.join(self.realdata_file)} not found; set MTLFLOW_REALDATA to the "
                            "shared realdata folder")
        digest = verify_realdata_file(path)
        frame = pd.read_csv(path)
        missing = [c for c in ("smiles", *self.label_columns) if c not in frame.columns]
        if missing:
            raise DataError(f"{path} lacks column(s) {missing}; restore the shared realdata file")
        if cfg["val_fraction"] + cfg["test_fraction"] >= 1:
            raise DataError("val_fraction + test_fraction must be below 1")
        rows = np.arange(len(frame))
        if cfg["n_molecules"] is not None:
            rows = np.sort(np.random.default_rng(cfg["seed"]).permutation(len(frame))[:cfg["n_molecules"]])
        graphs, ids, invalid = [], [], 0
        for row in rows:
            graph = categorical_graph_from_smiles(frame["smiles"].iloc[row])
            if graph is None or len(graph.x) == 0:
                invalid += 1
                continue
            graphs.append(graph)
            ids.append(int(row))
        labels = frame[list(self.label_columns)].to_numpy(dtype=np.float64)[ids]
        store = pack_graphs(graphs, labels, ids)
        n_test = int(round(cfg["test_fraction"] * len(ids)))
        n_val = int(round(cfg["val_fraction"] * len(ids)))
        split = random_split_ids(ids, n_val, n_test, cfg["seed"])
        save_graph_data(out_dir, store, split, cfg["seed"], "seeded random split: test first, then val, rest train")
        extra: dict[str, Any] = {}
        if self.standardise_targets:
            extra = training_statistics(store, split, self.label_columns, self._fix())
            (out_dir / "targets.json").write_text(json.dumps(extra, indent=2) + "\n")
        return {"source": {"file": str(path), "sha256": digest, "rows": len(frame)}, "molecules": len(ids),
                "invalid_smiles_skipped": invalid, "split_sizes": {k: len(v) for k, v in split.items()},
                "missing_label_share": float(np.isnan(labels).mean()), **extra}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        store, rows = load_graph_data(data_dir, self.name, self._fix())
        targets = standardised_targets(store["y"], rows["train"]) if self.standardise_targets else store["y"].float()
        return {name: GraphDataset(store, rows[name], targets, complete=False) for name in rows}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        node_vocab, edge_vocab = categorical_vocab_sizes()
        trunk = MPNNTrunk(dim=64, node_vocab=node_vocab, edge_vocab=edge_vocab)
        return MultiTaskModel(trunk, regression_heads(trunk.out_features, len(names)), names)
