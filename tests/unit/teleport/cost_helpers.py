"""A COST trainer on MultiMNIST whose LeNet (with a BatchNorm at the trunk's end) runs in float64: loss
changes far below float32's resolution, and finite differences, are visible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.engine.trainer import Trainer
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.lenet import LeNetTrunk, classification_head


class ToDouble(nn.Module):
    def forward(self, x):
        return x.double()


def double_lenet_trainer(data_dir: Path, run_dir: Path, method: str, teleport_options: dict[str, Any],
                         **config: Any) -> Trainer:
    bench, data = jobs.load_prepared(data_dir)

    def make_model(names=None):
        torch.manual_seed(0)
        names = bench.task_names if names is None else names
        trunk = nn.Sequential(ToDouble(), LeNetTrunk(width=4, features=16), nn.BatchNorm1d(16))
        return MultiTaskModel(trunk, [classification_head(16, 10, hidden=8) for _ in names], list(names)).double()

    bench.make_model = make_model
    run = RunConfig(method=method, batch_size=16, max_steps_per_epoch=1, epochs=1,
                    hparams=jobs.resolved_hparams(bench, method, {}), teleport="cost",
                    teleport_options=teleport_options, **config)
    return Trainer(bench, data, run, run_dir, progress=False)
