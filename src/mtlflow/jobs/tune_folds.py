"""Selection by k-fold cross-validation over train + val (:mod:`mtlflow.jobs.tune`), for a validation split too
small to rank configurations.

**The rule** (``selection="auto"``, the default): a study selects by k-fold cross-validation when the task with
the fewest labelled validation rows (of the tasks tuned; a spec's manifest counts them per task, other benchmarks
count the split's rows) has fewer than :data:`MIN_VALIDATION_ROWS`, else on the validation split
(``"holdout"``). Issue 37: on a 944-row survey the 94-row validation split chose the learning rate of the worst
test AUC. ``selection="kfold"`` or ``"holdout"`` forces either.

**The folds** re-partition the prepared train + val rows (the test split is never part of them; the prepared
features keep their training-split encoding): every row gets a key, the 64-bit digest of its content digest
(``row_hashes.npz``) salted with the search seed -- of its split and position where the data has no row hashes --
and the rows in key order are dealt round-robin into ``k`` folds, so fold sizes differ by at most one row and a
row's fold does not depend on the order of the rows in the file. Fold ``i`` is the validation split of a training
run on the other ``k - 1`` folds. The folds are the same for every trial and every study of a tuning run (common
folds, so trials and methods are ranked on the same rows).

**A trial** trains one run per fold (``<trial>/fold-<i>/``); its value is the mean over folds of each fold's
validation score (each against the untrained model's metrics on that fold). The pruner judges the first fold's
epochs only -- fold 0 is the same rows for every trial, so its intermediate values compare like with like -- and
a trial pruned there runs no other fold; the later folds run to the end. A trial's steps are every fold's
recorded steps, so the budget counts every fold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mtlflow.benchmarks import row_hashes
from mtlflow.benchmarks._graphs import GraphDataset
from mtlflow.benchmarks.base import BenchmarkData, MultiTaskTensorDataset
from mtlflow.benchmarks.spec import BatchedTensorDataset
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs.tune_trial import COMPLETE, DIVERGED, Scorer, TrialOutcome, recorded_steps, run_trial

if TYPE_CHECKING:  # pragma: no cover
    import optuna

SELECTIONS = ("auto", "kfold", "holdout")
DEFAULT_FOLDS = 5
#: a validation split whose smallest task has fewer labelled rows than this cannot rank configurations
MIN_VALIDATION_ROWS = 100
FOLD_PREFIX = "fold-"
#: the datasets re-partitioned by concatenating and indexing their tensors (exact types: a subclass such as a
#: spec's image rows, gathered by index with a per-split augmentation, is built differently)
_TENSOR_DATASETS = (MultiTaskTensorDataset, BatchedTensorDataset)


def validation_rows(data: BenchmarkData, tasks: Sequence[str]) -> dict[str, int]:
    """The labelled validation rows of each task (the manifest's counts where it has them, else the split's rows)."""
    counts = data.manifest.get("label_counts") or {}
    rows = len(data.splits["val"])
    return {t: int(counts[t]["val"]) if t in counts else rows for t in tasks}


def check_selection(selection: str, folds: int) -> None:
    """Refuse an unknown selection or fewer than two folds (before any data is read)."""
    if selection not in SELECTIONS:
        raise InvalidParameterError(f"unknown selection {selection!r}; valid: {', '.join(SELECTIONS)}")
    if folds < 2:
        raise InvalidParameterError(f"--folds {folds}: k-fold selection needs at least 2 folds")


def resolve_selection(selection: str, folds: int, val_rows: Mapping[str, int]) -> dict[str, Any]:
    """The selection a tuning run uses: ``{"mode": "kfold" | "holdout", "folds", "rule", "val_rows", ...}``."""
    check_selection(selection, folds)
    smallest = min(val_rows.values())
    small = smallest < MIN_VALIDATION_ROWS
    mode = ("kfold" if small else "holdout") if selection == "auto" else selection
    return {"requested": selection, "mode": mode, "folds": folds if mode == "kfold" else None,
            "val_rows": dict(val_rows), "min_validation_rows": MIN_VALIDATION_ROWS, "small_validation": small,
            "rule": f"auto: k-fold cross-validation over train + val when the task with the fewest labelled "
                    f"validation rows has fewer than {MIN_VALIDATION_ROWS}, else the validation split; "
                    "the test split is never used"}


def row_keys(data_dir: Path | None, data: BenchmarkData, seed: int) -> np.ndarray:
    """Each train + val row's fold key (train rows first, then val, each in split order): its content digest
    salted with ``seed``, or the salted digest of (split, position) where the data has no row hashes."""
    stored = row_hashes.read(data_dir) if data_dir is not None else None
    sizes = {s: len(data.splits[s]) for s in ("train", "val")}
    if stored is not None and all(len(stored[s]) == n for s, n in sizes.items()):
        identities = [int(h).to_bytes(8, "little") for s in sizes for h in stored[s]]
    else:
        identities = [f"{s}:{i}".encode() for s, n in sizes.items() for i in range(n)]
    return row_hashes.digests(identities, salt=seed)


def assign_folds(keys: np.ndarray, folds: int) -> np.ndarray:
    """Each row's fold: the rows in key order (ties by position) dealt round-robin into ``folds`` folds."""
    if len(keys) < folds:
        raise InvalidParameterError(f"k-fold selection with {folds} folds needs at least {folds} train + val rows "
                                    f"(there are {len(keys)}); pass --folds {max(2, len(keys))} or less, or "
                                    "--selection holdout")
    order = np.argsort(keys, kind="stable")
    assignment = np.empty(len(keys), dtype=np.int64)
    assignment[order] = np.arange(len(keys)) % folds
    return assignment


def pooled(train: Any, val: Any) -> Any:
    """The train and val datasets as one dataset (train rows first), of the same kind."""
    if isinstance(train, GraphDataset) and isinstance(val, GraphDataset) and train.store is val.store:
        return GraphDataset(train.store, torch.cat([train.rows, val.rows]), train.targets, train.complete)
    if type(train) is type(val) and type(train) in _TENSOR_DATASETS:
        return type(train)(torch.cat([train.inputs, val.inputs]),
                           [torch.cat([a, b]) for a, b in zip(train.targets, val.targets, strict=True)])
    raise InvalidParameterError(f"k-fold selection cannot re-partition {type(train).__name__} data (tables, "
                                "tensor benchmarks and molecules only); pass --selection holdout and give the "
                                "validation split more rows")


def subset(dataset: Any, rows: np.ndarray) -> Any:
    """The rows ``rows`` of a :func:`pooled` dataset, of the same kind."""
    index = torch.from_numpy(rows)
    if isinstance(dataset, GraphDataset):
        return GraphDataset(dataset.store, dataset.rows[index], dataset.targets, dataset.complete)
    return type(dataset)(dataset.inputs[index], [t[index] for t in dataset.targets])


def fold_data(data: BenchmarkData, assignment: np.ndarray) -> list[BenchmarkData]:
    """One dataset per fold: its train split the other folds' rows, its val split the fold's rows (no test)."""
    rows = pooled(data.splits["train"], data.splits["val"])
    folds = int(assignment.max()) + 1
    return [BenchmarkData({"train": subset(rows, np.flatnonzero(assignment != i)),
                           "val": subset(rows, np.flatnonzero(assignment == i))},
                          f"{data.content_hash}-fold{i}of{folds}", data.manifest) for i in range(folds)]


def fold_dir(trial_dir: Path, fold: int) -> Path:
    return trial_dir / f"{FOLD_PREFIX}{fold}"


def trial_steps(trial_dir: Path) -> tuple[int, int]:
    """(optimizer steps, epochs) a trial's runs recorded: every fold's, or the one run's without folds."""
    folds = sorted(trial_dir.glob(f"{FOLD_PREFIX}*")) if trial_dir.is_dir() else []
    if not folds:
        return recorded_steps(trial_dir)
    counted = [recorded_steps(f) for f in folds]
    return sum(s for s, _ in counted), sum(e for _, e in counted)


@dataclass(frozen=True)
class FoldSearch:
    """What a k-fold trial trains on: the benchmark, each fold's data and the study's scorer of each fold."""

    bench: Any
    folds: Sequence[BenchmarkData]
    scorers: Sequence[Scorer]


def run_fold_trial(search: FoldSearch, config: Any, trial_dir: Path, trial: optuna.Trial,
                   adopted: optuna.trial.FrozenTrial | None) -> TrialOutcome:
    """Train ``config`` on every fold in turn (fold 0 reports to the pruner) and return the trial's outcome:
    pruned when fold 0 was, diverged when any fold was, else complete with the mean of the folds' values."""
    values: list[float] = []
    steps = epochs = 0
    seconds = optuna_seconds = 0.0
    for i, (data, scorer) in enumerate(zip(search.folds, search.scorers, strict=True)):
        run_dir = fold_dir(trial_dir, i)
        resume = adopted if adopted is not None and run_dir.exists() else None
        outcome = run_trial({"bench": search.bench, "data": data, "config": config}, run_dir, trial, scorer,
                            resume=resume, judge=i == 0)
        steps, epochs = steps + outcome.steps, epochs + outcome.epochs
        seconds, optuna_seconds = seconds + outcome.seconds, optuna_seconds + outcome.optuna_seconds
        if outcome.state != COMPLETE:
            return TrialOutcome(outcome.state, outcome.value, steps, epochs, seconds, optuna_seconds)
        values.append(float(outcome.value))
    value = float(np.mean(values))
    if not math.isfinite(value):
        return TrialOutcome(DIVERGED, math.inf, steps, epochs, seconds, optuna_seconds)
    return TrialOutcome(COMPLETE, value, steps, epochs, seconds, optuna_seconds)

