"""What every configuration model of mtlflow shares: fields with one name, type, default and help text,
construction from a mapping of field names (``params.yaml``, pipeline parameters, JSON), the type
check, and the JSON schema.

A model is a dataclass deriving from :class:`ConfigModel` whose fields are made with :func:`option`;
its ``validate()`` runs at construction, so every instance is valid.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from mtlflow.core.errors import InvalidParameterError


def option(default: Any = None, help: str = "", *, factory: Any = None, flag: str | None = None) -> Any:
    """A configuration field with its help text (and its command-line flag when it is not
    ``--<name-with-dashes>``)."""
    metadata = {"help": help, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


class ConfigModel:
    """Base of the configuration dataclasses (:class:`~mtlflow.config.run.RunConfig`, the data and the
    pipeline configurations)."""

    #: what the model configures, for error messages and the schema ("training options", ...)
    subject: typing.ClassVar[str] = "options"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self.check_types()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default (a fresh copy of mutable ones), without validating anything."""
        out = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            out[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str | None = None) -> Any:
        """A validated instance from a mapping of field names. Unknown names are rejected with the valid
        ones; integral values of float fields are converted (YAML and protobuf structs do not keep the
        difference)."""
        names = cls.field_names()
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise InvalidParameterError(f"unknown {where or cls.subject}: {', '.join(unknown)}; valid: "
                                        f"{', '.join(names)}")
        hints = typing.get_type_hints(cls)
        converted = {}
        for name, value in values.items():
            if float in typing.get_args(hints[name]) + (hints[name],) and isinstance(value, int) \
                    and not isinstance(value, bool):
                value = float(value)
            converted[name] = value
        return cls(**converted)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def check_types(self) -> None:
        """Every field holds a value of its declared type, or the error names the field and the type."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not _has_type(value, hints[f.name]):
                hint = hints[f.name]
                scalar_for_list = typing.get_origin(hint) is list and not isinstance(value, list)
                fix = f"; write e.g. [{value}]" if scalar_for_list else ""
                raise InvalidParameterError(f"{f.name} must be {_describe_type(hint)}, got {value!r}{fix}")

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON schema of the model (types and defaults from pydantic, help texts as descriptions)."""
        # config.model is on the import path of `mtlflow --help`; pydantic only serves this schema dump here
        from pydantic import TypeAdapter  # noqa: PLC0415

        schema = TypeAdapter(cls).json_schema()
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            schema["properties"][f.name]["description"] = f.metadata["help"]
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        schema["description"] = f"mtlflow {cls.__name__}: {summary}"
        schema["additionalProperties"] = False
        return schema


def _has_type(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if origin is list:
        return isinstance(value, list) and all(_has_type(v, args[0]) for v in value)
    return isinstance(value, hint)


def _describe_type(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict:
        return "a mapping of names to values"
    if typing.get_origin(hint) is list:
        return f"a list of {_describe_type(args[0]).removeprefix('an ').removeprefix('a ')}s" if args else "a list"
    if args:
        return " or ".join(_describe_type(a) for a in args)
    return names.get(hint, getattr(hint, "__name__", str(hint)))
