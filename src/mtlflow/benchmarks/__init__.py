"""Benchmark registry: ``available()`` lists the names, ``get(name)`` returns the class.

>>> from mtlflow import benchmarks
>>> bench = benchmarks.build("multimnist", n_train=2000)
>>> bench.task_names
['left', 'right']
"""

from __future__ import annotations

from typing import Any

from mtlflow.benchmarks.base import Benchmark, BenchmarkData, MultiTaskModel, TaskSpec
from mtlflow.benchmarks.multimnist import MultiMNIST
from mtlflow.benchmarks.toy import Toy
from mtlflow.errors import UnknownNameError

_REGISTRY: dict[str, type[Benchmark]] = {cls.name: cls for cls in (MultiMNIST, Toy)}

__all__ = ["Benchmark", "BenchmarkData", "MultiTaskModel", "TaskSpec", "available", "get", "build"]


def available() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> type[Benchmark]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError("benchmark", name, available()) from None


def build(name: str, **config: Any) -> Benchmark:
    return get(name)(**config)
