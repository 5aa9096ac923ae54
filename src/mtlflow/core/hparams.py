"""Hyper-parameters and configuration fields: a default, a help text and the constraint a value must satisfy.

Methods declare theirs as ``hparams = {name: HParam(...)}``; models with options (NORMAL) use the same
type, so one validation and one error message serve every entry point. Benchmarks declare their
preparation options as :class:`ConfigField` (an ``HParam`` without the type coercion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from mtlflow.core.errors import InvalidParameterError


@dataclass(frozen=True)
class ConfigField:
    """A setting: default, help text and the constraint it must satisfy (``requirement`` says it in words)."""

    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    requirement: str = ""

    def accepts(self, value: Any) -> bool:
        return self.check is None or self.check(value)


@dataclass(frozen=True)
class HParam(ConfigField):
    """A hyper-parameter: a setting whose value :meth:`coerce` also checks against a type."""

    kind: type | None = None

    def coerce(self, method: str, name: str, value: Any) -> Any:
        kind = self.kind or (type(self.default) if self.default is not None else None)
        if isinstance(value, bool) and kind is not bool:
            raise InvalidParameterError(f"{method}: hyper-parameter {name}={value!r} must be a number, not a boolean")
        if kind is float and isinstance(value, int):
            value = float(value)
        if kind is not None and value is not None and not isinstance(value, kind):
            raise InvalidParameterError(
                f"{method}: hyper-parameter {name}={value!r} must be of type {kind.__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidParameterError(f"{method}: hyper-parameter {name}={value!r} must be finite")
        if not self.accepts(value):
            raise InvalidParameterError(
                f"{method}: hyper-parameter {name}={value!r} is invalid; it must be {self.requirement}")
        return value


def positive(v: Any) -> bool:
    return v > 0


def non_negative(v: Any) -> bool:
    return v >= 0


def unit_interval(v: Any) -> bool:
    return 0 <= v <= 1
