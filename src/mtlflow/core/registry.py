"""Registries of named things (benchmarks, methods, model architectures): the built-ins, the plug-ins that
installed distributions declare as entry points, and import paths.

* Built-ins are discovered by :func:`discover`: every module of a package is imported once and every
  concrete subclass of a base class with a ``name`` attribute is registered under that name. One file per
  method (or benchmark) is therefore all it takes to add one; no central list to edit.
* Plug-ins come from the entry points of a group (``mtlflow.methods``: ``fancy = my_pkg.methods:Fancy``
  in the distribution's ``pyproject.toml``), registered under the entry point's name. A plug-in named like a
  built-in, or two distributions declaring the same name, make the registry refuse to load: which one a
  recorded run used would otherwise depend on what happens to be installed.
* A name with a colon is an import path ``module:attribute`` and needs no installation, only the module
  on ``sys.path``; the import path itself is the name, so a run records what rebuilds it.

:meth:`Registry.get` gives every registry the same one-line errors (:class:`UnknownNameError`,
:class:`InvalidParameterError`, exit code 2) for unknown names, plug-ins that fail to import and objects
of the wrong kind.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any, Generic, TypeVar

from mtlflow.core.errors import InvalidParameterError, UnknownNameError, UsageError

T = TypeVar("T")

#: what :meth:`Registry.origin` says for the built-ins (the distribution they come from)
BUILT_IN = "mtlflow"


def discover(package: ModuleType, base: type, skip: tuple[str, ...] = ()) -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_") or info.name in skip:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (issubclass(obj, base) and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
                    and isinstance(obj.__dict__.get("name"), str)):
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"two classes register the name {obj.name!r}: "
                                       f"{found[obj.name].__qualname__} and {obj.__qualname__}")
                found[obj.name] = obj
    return found


def is_import_path(name: str) -> bool:
    return ":" in name


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception raised by the user's code, on one line."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def import_object(path: str) -> Any:
    """The object an import path ``module:attribute`` (``attribute`` may be dotted) names."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise InvalidParameterError(f"import path {path!r} must look like module:attribute (my_pkg.tasks:Churn)")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything while it runs its top level
        raise InvalidParameterError(f"cannot import {path} ({one_line(exc)}); install the package or fix the "
                                    "path") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise InvalidParameterError(f"cannot import {path} ({module_name} has no attribute "
                                        f"{attribute!r}); fix the path")
        obj = getattr(obj, part)
    return obj


def described(obj: Any) -> str:
    """What an object is, for a refusal: "the function my_pkg.make", "the class my_pkg.Churn", "an int"."""
    if inspect.isclass(obj):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if inspect.ismodule(obj):
        return f"the module {obj.__name__}"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"the function {getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    article = "an" if type(obj).__name__[0] in "aeiou" else "a"
    return f"{article} {type(obj).__name__}"


def subclass_of(base: type, kind: str, defines: tuple[str, ...]) -> Callable[[Any, str], type]:
    """The check of class plug-ins: a subclass of ``base`` that defines (or overrides) each of ``defines``,
    returned with ``name`` set to the name it is registered under (a subclass of it when its own ``name``
    differs), since that name is what run directories and manifests record to rebuild it."""
    def accept(obj: Any, name: str) -> type:
        if not (inspect.isclass(obj) and issubclass(obj, base) and obj is not base):
            raise InvalidParameterError(f"{kind} {name} is {described(obj)}, not a subclass of "
                                        f"{base.__module__}.{base.__qualname__}")
        missing = [a for a in defines if getattr(obj, a, None) is getattr(base, a, None)]
        if missing or inspect.isabstract(obj):
            missing += sorted(getattr(obj, "__abstractmethods__", ()))
            raise InvalidParameterError(f"{kind} {name} ({described(obj)}) does not define {', '.join(missing)}; "
                                        "see docs/guides/plugins.md")
        if obj.__dict__.get("name") == name:
            return obj
        return type(obj.__name__, (obj,), {"name": name, "__module__": obj.__module__,
                                           "__qualname__": obj.__qualname__, "__doc__": obj.__doc__})
    return accept


class Registry(Generic[T]):
    """The ``kind``s (benchmarks, methods, ...) known by name: ``builtins()`` (called once, when first
    needed), the entry points of ``group``, and import paths. ``accept(obj, name)`` checks a plug-in and
    returns what the registry hands out for it (raising InvalidParameterError saying what is wrong)."""

    def __init__(self, kind: str, group: str, builtins: Callable[[], Mapping[str, T]],
                 accept: Callable[[Any, str], T]):
        self.kind, self.group = kind, group
        self._builtins_of, self._accept = builtins, accept
        self._builtins: Mapping[str, T] | None = None
        self._entry_points: dict[str, EntryPoint] | None = None
        self._plugins: dict[str, T] = {}  # loaded once, so that a plug-in class stays one class

    def builtins(self) -> Mapping[str, T]:
        if self._builtins is None:
            self._builtins = self._builtins_of()
        return self._builtins

    def entry_points(self) -> dict[str, EntryPoint]:
        """The group's entry points by name (not loaded), refusing names declared twice."""
        if self._entry_points is None:
            found: dict[str, EntryPoint] = {}
            for ep in entry_points(group=self.group):
                if ep.name in self.builtins():
                    raise UsageError(f"two {self.kind}s are named {ep.name!r}: {self._builtin_origin(ep.name)} "
                                     f"and {self._entry_point_origin(ep)}; "
                                     f"rename the entry point or uninstall {distribution(ep)}")
                if ep.name in found and found[ep.name].value != ep.value:
                    raise UsageError(f"two {self.kind}s are named {ep.name!r}: "
                                     f"{self._entry_point_origin(found[ep.name])} and "
                                     f"{self._entry_point_origin(ep)}; uninstall one")
                found[ep.name] = ep
            self._entry_points = found
        return self._entry_points

    def names(self) -> list[str]:
        """The built-ins and the installed plug-ins, sorted (import paths are not listed: any may be given)."""
        return sorted({*self.builtins(), *self.entry_points()})

    def get(self, name: str) -> T:
        self.entry_points()  # a plug-in named like a built-in is refused even when the built-in is asked for
        if name in self.builtins():
            return self.builtins()[name]
        if name not in self._plugins:
            if is_import_path(name):
                obj = import_object(name)
            elif name in self.entry_points():
                obj = self._load(self.entry_points()[name])
            else:
                raise UnknownNameError(self.kind, name, self.names())
            self._plugins[name] = self._accept(obj, name)
        return self._plugins[name]

    def origin(self, name: str) -> str:
        """Where ``name`` comes from: "mtlflow" for the built-ins, else the plug-in's distribution."""
        if name in self.builtins():
            return BUILT_IN
        if name in self.entry_points():
            return distribution(self.entry_points()[name])
        return name.partition(":")[0]  # an import path: its module

    def _load(self, ep: EntryPoint) -> Any:
        try:
            return ep.load()
        except Exception as exc:  # the plug-in's module may raise anything while it runs its top level
            raise InvalidParameterError(f"cannot import {self._entry_point_origin(ep)} ({one_line(exc)}); "
                                        f"reinstall {distribution(ep)} or fix its entry point") from None

    def _builtin_origin(self, name: str) -> str:
        obj = self.builtins()[name]
        where = f"{obj.__module__}:{obj.__qualname__}" if inspect.isclass(obj) else repr(name)
        return f"the built-in {where} of {BUILT_IN}"

    def _entry_point_origin(self, ep: EntryPoint) -> str:
        return f"entry point {ep.name} = {ep.value} of {distribution(ep)}"


def distribution(ep: EntryPoint) -> str:
    """The name of the distribution that declares ``ep``."""
    return ep.dist.name if ep.dist is not None else "an unknown distribution"
