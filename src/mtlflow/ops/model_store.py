"""The model store: the champion model of each benchmark and every model ever promoted.

Layout under the store root (a directory on the models PVC on the cluster, a local folder otherwise)::

    <root>/<benchmark>/versions/<version>/   model.pt, run.json, metrics.json, evaluation.json, metadata.json
    <root>/<benchmark>/champion.json         the current champion: its version, score and test metrics

A candidate is scored by the mean over tasks of its primary metric's *error* on the test split
(``1 - accuracy`` for bounded higher-is-better metrics; see :func:`mtlflow.metrics.task.metric_error`),
the same per-task objective the hypervolume uses; lower is better. It replaces the champion only when
its score is lower by more than ``min_improvement``.

Promotion is atomic and race-free: the version directory is built in a temporary sibling and renamed,
then ``champion.json`` is replaced atomically, all under an exclusive lock on the benchmark's store
that also re-checks the comparison, so two concurrent retraining runs cannot both win.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError

CHAMPION = "champion.json"
#: files of a run directory that make up a stored model version
VERSION_FILES = ("model.pt", "run.json", "metrics.json")


def benchmark_dir(root: str | os.PathLike, benchmark: str) -> Path:
    return Path(root) / benchmark


def score(metrics: Mapping[str, Mapping[str, float]], primary: Mapping[str, str],
          specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> float:
    """Mean over tasks of the primary metric's error (lower is better)."""
    from mtlflow.metrics.task import metric_error

    errors = [metric_error(metrics[task][primary[task]], specs[task][primary[task]]["higher_is_better"],
                           specs[task][primary[task]]["unit_interval"]) for task in primary]
    return statistics.fmean(errors)


def candidate(run_dir: str | os.PathLike, evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """Summary of a trained run and its test evaluation, in the form stored for a champion."""
    from mtlflow.engine.rundir import read_run, run_label

    run = read_run(run_dir)
    primary = run["metrics"]["primary_metrics"]
    if sorted(evaluation["tasks"]) != sorted(primary):
        raise DataError(f"evaluation tasks {evaluation['tasks']} do not match run {run_dir} ({sorted(primary)})")
    return {"benchmark": evaluation.get("dataset", evaluation["benchmark"]), "method": evaluation["method"],
            "label": run_label(run["run"]),
            "tasks": sorted(primary), "split": evaluation["split"], "metrics": evaluation["metrics"],
            "primary_metrics": primary, "data_hash": evaluation["data_hash"],
            "error": score(evaluation["metrics"], primary, evaluation["metric_specs"])}


def read_champion(root: str | os.PathLike, benchmark: str) -> dict[str, Any] | None:
    path = benchmark_dir(root, benchmark) / CHAMPION
    return atomic.read_json(path, "champion record") if path.is_file() else None


def compare(cand: Mapping[str, Any], champion: Mapping[str, Any] | None,
            min_improvement: float = 0.0) -> tuple[bool, str]:
    """``(promote?, reason)``: promote when there is no champion or the candidate's error is lower by
    more than ``min_improvement``."""
    if min_improvement < 0:
        raise InvalidParameterError(f"min_improvement must be >= 0, got {min_improvement}")
    if champion is None:
        return True, f"no champion for {cand['benchmark']} yet; candidate error {cand['error']:.4f}"
    if sorted(champion["tasks"]) != sorted(cand["tasks"]):
        raise DataError(f"the champion of {cand['benchmark']} solves tasks {champion['tasks']} but the candidate "
                        f"{cand['tasks']}; use another model store for a different task set")
    gain = champion["error"] - cand["error"]
    verdict = gain > min_improvement
    return verdict, (f"candidate {cand['label']} error {cand['error']:.4f} vs champion {champion['label']} "
                     f"({champion['version']}) {champion['error']:.4f}: improvement {gain:+.4f} "
                     f"{'>' if verdict else '<='} min_improvement {min_improvement}")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def promote(root: str | os.PathLike, run_dir: str | os.PathLike, evaluation: Mapping[str, Any],
            data: Mapping[str, Any] | None = None, min_improvement: float = 0.0) -> dict[str, Any] | None:
    """Store the run as the new champion if it still beats the current one; returns the new champion
    record, or None when the champion (possibly promoted meanwhile by another run) is as good."""
    cand = candidate(run_dir, evaluation)
    store = benchmark_dir(root, cand["benchmark"])
    with _locked(store):
        champion = read_champion(root, cand["benchmark"])
        better, reason = compare(cand, champion, min_improvement)
        if not better:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        version = f"{stamp}-{cand['method']}-{cand['data_hash'][:12]}"
        record = {**cand, "version": version, "promoted_unix": round(time.time(), 3), "reason": reason,
                  "data": dict(data or {}), "previous": champion["version"] if champion else None}
        with atomic.atomic_dir(store / "versions" / version) as tmp:
            for name in VERSION_FILES:
                shutil.copyfile(Path(run_dir) / name, tmp / name)
            atomic.write_json(tmp / "evaluation.json", dict(evaluation))
            atomic.write_json(tmp / "metadata.json", record)
        record["path"] = str(store / "versions" / version)
        atomic.write_json(store / CHAMPION, record)
    return record
