"""The runs of a comparison, each read once: its records (``run.json``, ``metrics.json``, as
:func:`mtlflow.engine.rundir.read_run` returns them) and, from its evaluation files, the per-example errors the
paired comparisons use and each task's test sample the split-size warning uses (the labelled examples, their
errors, a ROC-AUC task's classes). Everything after
:func:`load_runs` is computed from these objects without touching a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.engine.rundir import run_label
from mtlflow.metrics.evaluation import examples_path, read_examples


def split_evaluation_name(split: str) -> str:
    """The file name, in a run directory, of the run's evaluation on ``split`` with its per-example values
    (``<split>_evaluation.json``, the npz beside it): what the pipelines' train step keeps with the run."""
    return f"{split}_evaluation.json"


@dataclass(frozen=True)
class TestSet:
    """What identifies the test examples a run's per-example errors are of: two runs pair only on the same."""

    data_hash: str
    split: str
    examples: int
    statistics: dict[str, str]  # each task's paired statistic


@dataclass(frozen=True)
class RunExamples:
    test_set: TestSet
    errors: dict[str, np.ndarray]  # task -> each example's error, in the split's order


@dataclass(frozen=True)
class TaskSample:
    """What a run's own per-example evaluation of the split says about one task's test sample: the labelled
    examples, each one's paired error (NaN dropped) and, for a ROC-AUC task, its positive and negative labels."""

    labelled: int
    errors: np.ndarray
    statistic: str
    classes: tuple[int, int] | None = None


@dataclass(frozen=True)
class LoadedRun:
    """One run of a comparison: its records and what its evaluation files say about ``split``."""

    dir: str
    run: Mapping[str, Any]
    metrics: Mapping[str, Any]
    examples: RunExamples | None  # None: no evaluation of the split kept per-example values
    samples: dict[str, TaskSample]  # per task: its test sample, from the run's per-example evaluation of the split

    @property
    def label(self) -> str:
        return run_label(self.run)

    @property
    def seed(self) -> int:
        return self.run["config"]["seed"]

    @property
    def tasks(self) -> list[str]:
        return self.metrics["tasks"]

    @property
    def selection_rule(self) -> str:
        return self.metrics["selection"]["rule"]

    def final(self, split: str) -> dict[str, dict[str, float]]:
        """The selected final metrics on ``split``: task -> metric -> value."""
        return self.metrics["final"][split]

    @property
    def not_converged(self) -> bool:
        """Whether the run says its validation metric was still improving when training stopped (``converged``
        false or ``not_converged`` true in run.json or metrics.json; runs from before the flag say nothing)."""
        return any(record.get("converged") is False or bool(record.get("not_converged"))
                   for record in (self.run, self.metrics))

    def split_size(self, split: str, task: str) -> int | None:
        """How many examples of ``split`` a task's metric was computed on, when known: the labelled examples of
        the run's own per-example evaluation of that split, else ``split_sizes`` recorded in the run."""
        if task in self.samples:
            return self.samples[task].labelled
        for record in (self.metrics, self.run):
            size = (record.get("split_sizes") or {}).get(split)
            if isinstance(size, Mapping):
                size = size.get(task)
            if isinstance(size, (int, float)) and size > 0:
                return int(size)
        return None


class _Files:
    """Each evaluation file and each per-example archive read at most once."""

    def __init__(self) -> None:
        self._json: dict[Path, dict[str, Any]] = {}
        self._npz: dict[Path, dict[str, dict[str, np.ndarray]]] = {}

    def evaluation(self, path: Path) -> dict[str, Any]:
        if path not in self._json:
            self._json[path] = atomic.read_json(path, "evaluation")
        return self._json[path]

    def examples(self, path: Path) -> dict[str, dict[str, np.ndarray]]:
        if path not in self._npz:
            self._npz[path] = read_examples(path)
        return self._npz[path]


def evaluations_by_run(evaluations: Sequence[str | Path], run_dirs: Sequence[str], files: _Files) -> dict[Path, Path]:
    """The given evaluation files by the (resolved) run directory each names; one that names no compared run is
    refused."""
    dirs = {Path(d).resolve() for d in run_dirs}
    given: dict[Path, Path] = {}
    for path in map(Path, evaluations):
        run = Path(files.evaluation(path).get("run", "")).resolve()
        if run not in dirs:
            raise InvalidParameterError(f"evaluation {path} is of run {run}, which is not among the runs compared; "
                                        "give the evaluations of the compared runs only")
        given[run] = path
    return given


def _examples(candidates: Sequence[Path | None], split: str, tasks: Sequence[str], files: _Files) -> RunExamples | None:
    """The per-example errors of the first candidate evaluation of ``split`` that kept them."""
    for path in candidates:
        if path is None or not path.is_file():
            continue
        evaluation = files.evaluation(path)
        kept = evaluation.get("per_example")
        if not kept or evaluation.get("split") != split:
            continue
        values = files.examples(path.parent / kept["file"])
        absent = [t for t in tasks if t not in values]
        if absent:
            raise DataError(f"per-example values {path.parent / kept['file']} have no task {', '.join(absent)}; "
                            "evaluate the run again with per-example values")
        return RunExamples(TestSet(evaluation["data_hash"], split, int(kept["examples"]),
                                   {t: kept["statistics"][t] for t in tasks}),
                           {t: values[t]["error"] for t in tasks})
    return None


def _samples(candidates: Sequence[Path | None], split: str, tasks: Sequence[str],
             files: _Files) -> dict[str, TaskSample]:
    """Per task, its test sample in the first candidate evaluation of ``split`` (a given one, then the run's own)
    whose per-example archive holds the task."""
    samples: dict[str, TaskSample] = {}
    for task in tasks:
        for path in candidates:
            if path is None or not path.is_file() or not examples_path(path).is_file():
                continue
            evaluation = files.evaluation(path)
            values = files.examples(examples_path(path)).get(task, {})
            if evaluation.get("split") != split or values.get("error") is None:
                continue
            errors = np.asarray(values["error"], dtype=np.float64)
            kept = errors[~np.isnan(errors)]
            classes = (int(np.nansum(values["positives"])), int(np.nansum(values["negatives"]))) \
                if "positives" in values and "negatives" in values else None
            statistic = (evaluation.get("per_example") or {}).get("statistics", {}).get(task, "")
            samples[task] = TaskSample(labelled=int(kept.size), errors=kept, statistic=statistic, classes=classes)
            break
    return samples


def load_runs(runs: Sequence[Mapping[str, Any]], split: str, evaluations: Sequence[str | Path] = (),
              with_evaluations: bool = True) -> list[LoadedRun]:
    """``runs`` (:func:`~mtlflow.engine.rundir.read_run`'s records) with their evaluations of ``split``: a
    given evaluation file (``evaluations``, by the run it names) first, else the run's own
    ``<split>_evaluation.json`` or ``evaluation.json``. ``with_evaluations=False`` (single-task references)
    reads none."""
    files = _Files()
    given = evaluations_by_run(evaluations, [r["dir"] for r in runs], files)
    loaded = []
    for r in runs:
        run_dir = Path(r["dir"])
        own = [run_dir / split_evaluation_name(split), run_dir / "evaluation.json"]
        tasks = r["metrics"]["tasks"]
        examples = _examples([given.get(run_dir.resolve()), *own], split, tasks, files) \
            if with_evaluations else None
        samples = _samples([given.get(run_dir.resolve()), *own], split, tasks, files) if with_evaluations else {}
        loaded.append(LoadedRun(r["dir"], r["run"], r["metrics"], examples, samples))
    return loaded
