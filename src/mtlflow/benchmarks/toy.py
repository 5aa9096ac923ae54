"""The CAGrad toy problem as a benchmark, so every method trains on it through the normal trainer.

The "model" is the point x itself (the shared trunk); each "head" evaluates one objective, and the
task loss is the objective value. One prepared sample is the start point; an epoch is
``steps_per_epoch`` optimizer steps on it. See :mod:`mtlflow.toy` for the formulas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskModel, MultiTaskTensorDataset, TaskSpec
from mtlflow.taskmetrics import ObjectiveValue
from mtlflow.toy import START_POINTS, toy_losses


class ToyPoint(nn.Module):
    def __init__(self, start: tuple[float, float]):
        super().__init__()
        self.x = nn.Parameter(torch.tensor(start, dtype=torch.float64))

    def forward(self, batch: Tensor) -> Tensor:
        return self.x.expand(batch.shape[0], 2)


class ToyObjective(nn.Module):
    def __init__(self, index: int, scale: float):
        super().__init__()
        self.index, self.scale = index, scale

    def forward(self, z: Tensor) -> Tensor:
        return toy_losses(z, self.scale)[..., self.index]


def _objective_loss(pred: Tensor, target: Tensor) -> Tensor:
    return pred.mean()


class Toy(Benchmark):
    name = "toy"
    description = "CAGrad's 2-objective, 2-parameter toy problem with Nash-MTL/FAMO's imbalance scale"
    config_fields = {
        "start": ConfigField(0, "index of the start point (0-4)", lambda v: v in range(len(START_POINTS)), "0..4"),
        "scale": ConfigField(0.1, "multiplier of objective 1 (1.0 = CAGrad's original)",
                             lambda v: isinstance(v, (int, float)) and v > 0, "positive"),
        "steps_per_epoch": ConfigField(1000, "optimizer steps per epoch",
                                       lambda v: isinstance(v, int) and v > 0, "a positive integer"),
    }
    train_defaults = {"epochs": 35, "batch_size": 1, "lr": 1e-3, "optimizer": "adam"}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(f"f{i + 1}", _objective_loss, (ObjectiveValue,), primary="value", hv_reference=30.0)
                for i in range(2)]

    def method_defaults(self, method: str) -> dict[str, Any]:
        # The toy losses are negative; methods working on log-losses or loss ratios need lower
        # bounds, which FAMO's official toy script sets to (-21·scale, -21).
        from mtlflow import methods

        defaults: dict[str, Any] = {}
        if "min_losses" in methods.get(method).hparams:
            defaults["min_losses"] = [-21.0 * float(self.config["scale"]), -21.0]
        if method == "famo":  # FAMO's toy run.sh uses γ = 0 (no weight decay on the logits)
            defaults["gamma"] = 0.0
        if method == "ldcmtl":  # LDC-MTL App. A.3: rescale normalisation; the router reads no features here
            defaults.update(normalization="rescale", router="vector")
        return defaults

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        (out_dir / "start.txt").write_text(" ".join(map(str, START_POINTS[self.config["start"]])) + "\n")
        return {"start_point": list(START_POINTS[self.config["start"]])}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        n = self.config["steps_per_epoch"]
        dummy = torch.zeros(n, 1, dtype=torch.float64)
        train = MultiTaskTensorDataset(dummy, [dummy[:, 0], dummy[:, 0]])
        one = MultiTaskTensorDataset(dummy[:1], [dummy[:1, 0], dummy[:1, 0]])
        return {"train": train, "val": one, "test": one}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        heads = [ToyObjective(int(n[1:]) - 1, float(self.config["scale"])) for n in names]
        return MultiTaskModel(ToyPoint(START_POINTS[self.config["start"]]), heads, names)
