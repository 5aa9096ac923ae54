"""Which epoch's metrics a run reports: the last epoch, or the mean of the last K.

The rule never looks at the test split to choose an epoch.
"""

from __future__ import annotations

import statistics
from typing import Any

from mtlflow.core.errors import InvalidParameterError


def parse_selection(rule: str) -> tuple[str, int]:
    """``"last"`` or ``"last-k:K"`` (mean of the last K epochs)."""
    if rule == "last":
        return "last", 1
    if rule.startswith("last-k:"):
        try:
            k = int(rule.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "last-k", k
    raise InvalidParameterError(f"selection rule {rule!r} is invalid; use 'last' or 'last-k:K' with K >= 1")


def select_final(history: list[dict[str, Any]], rule: str) -> dict[str, dict[str, dict[str, float]]]:
    """Apply the selection rule to the per-epoch metrics of every evaluated split.

    The rule never looks at the test split to choose an epoch: it is either the last epoch or the
    mean over the last K epochs.
    """
    _, k = parse_selection(rule)
    window = history[-k:]
    final: dict[str, dict[str, dict[str, float]]] = {}
    for split in window[-1]["splits"]:
        final[split] = {}
        for task, values in window[-1]["splits"][split].items():
            final[split][task] = {m: statistics.fmean(e["splits"][split][task][m] for e in window) for m in values}
    return final
