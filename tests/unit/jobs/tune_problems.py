"""A benchmark whose best learning rate is known, for the tuning tests (named by its import path,
``tune_problems:Quadratic``, with this folder on ``sys.path``).

Two tasks share one point x in R^2 (the trunk); task i's loss is ``0.5 a_i ||x - c||^2``. Linear scalarisation
minimises their sum, so plain SGD (momentum 0) moves ``x - c`` by the factor ``1 - lr (a_1 + a_2)`` per step:
``lr* = 1 / (a_1 + a_2)`` reaches c in one step and every other rate is worse after any number of steps, and
rates above ``2 lr*`` diverge. ``poison_test=True`` makes every read of the test split raise
:class:`TestSplitRead`, so a job that must never look at test can be run on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset
from mtlflow.metrics.task import ObjectiveValue, TaskSpec
from mtlflow.models.base import MultiTaskModel

CURVATURES = (1.0, 3.0)
CENTRE = (0.0, 0.0)
START = (1.0, -2.0)
#: the best learning rate of LS with SGD (momentum 0) on this problem
BEST_LR = 1.0 / sum(CURVATURES)


class TestSplitRead(AssertionError):
    """Raised by the poisoned test split on any read."""


class PoisonedSplit(Dataset):
    def __len__(self) -> int:
        raise TestSplitRead("the test split was read")

    def __getitem__(self, index: int) -> Any:
        raise TestSplitRead("the test split was read")


class Point(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.tensor(START, dtype=torch.float64))

    def forward(self, batch: Tensor) -> Tensor:
        return self.x.expand(batch.shape[0], 2)


class Bowl(nn.Module):
    def __init__(self, curvature: float) -> None:
        super().__init__()
        self.curvature = curvature

    def forward(self, z: Tensor) -> Tensor:
        return 0.5 * self.curvature * ((z - torch.tensor(CENTRE, dtype=z.dtype)) ** 2).sum(-1)


def _value_loss(pred: Tensor, target: Tensor) -> Tensor:
    return pred.mean()


class Quadratic(Benchmark):
    name = "quadratic"
    description = "two quadratic bowls around one centre: the best SGD learning rate of LS is 1 / (a_1 + a_2)"
    config_fields = {
        "steps_per_epoch": ConfigField(2, "optimizer steps per epoch", lambda v: isinstance(v, int) and v > 0,
                                       "a positive integer"),
        "poison_test": ConfigField(False, "every read of the test split raises", lambda v: isinstance(v, bool),
                                   "true or false"),
    }
    train_defaults = {"epochs": 3, "batch_size": 1, "lr": 0.01, "optimizer": "sgd", "momentum": 0.0}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(f"bowl{i + 1}", _value_loss, (ObjectiveValue,), primary="value", hv_reference=10.0)
                for i in range(len(CURVATURES))]

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        (out_dir / "problem.txt").write_text(f"curvatures {CURVATURES} centre {CENTRE} start {START}\n")
        return {"curvatures": list(CURVATURES)}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        dummy = torch.zeros(self.config["steps_per_epoch"], 1, dtype=torch.float64)
        train = MultiTaskTensorDataset(dummy, [dummy[:, 0]] * len(CURVATURES))
        one = MultiTaskTensorDataset(dummy[:1], [dummy[:1, 0]] * len(CURVATURES))
        return {"train": train, "val": one, "test": PoisonedSplit() if self.config["poison_test"] else one}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        return MultiTaskModel(Point(), [Bowl(CURVATURES[int(n[4:]) - 1]) for n in names], names)
