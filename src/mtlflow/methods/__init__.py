"""Method registry.

>>> from mtlflow import methods
>>> "fairgrad" in methods.available()
True
>>> m = methods.build("fairgrad", n_tasks=2, alpha=2.0)

Every method is one file citing its paper and equations; see :mod:`mtlflow.methods.base` for the
API (``combine(grads, losses)`` for gradient methods, ``weights(losses)`` for loss weighting, and
the trainer hooks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtlflow.core.hparams import HParam
from mtlflow.core.registry import discover, lookup
from mtlflow.methods.base import GradientMethod, GradInput, GramianWeighting, LossWeighting, Method, StepContext

__all__ = ["Method", "LossWeighting", "GradientMethod", "GramianWeighting", "GradInput", "HParam",
           "StepContext", "MethodInfo", "available", "get", "build", "info"]

_REGISTRY: dict[str, type[Method]] | None = None


def _registry() -> dict[str, type[Method]]:
    """Every method module in this package, discovered once (one file per method, no central list)."""
    global _REGISTRY
    if _REGISTRY is None:
        import mtlflow.methods as package

        _REGISTRY = discover(package, Method, skip=("base", "solvers"))
    return _REGISTRY


@dataclass(frozen=True)
class MethodInfo:
    name: str
    family: str
    cost: str
    paper: str
    equations: str
    hparams: dict[str, tuple[Any, str]]


def available() -> list[str]:
    """Names of all registered methods, sorted."""
    return sorted(_registry())


def get(name: str) -> type[Method]:
    return lookup(_registry(), "method", name)


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
                      {k: (h.default, h.help) for k, h in cls.hparams.items()})
