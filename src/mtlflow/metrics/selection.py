"""Which epoch's metrics a run reports: the last epoch, the mean of the last K, or the epoch of the best
validation score; and that score, which early stopping also watches.

The rules never look at the test split to choose an epoch.

**The validation score** of an epoch (:func:`validation_score`, lower is better) is the mean over the
trained tasks of the relative change of the primary metric's error (:func:`mtlflow.metrics.task.metric_error`)
on the val split against the first epoch's: ``mean_t (e_t - e_t¹) / |e_t¹|`` -- a Δm% with the first
epoch as reference, so that a task measured in grams weighs as much as one measured in accuracy. A first
error of 0 divides by 1 (the change itself); a task whose primary metric is undefined on the val split (NaN:
a ROC-AUC on one class) is scored on its validation loss instead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.task import metric_error

#: the rule that picks the epoch of the best validation score
BEST_VAL = "best-val"


def parse_selection(rule: str) -> tuple[str, int]:
    """``"last"``, ``"last-k:K"`` (mean of the last K epochs) or ``"best-val"`` (the epoch of the best
    validation score); returns the rule's kind and how many trailing epochs it averages (1 for best-val)."""
    if rule in ("last", BEST_VAL):
        return rule, 1
    if rule.startswith("last-k:"):
        try:
            k = int(rule.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "last-k", k
    raise InvalidParameterError(f"selection rule {rule!r} is invalid; use 'last', 'last-k:K' with K >= 1 or "
                                f"'{BEST_VAL}'")


def validation_score(val: Mapping[str, Mapping[str, float]], first_val: Mapping[str, Mapping[str, float]],
                     primary: Mapping[str, str], specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> float:
    """The validation score of an epoch's ``val`` metrics against the first epoch's ``first_val`` (see the
    module's docstring); lower is better, 0 at the first epoch."""
    terms = []
    for task, name in primary.items():
        spec = specs[task][name]
        error = metric_error(val[task][name], spec["higher_is_better"], spec["unit_interval"])
        first = metric_error(first_val[task][name], spec["higher_is_better"], spec["unit_interval"])
        if not (math.isfinite(error) and math.isfinite(first)):
            error, first = val[task]["loss"], first_val[task]["loss"]
        terms.append((error - first) / (abs(first) if first != 0 else 1.0))
    return statistics.fmean(terms)


def best_epoch_index(history: Sequence[Mapping[str, Any]]) -> int:
    """Index in ``history`` of the epoch with the lowest ``val_score`` (the earliest of equal ones)."""
    scores = [e["val_score"] for e in history]
    return min(range(len(scores)), key=lambda i: (scores[i], i))


def select_final(history: list[dict[str, Any]], rule: str) -> dict[str, dict[str, dict[str, float]]]:
    """Apply the selection rule to the per-epoch metrics of every evaluated split.

    The rule never looks at the test split to choose an epoch: it is the last epoch, the mean over the last
    K epochs, or the epoch of the best validation score (``val_score``, written by the trainer).
    """
    kind, k = parse_selection(rule)
    window = [history[best_epoch_index(history)]] if kind == BEST_VAL else history[-k:]
    final: dict[str, dict[str, dict[str, float]]] = {}
    for split in window[-1]["splits"]:
        final[split] = {}
        for task, values in window[-1]["splits"][split].items():
            final[split][task] = {m: statistics.fmean(e["splits"][split][task][m] for e in window) for m in values}
    return final


#: the fewest validation rows on which the validation score can rank epochs (the threshold below which
#: ``mtlflow tune`` warns that a split cannot rank configurations is the same rule). A proportion's 95 % binomial
#: interval on n rows is 1.96·sqrt(p(1 - p) / n): up to ±9.8 points at n = 100 -- wider than the change of the
#: score between epochs once a run has learned anything -- so on fewer rows the "best" epoch, and whether the
#: curve stopped improving, is chosen by which rows landed in the split rather than by the model
MIN_VAL_ROWS_TO_RANK_EPOCHS = 100


def val_split_too_small(val_rows: int | None) -> str:
    """'' when a validation split of ``val_rows`` rows can rank epochs (or its size is unknown), else the warning a
    run reports instead of calling itself converged (:data:`MIN_VAL_ROWS_TO_RANK_EPOCHS`)."""
    if val_rows is None or val_rows >= MIN_VAL_ROWS_TO_RANK_EPOCHS:
        return ""
    return (f"validation split too small to select epochs ({val_rows} rows, fewer than "
            f"{MIN_VAL_ROWS_TO_RANK_EPOCHS}): its best epoch and its convergence are noise; give the validation "
            "split more rows (a spec's split:)")
