"""Epoch metrics as ``name=value`` lines on stdout, for Katib's StdOut metrics collector
(``mtlflow train --katib-metrics SCORER.json``; :mod:`mtlflow.ops.katib` builds the Experiments that read them).

After every epoch the run prints, one per line and flushed at once:

* ``val_score=<x>``: the tuning study's validation score (:class:`mtlflow.jobs.tune_trial.Scorer`, the score
  ``mtlflow tune`` minimises: the primary metrics' relative change on val against one fixed reference, the
  untrained model's), read from the scorer file the launcher wrote for the study; Katib's one objective;
* ``val_<task>_<metric>=<x>`` for every metric (and the loss) of every trained task on val: the Experiment's
  ``additionalMetricNames`` (:func:`metric_names`; characters outside ``[A-Za-z0-9_-]`` become ``_``).

A non-finite value is not printed (the collector's format reads numbers only; a diverged run fails its trial). Only
the main process prints (``mtlflow train`` adds the callback on rank 0 only). The lines come from the val split
only, so Katib's selection never sees the test split (the run still records its test metrics in ``metrics.json``,
as every ``mtlflow train`` does; nothing of the search reads them).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback, TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs.tune_trial import Scorer
from mtlflow.metrics.task import TaskSpec
from mtlflow.ops.katib import OBJECTIVE, metric_name

#: the split the lines report (the one a tuning trial selects on)
SPLIT = "val"


def metric_names(tasks: Sequence[TaskSpec]) -> list[str]:
    """The additional metric names a run on ``tasks`` prints, in the order it prints them."""
    return [metric_name(SPLIT, task.name, metric) for task in tasks for metric in task.metric_specs()]


def epoch_lines(record: dict[str, Any], tasks: Sequence[TaskSpec], scorer: Scorer) -> list[str]:
    """The ``name=value`` lines of one epoch's record."""
    val = record["splits"][SPLIT]
    values = [(OBJECTIVE, scorer(val))]
    values += [(metric_name(SPLIT, task.name, metric), val[task.name][metric])
               for task in tasks for metric in task.metric_specs() if metric in val[task.name]]
    return [f"{name}={float(value)!r}" for name, value in values if math.isfinite(float(value))]


class KatibMetrics(Callback):
    """Prints :func:`epoch_lines` after every epoch."""

    name = "katib-metrics"

    def __init__(self, scorer: Scorer, stream: TextIO | None = None):
        self.scorer, self.stream = scorer, stream

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        stream = self.stream or sys.stdout
        print("\n".join(epoch_lines(record, trainer.tasks, self.scorer)), file=stream, flush=True)


def load_scorer(path: str | Path) -> Scorer:
    """The study's scorer from the JSON file the launcher wrote (:meth:`Scorer.as_dict`)."""
    data = atomic.read_json(path, "Katib scorer")
    if not isinstance(data, dict) or not {"reference", "primary", "specs"} <= set(data):
        raise InvalidParameterError(f"--katib-metrics {path} is not a scorer file (reference, primary, specs); pass "
                                    "the scorer.json the Katib launcher wrote for the study")
    return Scorer.from_dict(data)


def callbacks(scorer_file: str | None) -> list[Callback]:
    """``[KatibMetrics]`` for ``mtlflow train --katib-metrics FILE``; none without the flag."""
    return [KatibMetrics(load_scorer(scorer_file))] if scorer_file else []
