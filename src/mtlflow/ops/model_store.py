"""The model store: the champion model of each benchmark, every model ever promoted and every gate decision.

Layout under the store root (a directory on the models PVC on the cluster, a local folder otherwise)::

    <root>/<benchmark>/versions/<version>/   model.pt, run.json, metrics.json, evaluation.json, metadata.json
    <root>/<benchmark>/champion.json         the current champion: its version, score, test metrics, decision
    <root>/<benchmark>/decisions/<stamp>-<method>-<data>-<id>.json   every gate decision, promoted or not

A model's score is the mean over tasks of its primary metric's *error* on the test split (``1 - accuracy``
for bounded higher-is-better metrics; see :func:`mtlflow.metrics.task.metric_error`), the same per-task
objective the hypervolume uses; lower is better. Whether a candidate replaces the champion is decided by
the retrain gate (:func:`mtlflow.jobs.champion.decide`): both models evaluated on the candidate's test
split, a paired comparison per example (:func:`mtlflow.metrics.paired.gate`), never the champion's stored
numbers, which were measured on the data version it was trained on.

Promotion is atomic and race-free: the version directory is built in a temporary sibling and renamed,
then ``champion.json`` is replaced atomically, all under an exclusive lock on the benchmark's store that
also checks the decision was made against the champion still in place, so two concurrent retraining runs
cannot both win (the second one's decision was about a champion that is gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

from mtlflow.core import atomic
from mtlflow.core.errors import DataError

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


def record_decision(root: str | os.PathLike, decision: Mapping[str, Any]) -> Path:
    """Keep a gate decision (:func:`mtlflow.jobs.champion.decide`) under ``decisions/``; returns its path."""
    decided = float(decision["decided_unix"])
    # microseconds and a random suffix: two gates deciding in the same second (retrains of several seeds) must
    # not replace each other's record; the names still sort by time
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(decided)) + f".{int(decided % 1 * 1e6):06d}Z"
    directory = benchmark_dir(root, decision["benchmark"]) / "decisions"
    path = directory / (f"{stamp}-{decision['candidate']['method']}-{decision['data_hash'][:12]}-"
                        f"{uuid.uuid4().hex[:8]}.json")
    atomic.write_json(path, dict(decision))
    return path


def still_applies(decision: Mapping[str, Any], champion: Mapping[str, Any] | None) -> tuple[bool, str]:
    """``(promote?, reason)``: a decision to promote holds only against the champion it was made against."""
    if not decision["promote"]:
        return False, f"the gate kept the champion: {decision['reason']}"
    decided_against = decision["champion"]["version"] if decision.get("champion") else None
    current = champion["version"] if champion else None
    if decided_against != current:
        return False, (f"the champion changed from {decided_against} to {current} after the decision; "
                       "retrain again to compare with the new champion")
    return True, decision["reason"]


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
            decision: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Store the run as the new champion if the gate's ``decision`` promotes it and was made against the
    current champion; returns the new champion record (with the decision), or None."""
    cand = candidate(run_dir, evaluation)
    if cand["benchmark"] != decision["benchmark"] or cand["data_hash"] != decision["data_hash"]:
        raise DataError(f"the decision is about {decision['benchmark']} data {decision['data_hash'][:12]} but the "
                        f"evaluation about {cand['benchmark']} data {cand['data_hash'][:12]}; "
                        "pass the run's own decision")
    store = benchmark_dir(root, cand["benchmark"])
    with _locked(store):
        champion = read_champion(root, cand["benchmark"])
        better, reason = still_applies(decision, champion)
        if not better:
            print(f"not promoted: {reason}")
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        version = f"{stamp}-{cand['method']}-{cand['data_hash'][:12]}"
        record = {**cand, "version": version, "promoted_unix": round(time.time(), 3), "reason": reason,
                  "data": dict(data or {}), "previous": champion["version"] if champion else None,
                  "decision": dict(decision)}
        with atomic.atomic_dir(store / "versions" / version) as tmp:
            for name in VERSION_FILES:
                shutil.copyfile(Path(run_dir) / name, tmp / name)
            atomic.write_json(tmp / "evaluation.json", dict(evaluation))
            atomic.write_json(tmp / "metadata.json", record)
        record["path"] = str(store / "versions" / version)
        atomic.write_json(store / CHAMPION, record)
    return record
