"""Pipeline run status records, written by the exit handler of every pipeline.

One JSON file per pipeline run, ``<status_dir>/<job name>.json``, plus ``<status_dir>/<pipeline>.latest.json``
pointing at the most recent one; both written atomically. On the cluster ``status_dir`` is on the
checkpoints PVC, so the history of nightly sweeps and retraining runs survives the pods.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from mtlflow.core import atomic

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def record(status_dir: str | os.PathLike, pipeline: str, job_name: str, state: str,
           error_code: Any = None, error_message: str | None = None, **extra: Any) -> Path:
    """Write the final state of one pipeline run; returns the record's path."""
    status_dir = Path(status_dir)
    entry = {"pipeline": pipeline, "job": job_name, "state": state, "succeeded": state == "SUCCEEDED",
             "error_code": error_code, "error_message": error_message or None,
             "finished_unix": round(time.time(), 3), **extra}
    path = status_dir / f"{_UNSAFE.sub('_', job_name) or 'unnamed'}.json"
    atomic.write_json(path, entry)
    atomic.write_json(status_dir / f"{_UNSAFE.sub('_', pipeline)}.latest.json", {**entry, "record": str(path)})
    return path
