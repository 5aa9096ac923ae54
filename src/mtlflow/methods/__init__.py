"""Method registry.

>>> from mtlflow import methods
>>> "fairgrad" in methods.available()
True
>>> m = methods.build("fairgrad", n_tasks=2, alpha=2.0)

Every method is one file citing its paper and equations; see :mod:`mtlflow.methods.base` for the
API (``combine(grads, losses)`` for gradient methods, ``weights(losses)`` for loss weighting, and
the trainer hooks). Besides the built-ins, a name may be a plug-in's entry point (group
``mtlflow.methods``) or an import path ``my_pkg:MyMethod`` (docs/guides/plugins.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from mtlflow.core.hparams import HParam
from mtlflow.core.registry import Registry, discover, subclass_of
from mtlflow.methods.base import GradientMethod, GradInput, GramianWeighting, LossWeighting, Method, StepContext
from mtlflow.methods.search import search_space

__all__ = ["Method", "LossWeighting", "GradientMethod", "GramianWeighting", "GradInput", "HParam",
           "StepContext", "MethodInfo", "available", "get", "build", "info", "origin"]


def _builtins() -> dict[str, type[Method]]:
    """Every method module in this package (one file per method, no central list)."""
    # base.py and solvers.py need no skip: discover keeps only the concrete, named Method classes a module defines
    return discover(sys.modules[__name__], Method)


REGISTRY: Registry[type[Method]] = Registry("method", "mtlflow.methods", _builtins,
                                            subclass_of(Method, "method", ("family", "cost", "paper")))


@dataclass(frozen=True)
class MethodInfo:
    name: str
    family: str
    cost: str
    paper: str
    equations: str
    hparams: dict[str, tuple[Any, str]]
    #: what ``mtlflow tune`` searches: the shared training settings and the method's own ranges
    search: dict[str, dict[str, Any]]


#: names of the built-in and installed plug-in methods, sorted
available = REGISTRY.names
#: the method class of a name: built-in, entry point or import path ``module:Class``
get = REGISTRY.get
#: where a method comes from: "mtlflow" for a built-in, else the plug-in's distribution
origin = REGISTRY.origin


def build(name: str, n_tasks: int, seed: int = 0, /, **hparams: Any) -> Method:
    """Instantiate method ``name`` for ``n_tasks`` tasks, validating ``hparams``; ``seed`` (the run seed)
    seeds the method's own generator, if it draws random numbers. ``seed`` is positional so that a
    hyper-parameter called "seed" is refused as unknown rather than taken for the run's seed."""
    method = get(name)(n_tasks, **hparams)
    if method.rng is not None:
        method.rng.reseed(seed)
    return method


def info(name: str) -> MethodInfo:
    cls = get(name)
    return MethodInfo(cls.name, cls.family, cls.cost, cls.paper, cls.equations,
                      {k: (h.default, h.help) for k, h in cls.hparams.items()},
                      {k: r.as_dict() for k, r in search_space(cls).items()})
