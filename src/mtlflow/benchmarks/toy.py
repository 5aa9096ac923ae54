"""The CAGrad toy problem as a benchmark, so every method trains on it through the normal trainer.

The "model" is the point x itself (the shared trunk); each "head" evaluates one objective, and the
task loss is the objective value. One prepared sample is the start point; an epoch is
``steps_per_epoch`` optimizer steps on it. The problem is CAGrad's two-objective, two-parameter
toy (Liu et al., NeurIPS 2021, Sec. 5 / App.). With x = (x1, x2) and LOWER = 5e-6::

    f1a = log max(|0.5(-x1 - 7) - tanh(-x2)|, LOWER) + 6
    f2a = log max(|0.5(-x1 + 3) + tanh(-x2) + 2|, LOWER) + 6
    f1b = ((-x1 + 7)^2 + 0.1 (-x2 - 8)^2) / 10 - 20
    f2b = ((-x1 - 7)^2 + 0.1 (-x2 - 8)^2) / 10 - 20
    c1 = max(tanh(0.5 x2), 0),  c2 = max(tanh(-0.5 x2), 0)
    L1 = scale * (c1 f1a + c2 f1b),  L2 = c1 f2a + c2 f2b

``scale`` = 0.1 is the imbalance used by Nash-MTL (Navon et al. 2022) and FAMO (Liu et al. 2023);
``scale`` = 1 is CAGrad's original. The LDC-MTL paper prints ``- tanh(-x2)`` in f2a, but all three
public implementations use ``+``; we follow them (see methods-palora-ldc.md §II.11).
The Pareto set is x2 = -8.3552, x1 in [-7, 7].
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

LOWER = 5e-6
#: The five start points of the Nash-MTL and FAMO toy experiments.
START_POINTS: tuple[tuple[float, float], ...] = ((-8.5, 7.5), (0.0, 0.0), (9.0, 9.0), (-7.5, -0.5), (9.0, -1.0))
PARETO_X2 = -8.3552
PARETO_X1_RANGE = (-7.0, 7.0)


def _relu_inclusive(t: Tensor) -> Tensor:
    """max(t, 0) with derivative 1 at t = 0, as torch.clamp had when the reference code was written.

    torch 2.x gives clamp a zero derivative at its boundary, which would freeze every method at the
    published start point (0, 0), where both gates are exactly at 0.
    """
    return torch.where(t >= 0, t, torch.zeros_like(t))


def toy_losses(x: Tensor, scale: float = 0.1) -> Tensor:
    """Both objectives at ``x`` (shape ``[..., 2]``); returns ``[..., 2]``."""
    x1, x2 = x[..., 0], x[..., 1]
    lower = torch.as_tensor(LOWER, dtype=x.dtype, device=x.device)
    f1a = torch.log(torch.maximum((0.5 * (-x1 - 7) - torch.tanh(-x2)).abs(), lower)) + 6
    f2a = torch.log(torch.maximum((0.5 * (-x1 + 3) + torch.tanh(-x2) + 2).abs(), lower)) + 6
    c1 = _relu_inclusive(torch.tanh(0.5 * x2))
    f1b = ((-x1 + 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    f2b = ((-x1 - 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    c2 = _relu_inclusive(torch.tanh(-0.5 * x2))
    return torch.stack([scale * (c1 * f1a + c2 * f1b), c1 * f2a + c2 * f2b], dim=-1)


def distance_to_pareto_set(x: Tensor) -> Tensor:
    """Euclidean distance from ``x`` (``[..., 2]``) to the segment x2 = -8.3552, x1 in [-7, 7]."""
    lo, hi = PARETO_X1_RANGE
    dx = x[..., 0] - x[..., 0].clamp(lo, hi)
    dy = x[..., 1] - PARETO_X2
    return torch.sqrt(dx**2 + dy**2)

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

    @property
    def loss_lower_bounds(self) -> list[float]:
        # The toy losses are negative; FAMO's official toy script bounds them by (-21·scale, -21).
        return [-21.0 * float(self.config["scale"]), -21.0]

    def method_defaults(self, method: str) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
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
