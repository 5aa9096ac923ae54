"""Teleportation wrappers around any base method: ``--teleport cost`` (COST, Zhou et al., NeurIPS 2025).

* :mod:`.triggers` -- when (Sec. 4.1: Eqs. 3, 4, Def. 1);
* :mod:`.objective` -- how (Eqs. 5–11: L_t, L_g, R, the adapter optimisation);
* :mod:`.adapters` -- PEFT LoRA/LoHa/OFT on the trunk, merge and unload;
* :mod:`.htr` -- historical trajectory reuse (Eqs. 12–13);
* :mod:`.callback` -- the trainer callback tying them together (Alg. 1) and its telemetry;
* :mod:`.ablation` -- ``mtlflow ablate cost`` (Tables 4, 7, 8); :mod:`.toy` -- LS + COST on the toy
  problem (Fig. 6); :mod:`.overhead` -- COST's cost per epoch (``mtlflow bench``).

PEFT is imported only when a teleport run starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.teleport.adapters import check_wrappable
from mtlflow.teleport.options import CostOptions

#: the teleportation wrappers (``RunConfig.teleport``)
TELEPORTS = ("cost",)


def validate(teleport: str | None, options: Mapping[str, Any] | None) -> None:
    """Reject an unknown wrapper or invalid options with one line (before any data work)."""
    if teleport is None or teleport == "":
        if options:
            raise InvalidParameterError("teleport_options given without a teleport; add --teleport cost or drop them")
        return
    if teleport not in TELEPORTS:
        raise InvalidParameterError(f"unknown teleport {teleport!r}; valid teleports: {', '.join(TELEPORTS)}")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidParameterError(f"teleport_options must be a mapping, got {options!r}")
    CostOptions.from_mapping(options)


def check_benchmark(bench, task_names: list[str], teleport: str | None, options: Mapping[str, Any] | None) -> None:
    """Reject a wrapper the benchmark's model cannot take (no trunk layers, OFT on Conv2d) before any data work."""
    if not teleport:
        return
    validate(teleport, options)

    check_wrappable(bench.make_model(task_names), len(task_names), CostOptions.from_mapping(options).resolved().adapter)


def build(teleport: str, options: Mapping[str, Any] | None):
    """The callback of ``teleport`` with ``options``."""
    validate(teleport, options)
    # teleport.callback imports this package: at module level the two would import each other
    from mtlflow.teleport.callback import CostTeleport  # noqa: PLC0415

    return CostTeleport(CostOptions.from_mapping(options))
