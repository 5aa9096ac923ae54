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

**Outcomes.** The gate's verdict is a proposal; what happened is decided under the lock. The decision
record under ``decisions/`` says ``promoted: null`` (pending) until :func:`promote` settles it there, under
the lock, with ``promote``/``promoted`` (the final outcome), ``gate_promote`` (the gate's verdict) and
``outcome`` ("promoted as VERSION", or "kept: another retrain promoted LABEL (VERSION) first"); the
pipeline's ``retrain.json``, Prometheus and the Kubeflow UI report that settled outcome.

A version directory also keeps ``seen_rows.npy``: the content digests of the rows the model trained and
was selected on (:mod:`mtlflow.benchmarks.row_hashes`), which the next gate compares with its test rows.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.core import atomic
from mtlflow.core.errors import DataError
from mtlflow.core.locks import file_lock
from mtlflow.engine.rundir import read_run, run_label
from mtlflow.metrics.task import metric_error

CHAMPION = "champion.json"
#: the content digests of the rows a stored model trained and was selected on (train and val)
SEEN_ROWS = "seen_rows.npy"
#: what a decision record says while the promote step has not settled it
PENDING = "pending: the promote step decides under the model store's lock"
#: files of a run directory that make up a stored model version
VERSION_FILES = ("model.pt", "run.json", "metrics.json")


def benchmark_dir(root: str | os.PathLike, benchmark: str) -> Path:
    return Path(root) / benchmark


def score(metrics: Mapping[str, Mapping[str, float]], primary: Mapping[str, str],
          specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> float:
    """Mean over tasks of the primary metric's error (lower is better)."""
    errors = [metric_error(metrics[task][primary[task]], specs[task][primary[task]]["higher_is_better"],
                           specs[task][primary[task]]["unit_interval"]) for task in primary]
    return statistics.fmean(errors)


def candidate(run_dir: str | os.PathLike, evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """Summary of a trained run and its test evaluation, in the form stored for a champion."""
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


def decisions_dir(root: str | os.PathLike, benchmark: str) -> Path:
    return benchmark_dir(root, benchmark) / "decisions"


def record_decision(root: str | os.PathLike, decision: Mapping[str, Any]) -> Path:
    """Keep a gate decision (:func:`mtlflow.jobs.champion.decide`) under ``decisions/`` with its file name
    (``record``) and its outcome so far (kept, or pending the promote step); returns its path."""
    decided = float(decision["decided_unix"])
    # microseconds and a random suffix: two gates deciding in the same second (retrains of several seeds) must
    # not replace each other's record; the names still sort by time
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(decided)) + f".{int(decided % 1 * 1e6):06d}Z"
    path = decisions_dir(root, decision["benchmark"]) / (
        f"{stamp}-{decision['candidate']['method']}-{decision['data_hash'][:12]}-{uuid.uuid4().hex[:8]}.json")
    atomic.write_json(path, with_outcome(decision, record=path.name))
    return path


def with_outcome(decision: Mapping[str, Any], record: str) -> dict[str, Any]:
    """The decision as first recorded: kept (final) when the gate kept the champion, else pending."""
    kept = not decision["promote"]
    return {**decision, "record": record, "gate_promote": bool(decision["promote"]),
            "promoted": False if kept else None, "outcome": f"kept: {decision['reason']}" if kept else PENDING}


def settled(decision: Mapping[str, Any], promoted: bool, outcome: str, version: str | None) -> dict[str, Any]:
    """The decision with its final outcome."""
    return {**decision, "gate_promote": bool(decision.get("gate_promote", decision["promote"])),
            "promote": promoted, "promoted": promoted, "outcome": outcome, "version": version,
            "settled_unix": round(time.time(), 3)}


def write_settled(root: str | os.PathLike, decision: Mapping[str, Any]) -> None:
    """Write a settled decision over its record under ``decisions/`` (under the store's lock); a decision
    without a record (made elsewhere) has none to update."""
    if decision.get("record"):
        atomic.write_json(decisions_dir(root, decision["benchmark"]) / Path(decision["record"]).name, dict(decision))


def still_applies(decision: Mapping[str, Any], champion: Mapping[str, Any] | None) -> tuple[bool, str]:
    """``(promote?, outcome)``: a decision to promote holds only against the champion it was made against."""
    if not decision.get("gate_promote", decision["promote"]):
        return False, f"kept: {decision['reason']}"
    decided_against = decision["champion"]["version"] if decision.get("champion") else None
    current = champion["version"] if champion else None
    if decided_against != current:
        if champion is None:
            return False, (f"kept: the champion {decided_against} was removed after the decision; retrain again to "
                           "compare with the store as it is")
        return False, (f"kept: another retrain promoted {champion['label']} ({current}) first; retrain again to "
                       "compare with it")
    return True, decision["reason"]


def promote(root: str | os.PathLike, run_dir: str | os.PathLike, evaluation: Mapping[str, Any],
            decision: Mapping[str, Any], data: Mapping[str, Any] | None = None,
            seen_rows: np.ndarray | None = None) -> dict[str, Any]:
    """Store the run as the new champion if the gate's ``decision`` promotes it and was made against the
    current champion, and settle the decision record (:func:`write_settled`) under the same lock. Returns
    ``{"promoted", "outcome", "version", "champion", "decision"}``: the champion after it (new or kept) and
    the settled decision. ``seen_rows``: the content digests of the rows the run trained and was selected on."""
    cand = candidate(run_dir, evaluation)
    if cand["benchmark"] != decision["benchmark"] or cand["data_hash"] != decision["data_hash"]:
        raise DataError(f"the decision is about {decision['benchmark']} data {decision['data_hash'][:12]} but the "
                        f"evaluation about {cand['benchmark']} data {cand['data_hash'][:12]}; "
                        "pass the run's own decision")
    store = benchmark_dir(root, cand["benchmark"])
    with file_lock(store / ".lock"):
        champion = read_champion(root, cand["benchmark"])
        better, reason = still_applies(decision, champion)
        if not better:
            final = settled(decision, False, reason, None)
            write_settled(root, final)
            print(f"not promoted: {reason}")
            return {"promoted": False, "outcome": reason, "version": None, "champion": champion, "decision": final}
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        version = f"{stamp}-{cand['method']}-{cand['data_hash'][:12]}"
        outcome = f"promoted as {version}"
        final = settled(decision, True, outcome, version)
        record = {**cand, "version": version, "promoted_unix": round(time.time(), 3), "reason": reason,
                  "data": dict(data or {}), "previous": champion["version"] if champion else None,
                  "decision": final}
        with atomic.atomic_dir(store / "versions" / version) as tmp:
            for name in VERSION_FILES:
                shutil.copyfile(Path(run_dir) / name, tmp / name)
            atomic.write_json(tmp / "evaluation.json", dict(evaluation))
            atomic.write_json(tmp / "metadata.json", record)
            if seen_rows is not None:
                np.save(tmp / SEEN_ROWS, np.asarray(seen_rows, dtype=np.uint64))
        record["path"] = str(store / "versions" / version)
        atomic.write_json(store / CHAMPION, record)
        write_settled(root, final)
    return {"promoted": True, "outcome": outcome, "version": version, "champion": record, "decision": final}
