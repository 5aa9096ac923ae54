"""A synthetic customer table with two tasks: will the customer churn (binary) and how much will they spend
(regression). It stands for the user's own table: ``write_data`` is where a real benchmark reads its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, MultiTaskTensorDataset, load_tensor_file
from mtlflow.core.hparams import ConfigField, positive
from mtlflow.metrics.regression import with_scale
from mtlflow.metrics.task import TaskSpec
from mtlflow.metrics.task_types import BINARY, REGRESSION
from mtlflow.models.base import MultiTaskModel

#: the share of the rows in the validation and in the test split
HELD_OUT_SHARE = 0.2


class Churn(Benchmark):
    name = "churn"
    description = "synthetic customer table: churn (binary) and spend (regression) from 8 numeric features"
    config_fields = {
        "rows": ConfigField(2000, "number of customers", positive),
        "features": ConfigField(8, "number of numeric features", positive),
        "seed": ConfigField(0, "seed of the synthetic table and of the split"),
    }
    train_defaults = {"epochs": 5, "batch_size": 64, "lr": 1e-3, "optimizer": "adam"}

    @property
    def tasks(self) -> list[TaskSpec]:
        # the kinds' default losses and metrics; a regression task needs its hypervolume reference (MAE)
        return [BINARY.task("churn"), REGRESSION.task("spend", hv_reference=5.0)]

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(self.config["seed"])
        rows, features = self.config["rows"], self.config["features"]
        x = torch.randn(rows, features, generator=generator)
        churn = (x[:, 0] - x[:, 1] + 0.5 * torch.randn(rows, generator=generator) > 0).float()
        spend = 100 + 10 * x[:, 1] + 5 * x[:, 2] * x[:, 3] + torch.randn(rows, generator=generator)
        order = torch.randperm(rows, generator=generator)
        held_out = int(HELD_OUT_SHARE * rows)
        split = {"test": order[:held_out], "val": order[held_out:2 * held_out], "train": order[2 * held_out:]}
        torch.save({"x": x, "churn": churn, "spend": spend, "split": split}, out_dir / "table.pt")
        return {"rows": rows, "split_sizes": {k: len(v) for k, v in split.items()}}  # extra manifest fields

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        table = load_tensor_file(data_dir / "table.pt", "churn table", "re-run `mtlflow prepare --benchmark churn`")
        train = table["split"]["train"]
        # regression targets are (standardised value, scale) pairs, standardised with training statistics
        mean, std = table["spend"][train].mean(), table["spend"][train].std()
        spend = with_scale((table["spend"] - mean) / std, std)
        return {name: MultiTaskTensorDataset(table["x"][rows], [table["churn"][rows], spend[rows]])
                for name, rows in table["split"].items()}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = nn.Sequential(nn.Linear(self.config["features"], 32), nn.ReLU())
        return MultiTaskModel(trunk, [nn.Linear(32, 1) for _ in names], names)
