"""Task progress of local pipeline runs: ``[benchmark_sweep 5/11] train #1 done · elapsed 1:20 · ETA ~1:28``.

Every kfp.local task that succeeds leaves ``executor_output.json`` in its folder of the artifact tree;
:class:`PipelineProgress` watches the tree from a background thread and prints one line per finished
task. (kfp.local's own "finished" log lines are not reliable for counting: concurrent loop iterations
reset the root logger's level under each other and lines get lost.) The total is the expected number
of tasks from the pipeline parameters, and the ETA assumes the remaining tasks take as long on average
as the finished ones.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

OUTPUT_FILE = "executor_output.json"


def format_seconds(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def expected_tasks(pipeline: str, params: Mapping[str, Any], n_tasks: int, baseline_kinds: int = 1) -> int:
    """Tasks a local run of ``pipeline`` executes, exit handler included (``n_tasks``: benchmark tasks;
    ``baseline_kinds``: the baselines the sweep plans, 3 for a table, else 1)."""
    if pipeline == "benchmark_sweep":
        runs = len(params.get("methods") or []) * len(params.get("seeds") or [])
        references = n_tasks * len(params.get("reference_seeds") or [])
        # prepare_data, plan_runs, plan_references, plan_baselines; train + evaluate per run; train per reference;
        # one fit per baseline kind; aggregate; record_status
        return 4 + 2 * runs + references + baseline_kinds + 2
    if pipeline == "tuned_sweep":  # kfp.local runs the optuna branch only
        methods = len(dict.fromkeys(["ls", *(params.get("methods") or [])]))
        tasks = len(params.get("tasks") or []) or n_tasks
        # prepare_data, tuning_arguments, plan_tuning; one tune_study per study; compare_tuned; record_status
        return 3 + methods + (tasks if tasks > 1 else 0) + 2
    # retrain: prepare_data, plan_run, train, evaluate, compare, promote (only when better), record_status
    return 7


def task_label(output_file: Path) -> str:
    """``train-2 #1`` for ``.../for-loop-3-iteration-1/train-2/executor_output.json``."""
    task, parent = output_file.parent.name, output_file.parent.parent.name
    if parent.startswith("for-loop-") and "-iteration-" in parent:
        return f"{task} #{parent.rsplit('-', 1)[1]}"
    return task


class PipelineProgress:
    """Prints ``[pipeline N/M] task done · elapsed · ETA`` for every task finishing under ``root``."""

    def __init__(self, pipeline: str, total: int, root: str | Path, stream: TextIO | None = None,
                 interval: float = 0.5, clock=time.monotonic):
        self.pipeline, self.total, self.root = pipeline, max(total, 1), Path(root)
        self.stream, self.interval, self.clock = stream, interval, clock
        self.lines: list[str] = []
        self._seen: set[Path] = set()
        self._since = time.time()
        self.started = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> list[str]:
        """Report the tasks that finished since the last poll; returns their lines."""
        if not self.root.is_dir():
            return []
        finished = sorted((p for p in self.root.rglob(OUTPUT_FILE)
                           if p not in self._seen and p.stat().st_mtime >= self._since - 1),
                          key=lambda p: p.stat().st_mtime)
        new = []
        for path in finished:
            self._seen.add(path)
            done = len(self._seen)
            total = max(self.total, done)
            elapsed = self.clock() - self.started
            line = (f"[{self.pipeline} {done}/{total}] {task_label(path)} done · elapsed {format_seconds(elapsed)}"
                    f" · ETA ~{format_seconds(elapsed / done * (total - done))}")
            print(line, file=self.stream or sys.stderr, flush=True)
            new.append(line)
        self.lines += new
        return new

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def __enter__(self) -> PipelineProgress:
        self._since, self.started = time.time(), self.clock()
        self._thread = threading.Thread(target=self._watch, name="mtlflow-pipeline-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
