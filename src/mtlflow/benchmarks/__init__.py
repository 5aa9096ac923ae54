"""Benchmark registry: ``available()`` lists the names, ``get(name)`` returns the class.

>>> from mtlflow import benchmarks
>>> bench = benchmarks.build("multimnist", n_train=2000)
>>> bench.task_names
['left', 'right']
"""

from __future__ import annotations

from typing import Any

from mtlflow.benchmarks.base import Benchmark, BenchmarkData
from mtlflow.core.registry import discover, lookup
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel

_REGISTRY: dict[str, type[Benchmark]] | None = None


def _registry() -> dict[str, type[Benchmark]]:
    """Every benchmark module in this package, discovered once (one file per benchmark)."""
    global _REGISTRY
    if _REGISTRY is None:
        import mtlflow.benchmarks as package

        _REGISTRY = discover(package, Benchmark, skip=("base",))
    return _REGISTRY

__all__ = ["Benchmark", "BenchmarkData", "MultiTaskModel", "TaskSpec", "available", "get", "build"]


def available() -> list[str]:
    return sorted(_registry())


def get(name: str) -> type[Benchmark]:
    return lookup(_registry(), "benchmark", name)


def build(name: str, **config: Any) -> Benchmark:
    return get(name)(**config)
