"""Benchmark registry: ``available()`` lists the names, ``get(name)`` returns the class.

Besides the built-in benchmarks, a name may be a plug-in's entry point (group ``mtlflow.benchmarks``) or an
import path ``my_pkg.tasks:Churn`` (see :mod:`mtlflow.core.registry` and docs/guides/plugins.md).

>>> from mtlflow import benchmarks
>>> bench = benchmarks.build("multimnist", n_train=2000)
>>> bench.task_names
['left', 'right']
"""

from __future__ import annotations

import sys
from typing import Any

from mtlflow.benchmarks.base import Benchmark, BenchmarkData
from mtlflow.core.registry import Registry, discover, subclass_of
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel


def _builtins() -> dict[str, type[Benchmark]]:
    """Every benchmark module in this package (one file per benchmark)."""
    return discover(sys.modules[__name__], Benchmark, skip=("base",))


#: what a plug-in benchmark must write (docs/guides/plugins.md)
PLUGIN_MUST_DEFINE = ("description", "tasks", "write_data", "read_splits", "make_model")
REGISTRY: Registry[type[Benchmark]] = Registry("benchmark", "mtlflow.benchmarks", _builtins,
                                               subclass_of(Benchmark, "benchmark", PLUGIN_MUST_DEFINE))

__all__ = ["Benchmark", "BenchmarkData", "MultiTaskModel", "TaskSpec", "available", "get", "build", "origin"]


#: the built-in and installed plug-in benchmarks, sorted
available = REGISTRY.names
#: the benchmark class of a name: built-in, entry point or import path ``module:Class``
get = REGISTRY.get
#: where a benchmark comes from: "mtlflow" for a built-in, else the plug-in's distribution
origin = REGISTRY.origin


def build(name: str, **config: Any) -> Benchmark:
    return get(name)(**config)
