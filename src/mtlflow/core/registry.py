"""Discovery of registered classes: every module of a package is imported once and every concrete
subclass of a base class with a ``name`` attribute is registered under that name.

One file per method (or benchmark) is therefore all it takes to add one; no central list to edit.
:func:`lookup` gives every registry the same error for an unknown name.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import Mapping, TypeVar

from mtlflow.core.errors import UnknownNameError

T = TypeVar("T", bound=type)


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


def lookup(registry: Mapping[str, T], kind: str, name: str) -> T:
    """``registry[name]``, or an UnknownNameError naming ``kind`` and listing the valid names."""
    try:
        return registry[name]
    except KeyError:
        raise UnknownNameError(kind, name, sorted(registry)) from None
