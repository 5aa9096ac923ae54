"""Hyper-parameters and configuration fields: a default, a help text and the constraint a value must satisfy.

Methods declare theirs as ``hparams = {name: HParam(...)}``; models with options (NORMAL) use the same
type, so one validation and one error message serve every entry point. Benchmarks declare their
preparation options as :class:`ConfigField` (an ``HParam`` without the type coercion).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


SCALES = ("log", "linear", "int", "categorical")


@dataclass(frozen=True)
class SearchRange:
    """Where a tuner may look for a setting: ``[low, high]`` on a ``log``, ``linear`` or ``int`` scale, or
    one of ``choices`` (``categorical``); ``source`` cites the paper's grid or recommendation it comes from."""

    scale: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise InvalidParameterError(f"search range: scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        if self.scale == "categorical":
            if not self.choices:
                raise InvalidParameterError("search range: a categorical range needs at least one choice")
            return
        if self.low is None or self.high is None or not self.low < self.high:
            raise InvalidParameterError(f"search range: needs low < high, got [{self.low}, {self.high}]")
        if self.scale == "log" and self.low <= 0:
            raise InvalidParameterError(f"search range: a log scale needs low > 0, got {self.low}")

    def describe(self) -> str:
        """The range in words, as ``mtlflow methods`` prints it (``log [1e-04, 1e-02]``)."""
        if self.scale == "categorical":
            return "one of {" + ", ".join(map(str, self.choices)) + "}"
        return f"{self.scale} [{self.low:g}, {self.high:g}]"

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"scale": self.scale, "range": self.describe(), "source": self.source}
        if self.scale == "categorical":
            data["choices"] = list(self.choices)
        else:
            data.update(low=self.low, high=self.high)
        return data

    @classmethod
    def from_mapping(cls, owner: str, data: Mapping[str, Any]) -> SearchRange:
        """A range from a params file (``{scale: log, low: 1e-4, high: 1e-2}`` or ``{choices: [...]}``)."""
        known = {"scale", "low", "high", "choices", "source", "range"}  # "range": as_dict's words, ignored
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidParameterError(f"search range of {owner}: unknown key(s) {', '.join(unknown)}; "
                                        f"valid: {', '.join(sorted(known))}")
        scale = data.get("scale", "categorical" if "choices" in data else None)
        if scale is None:
            raise InvalidParameterError(f"search range of {owner}: give a scale (log, linear, int) with low and "
                                        "high, or choices")
        try:
            return cls(scale=scale, low=data.get("low"), high=data.get("high"),
                       choices=tuple(data.get("choices") or ()), source=str(data.get("source", "params file")))
        except InvalidParameterError as exc:
            raise InvalidParameterError(str(exc).replace("search range", f"search range of {owner}", 1)) from None


@dataclass(frozen=True)
class HParam(ConfigField):
    """A hyper-parameter: a setting whose value :meth:`coerce` also checks against a type; ``search`` is the
    range a tuner explores (``None``: not tuned, the default is used)."""

    kind: type | None = None
    search: SearchRange | None = None

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
