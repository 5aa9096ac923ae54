"""A model architecture plug-in: a factory ``(bench, task_names, **options) -> MultiTaskModel``."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from mtlflow.benchmarks.base import Benchmark
from mtlflow.models.base import MultiTaskModel


def wide_mlp(bench: Benchmark, task_names: Sequence[str], width: int = 128, depth: int = 2) -> MultiTaskModel:
    """A trunk of ``depth`` ReLU layers of ``width`` units and a linear head per task, for tabular inputs."""
    in_features = bench.config["features"]  # the benchmarks it serves declare their input width
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return MultiTaskModel(nn.Sequential(*layers), [nn.Linear(in_features, 1) for _ in task_names], task_names)
