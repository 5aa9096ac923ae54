"""Hyper-parameters and configuration fields: a default, a help text and the constraint a value must satisfy.

Methods declare theirs as ``hparams = {name: HParam(...)}``; models with options (NORMAL) use the same
type, so one validation and one error message serve every entry point. Benchmarks declare their
preparation options as :class:`ConfigField` (an ``HParam`` without the type coercion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mtlflow.core.errors import InvalidParameterError


@dataclass(frozen=True)
class Constraint:
    """A test a value must pass and the same test in words, for the error message (``"> 0"``)."""

    test: Callable[[Any], bool]
    requirement: str

    def __call__(self, value: Any) -> bool:
        return bool(self.test(value))


def one_of(*choices: Any) -> Constraint:
    """The value must be one of ``choices``; the requirement lists them ("'a', 'b' or 'c'")."""
    words = [repr(c) if isinstance(c, str) else str(c) for c in choices]
    listed = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    return Constraint(lambda v: v in choices, listed)


positive = Constraint(lambda v: v > 0, "> 0")
non_negative = Constraint(lambda v: v >= 0, ">= 0")
unit_interval = Constraint(lambda v: 0 <= v <= 1, "in [0, 1]")


@dataclass(frozen=True)
class ConfigField:
    """A setting: default, help text and the constraint it must satisfy. ``check`` is a
    :class:`Constraint` (which says its requirement itself) or a plain predicate with ``requirement``
    saying it in words."""

    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    requirement: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.check, Constraint) and not self.requirement:
            object.__setattr__(self, "requirement", self.check.requirement)

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



def resolve_architecture_options(owner: str, specs: Mapping[str, HParam],
                                 options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options of ``owner`` (an architecture) with their defaults, each coerced and checked by its
    :class:`HParam`; an unknown or invalid option is a one-line error naming it."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(specs))
    if unknown:
        raise InvalidParameterError(f"{owner}: unknown architecture option(s) {', '.join(unknown)}; valid: "
                                    f"{', '.join(sorted(specs)) or 'none'}")
    try:
        return {key: spec.coerce(owner, key, options.get(key, spec.default)) for key, spec in specs.items()}
    except InvalidParameterError as exc:  # HParam words it for methods
        raise InvalidParameterError(str(exc).replace("hyper-parameter", "architecture option", 1)) from None
