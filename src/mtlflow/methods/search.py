"""The search space of each method for ``mtlflow tune``: the shared training settings every method is tuned
over (so that LS is tuned exactly as hard as the rest) plus the method's own hyper-parameters that declare a
:class:`~mtlflow.core.hparams.SearchRange` (each cites the paper's grid or recommendation beside the range).

A params file may replace any range (``search_space: {lr: {scale: log, low: 1e-4, high: 3e-3}}``) or drop one
from the search (``{name: null}``: the default is used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange

# Training options of every run (RunConfig fields), tuned for every method alike. Kirchdorfer et al.
# (arXiv 2408.07985) find the learning rate matters far more than weight decay; Gama & Grassi 2025 (arXiv
# 2505.10347) tune both on the grid lr {1e-4, 5e-4, 1e-3, 5e-3} x wd {0, 1e-5, 1e-4}; Kurin et al. 2022
# use wd 1e-3 for LS on CelebA.
SHARED_SPACE: dict[str, SearchRange] = {
    "lr": SearchRange("log", 1e-4, 1e-2, source="Gama & Grassi 2025 grid 1e-4..5e-3, widened to 1e-2"),
    "weight_decay": SearchRange("categorical", choices=(0.0, 1e-5, 1e-4, 1e-3),
                                source="Gama & Grassi 2025 {0, 1e-5, 1e-4}; Kurin et al. 2022 1e-3"),
}


def method_space(method_class: Any) -> dict[str, SearchRange]:
    """The method's own tunable hyper-parameters: those whose ``HParam`` declares a ``search`` range."""
    return {name: spec.search for name, spec in getattr(method_class, "hparams", {}).items()
            if getattr(spec, "search", None) is not None}


def search_space(method_class: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, SearchRange]:
    """The shared space and the method's space, with ``overrides`` applied (a mapping to a range, a
    ``SearchRange`` or ``None`` to leave that setting at its default)."""
    space = {**SHARED_SPACE, **method_space(method_class)}
    valid = set(space) | set(getattr(method_class, "hparams", {}))
    for name, value in (overrides or {}).items():
        if name not in valid:
            raise InvalidParameterError(f"search space: {name!r} is neither a shared setting nor a hyper-parameter "
                                        f"of this method; valid: {', '.join(sorted(valid))}")
        if value is None:
            space.pop(name, None)
        else:
            space[name] = value if isinstance(value, SearchRange) else SearchRange.from_mapping(name, value)
    return space
