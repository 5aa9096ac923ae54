"""The data cache: benchmarks the CLI and the experiments prepare on demand, once per configuration.

``$MTLFLOW_CACHE`` (default ``~/.cache/mtlflow``) holds ``data/<benchmark>-<config hash>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from mtlflow import benchmarks
from mtlflow.benchmarks.base import Benchmark, BenchmarkData, read_manifest
from mtlflow.core.errors import DataError
from mtlflow.core.locks import file_lock
from mtlflow.core.outputs import check_output_dir
from mtlflow.jobs.data import load_prepared, prepare, prepare_benchmark


def default_cache_dir() -> Path:
    return check_output_dir(os.environ.get("MTLFLOW_CACHE", Path.home() / ".cache" / "mtlflow"), "$MTLFLOW_CACHE")


def cache_path(bench: Benchmark) -> Path:
    """Where ``bench`` (with its configuration) is cached, prepared or not."""
    key = hashlib.sha256(json.dumps(bench.data_identity(), sort_keys=True).encode()).hexdigest()[:12]
    return default_cache_dir() / "data" / f"{bench.name}-{key}"


def cached_data_dir(benchmark: str, config: dict[str, Any]) -> Path:
    """Prepare ``benchmark`` with ``config`` into the cache once; reuse it afterwards."""
    path = cache_path(benchmarks.build(benchmark, **config))
    # torchrun's processes wait here: one prepares, the others reuse (prepare takes its own lock inside)
    with file_lock(path.with_name(f".{path.name}.wait.lock")):
        try:
            load_prepared(path)
        except DataError:
            print(f"preparing {benchmark} data into {path}", file=sys.stderr)
            prepare(benchmark, path, overwrite=True, **config)
    return path


def cached_data(bench: Benchmark) -> tuple[Path, BenchmarkData]:
    """``bench``'s data loaded from the cache (hashed once, when loaded), prepared first when it is absent
    or damaged."""
    path = cache_path(bench)
    with file_lock(path.with_name(f".{path.name}.wait.lock")):
        try:
            read_manifest(path)
            return path, bench.load(path)
        except DataError:
            print(f"preparing {bench.name} data into {path}", file=sys.stderr)
            prepare_benchmark(bench, path, overwrite=True)  # this very object: its errors keep the spec's FILE:LINE
    return path, bench.load(path)
