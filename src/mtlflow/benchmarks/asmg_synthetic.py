"""The three synthetic black-box MOO problems of ASMG (Ye, PhD thesis UTS 2024, Section 4.6.1).

For x ∈ R^d, with the ellipsoid weights w_i = 10^{2(i−1)/(d−1)} and s_i = 10^{(i−1)/(d−1)}:

* ``l1-ellipsoid`` -- shift l1-ellipsoid (Eq. 4.21): (Σ w_i |x_i − 0.01|, Σ w_i |x_i + 0.01|);
  Pareto set P_1 = [−0.01, 0.01]^d;
* ``lhalf-ellipsoid`` -- shift l½-ellipsoid (Eq. 4.22, printed without weights):
  (Σ |x_i − 0.1|^½, Σ |x_i + 0.1|^½); concave front, evaluated against P̂_2 = {x : x_i ∈ {−0.1, 0.1}};
* ``ellipsoid-rastrigin`` -- mixed ellipsoid–Rastrigin 10 (Eq. 4.23):
  (Σ w_i |x_i|^½, 10d + Σ ((s_i x_i)² − 10 cos(2π s_i x_i))); Pareto set P_3 = {0}.

The metric is ℰ = dist(x, P), the Euclidean distance of the returned mean to the set. Start: μ_0 drawn
from U[0, 1]^d, Σ_0 = I (thesis). ``mtlflow asmg-synthetic`` (:mod:`mtlflow.experiments.asmg_synthetic`) runs
ASMG on them; as a registered benchmark (``mtlflow train --benchmark asmg-synthetic --method asmg``)
the point x is the model's only parameter and each head evaluates one objective, like ``toy``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset
from mtlflow.core.hparams import one_of
from mtlflow.metrics.task import ObjectiveValue, TaskSpec
from mtlflow.models.base import MultiTaskModel


@functools.lru_cache(maxsize=32)
def _weights(d: int, span: float) -> Tensor:
    return torch.pow(10.0, span * torch.arange(d, dtype=torch.float64) / max(d - 1, 1))


def _ellipsoid_weights(d: int, span: float, like: Tensor) -> Tensor:
    """(10^{span·(i−1)/(d−1)})_i, cached: the objectives are evaluated twice per ASMG iteration."""
    return _weights(d, span).to(device=like.device, dtype=like.dtype)


def shift_l1_ellipsoid(x: Tensor) -> Tensor:
    """Eq. 4.21 on points ``[n, d]`` -> ``[n, 2]``."""
    w = _ellipsoid_weights(x.shape[-1], 2.0, x)
    return torch.stack([(w * (x - 0.01).abs()).sum(-1), (w * (x + 0.01).abs()).sum(-1)], dim=-1)


def shift_lhalf_ellipsoid(x: Tensor) -> Tensor:
    """Eq. 4.22 on points ``[n, d]`` -> ``[n, 2]``."""
    return torch.stack([(x - 0.1).abs().sqrt().sum(-1), (x + 0.1).abs().sqrt().sum(-1)], dim=-1)


def mixed_ellipsoid_rastrigin(x: Tensor) -> Tensor:
    """Eq. 4.23 on points ``[n, d]`` -> ``[n, 2]``."""
    d = x.shape[-1]
    w = _ellipsoid_weights(d, 2.0, x)
    scaled = _ellipsoid_weights(d, 1.0, x) * x
    first = (w * x.abs().sqrt()).sum(-1)
    second = 10.0 * d + (scaled * scaled - 10.0 * torch.cos(2.0 * math.pi * scaled)).sum(-1)
    return torch.stack([first, second], dim=-1)


def distance_to_box(x: Tensor, half_width: float = 0.01) -> Tensor:
    """dist(x, [−a, a]^d)."""
    return (x.abs() - half_width).clamp_min(0.0).norm(dim=-1)


def distance_to_corners(x: Tensor, corner: float = 0.1) -> Tensor:
    """dist(x, {x : x_i ∈ {−c, c}})."""
    return (x.abs() - corner).norm(dim=-1)


def distance_to_origin(x: Tensor) -> Tensor:
    return x.norm(dim=-1)


@dataclass(frozen=True)
class SyntheticProblem:
    name: str
    equation: str
    objectives: Callable[[Tensor], Tensor]
    distance: Callable[[Tensor], Tensor]
    pareto_set: str


PROBLEMS: dict[str, SyntheticProblem] = {
    p.name: p for p in (
        SyntheticProblem("l1-ellipsoid", "Eq. 4.21", shift_l1_ellipsoid, distance_to_box, "[-0.01, 0.01]^d"),
        SyntheticProblem("lhalf-ellipsoid", "Eq. 4.22", shift_lhalf_ellipsoid, distance_to_corners, "{-0.1, 0.1}^d"),
        SyntheticProblem("ellipsoid-rastrigin", "Eq. 4.23", mixed_ellipsoid_rastrigin, distance_to_origin, "{0}"),
    )
}


def start_point(dim: int, seed: int) -> Tensor:
    """μ_0 ~ U[0, 1]^d (thesis), from a generator seeded by ``seed``."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.rand(dim, generator=gen, dtype=torch.float64)


class SyntheticPoint(nn.Module):
    def __init__(self, start: Tensor):
        super().__init__()
        self.x = nn.Parameter(start.clone())

    def forward(self, batch: Tensor) -> Tensor:
        return self.x.expand(batch.shape[0], self.x.numel())


class SyntheticObjective(nn.Module):
    def __init__(self, problem: SyntheticProblem, index: int):
        super().__init__()
        self.problem, self.index = problem, index

    def forward(self, z: Tensor) -> Tensor:
        return self.problem.objectives(z)[..., self.index]


def _objective_loss(pred: Tensor, target: Tensor) -> Tensor:
    return pred.mean()


class ASMGSynthetic(Benchmark):
    name = "asmg-synthetic"
    description = ("ASMG's synthetic black-box MOO problems (Ye thesis Eqs. 4.21-4.23): shifted l1/l½ ellipsoids, "
                   "mixed ellipsoid-Rastrigin; the model is the point x ∈ R^d")
    config_fields = {
        "problem": ConfigField("l1-ellipsoid", "one of " + ", ".join(PROBLEMS), one_of(*PROBLEMS)),
        "dim": ConfigField(100, "dimension d (thesis: 100)", lambda v: isinstance(v, int) and v >= 2,
                           "an integer >= 2"),
        "seed": ConfigField(0, "seed of the start point μ_0 ~ U[0, 1]^d", lambda v: isinstance(v, int), "an integer"),
        "steps_per_epoch": ConfigField(1000, "iterations per epoch", lambda v: isinstance(v, int) and v > 0,
                                       "a positive integer"),
    }
    train_defaults = {"epochs": 5, "batch_size": 1, "lr": 1e-3, "optimizer": "sgd"}
    cpu_smoke = {"data_options": {"dim": 10, "steps_per_epoch": 20}, "train_options": {"epochs": 1}}

    def method_defaults(self, method: str) -> dict[str, Any]:
        # the thesis' synthetic setting (Section 4.6.1): β = 0.1, N = 50 (Fig. 4.2), Σ_0 = I
        return {"beta": 0.1, "n_samples": 50} if method in ("asmg", "asmg-ew") else {}

    @property
    def problem(self) -> SyntheticProblem:
        return PROBLEMS[self.config["problem"]]

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(f"f{i + 1}", _objective_loss, (ObjectiveValue,), primary="value", hv_reference=1e6)
                for i in range(2)]

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        start = start_point(self.config["dim"], self.config["seed"])
        (out_dir / "start.txt").write_text(" ".join(f"{v:.17g}" for v in start.tolist()) + "\n")
        return {"problem": self.problem.name, "equation": self.problem.equation, "pareto_set": self.problem.pareto_set}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        n = self.config["steps_per_epoch"]
        dummy = torch.zeros(n, 1, dtype=torch.float64)
        one = MultiTaskTensorDataset(dummy[:1], [dummy[:1, 0], dummy[:1, 0]])
        return {"train": MultiTaskTensorDataset(dummy, [dummy[:, 0], dummy[:, 0]]), "val": one, "test": one}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        heads = [SyntheticObjective(self.problem, int(n[1:]) - 1) for n in names]
        return MultiTaskModel(SyntheticPoint(start_point(self.config["dim"], self.config["seed"])), heads, names)
