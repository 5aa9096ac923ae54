"""One trial of a tuning study (:mod:`mtlflow.jobs.tune`): train one configuration on the train split, score
every epoch on the validation split, report the score to the Optuna trial and stop when the pruner says so.

**Selection never sees the test split.** A trial's trainer gets the data without its test split (only train
and val exist in the object it holds) and evaluates ``SEARCH_SPLITS`` (val) after every epoch; retraining
the chosen configuration (:mod:`mtlflow.jobs.tune`) is the first time test is evaluated.

**The score** of an epoch is the trainer's own validation score (:func:`mtlflow.metrics.selection.validation_score`:
the mean over tasks of the relative change of the primary metric's error on val) with one fixed reference for the
whole study instead of each run's own first epoch: the val metrics of the untrained model (the study's seed, the
method's defaults). Against each run's own first epoch a trial whose first epoch was bad would score well, so
trials could not be ranked; against one reference they can. Lower is better; a trial's value is the score of the
epoch its selection rule keeps (``select``: last, last-k or best-val), i.e. of the model it delivers.

**Steps** are read from the run's own record (``metrics.json``: the optimizer steps of every finished epoch); a
pruned trial stops at the start of the epoch after the one the pruner judged, so every epoch it ran is recorded.
A diverged trial (a NaN/Inf loss) counts its recorded epochs plus the steps of the epoch it failed in (the
trainer's step counter at the failure).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtlflow.benchmarks.base import BenchmarkData
from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback, TrainerView
from mtlflow.core.errors import NonFiniteLossError
from mtlflow.core.outputs import run_dir_guard
from mtlflow.engine.trainer import Trainer
from mtlflow.metrics.evaluation import evaluate_model
from mtlflow.metrics.selection import validation_score

if TYPE_CHECKING:  # pragma: no cover
    import optuna

#: the splits a trial evaluates after every epoch (never test)
SEARCH_SPLITS = ("val",)
#: the splits of the data a trial's trainer holds
SEARCH_DATA_SPLITS = ("train", "val")

COMPLETE, PRUNED, DIVERGED = "complete", "pruned", "diverged"
#: the trial attribute that keeps the epoch after which the pruner pruned it
PRUNED_AFTER = "pruned_after_epoch"


def search_data(data: BenchmarkData) -> BenchmarkData:
    """The data a trial trains on: the train and val splits only (the test split is not in it)."""
    return BenchmarkData({name: data.splits[name] for name in SEARCH_DATA_SPLITS}, data.content_hash, data.manifest)


@dataclass(frozen=True)
class Scorer:
    """The study's validation score: :func:`validation_score` against the fixed ``reference`` val metrics."""

    reference: Mapping[str, Mapping[str, float]]
    primary: Mapping[str, str]
    specs: Mapping[str, Mapping[str, Mapping[str, bool]]]

    def __call__(self, val: Mapping[str, Mapping[str, float]]) -> float:
        return validation_score(val, self.reference, self.primary, self.specs)

    def as_dict(self) -> dict[str, Any]:
        return {"reference": {t: dict(v) for t, v in self.reference.items()}, "primary": dict(self.primary),
                "specs": {t: {m: dict(s) for m, s in v.items()} for t, v in self.specs.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scorer:
        return cls(data["reference"], data["primary"], data["specs"])


def untrained_scorer(trainer: Trainer) -> Scorer:
    """The study's scorer: the reference is the val metrics of ``trainer``'s model before any step."""
    val = evaluate_model(trainer.model, trainer.bench, trainer.data.splits["val"], trainer.tasks, trainer.task_index,
                         trainer.config.eval_batch_size, trainer.device)
    return Scorer(val, {t.name: t.primary for t in trainer.tasks}, {t.name: t.metric_specs() for t in trainer.tasks})


class TrialReporter(Callback):
    """Reports every epoch's score to ``trial`` (step = epoch) and stops the run at the start of the next epoch
    when the pruner prunes it (so the pruned epoch is recorded and checkpointed).

    A resumed run (a trial whose worker died) reports only the epochs the trial has not seen (``reported``) and
    keeps a pruning decision taken before the kill (``pruned_after``, the trial's ``PRUNED_AFTER`` attribute):
    Optuna's pruners record a rung once, so asking again after a kill would not repeat a "prune"."""

    name = "tune-trial"

    def __init__(self, trial: optuna.Trial, scorer: Scorer, reported: Sequence[int] = (),
                 pruned_after: int | None = None, judge: bool = True):
        self.trial, self.scorer, self.reported = trial, scorer, set(reported)
        self.pruned_after = pruned_after
        #: False: report nothing and never prune (a k-fold trial's later folds, :mod:`mtlflow.jobs.tune_folds`)
        self.judge = judge
        self.prune_at: int | None = None
        #: the time spent in Optuna (report, should_prune): the pruner's share of the trial
        self.optuna_seconds = 0.0
        #: the trainer's step counter when training failed (a diverged trial's steps)
        self.steps_at_failure: int | None = None

    def _report(self, record: Mapping[str, Any]) -> None:
        if not self.judge:
            return
        epoch = int(record["epoch"])
        started = time.perf_counter()
        if epoch not in self.reported:
            self.trial.report(self.scorer(record["splits"]["val"]), epoch)
            self.reported.add(epoch)
        if epoch == self.pruned_after or (self.pruned_after is None and self.trial.should_prune()):
            self.prune_at = self.pruned_after = epoch
            self.trial.set_user_attr(PRUNED_AFTER, epoch)
        else:
            self.prune_at = None
        self.optuna_seconds += time.perf_counter() - started

    def on_train_start(self, trainer: TrainerView) -> None:
        for record in trainer.history:
            self._report(record)

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        if self.prune_at is not None:
            import optuna

            raise optuna.TrialPruned(f"pruned after epoch {self.prune_at}")

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        self._report(record)

    def on_train_failed(self, trainer: TrainerView, exc: BaseException) -> None:
        self.steps_at_failure = trainer.global_step


@dataclass(frozen=True)
class TrialOutcome:
    """How a trial ended: its state, value (None when pruned), optimizer steps and epochs (from the run's record),
    its wall time in seconds (this process only) and the part of it spent reporting to Optuna and pruning."""

    state: str
    value: float | None
    steps: int
    epochs: int
    seconds: float
    optuna_seconds: float = 0.0


def recorded_steps(run_dir: Path) -> tuple[int, int]:
    """(optimizer steps, epochs) of the finished epochs in the run's ``metrics.json`` (0, 0 before the first)."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return 0, 0
    epochs = atomic.read_json(path, "run metrics")["epochs"]
    return sum(int(e["steps"]) for e in epochs), len(epochs)


def _recorded_outcome(run_dir: Path, scorer: Scorer, seconds: float) -> TrialOutcome | None:
    """The outcome a run's record already holds (a trial whose worker died after training, before telling the
    study), else None (the run must be trained, or resumed)."""
    if not (run_dir / "run.json").is_file():
        return None
    run = atomic.read_json(run_dir / "run.json", "run description")
    steps, epochs = recorded_steps(run_dir)
    if run.get("status") == "completed":
        final = atomic.read_json(run_dir / "metrics.json", "run metrics")["final"]
        return TrialOutcome(COMPLETE, scorer(final["val"]), steps, epochs, seconds)
    if run.get("status") == "failed" and str(run.get("error", "")).startswith("TrialPruned"):
        return TrialOutcome(PRUNED, None, steps, epochs, seconds)
    return None


def run_trial(trainer_args: Mapping[str, Any], run_dir: Path, trial: optuna.Trial, scorer: Scorer,
              resume: optuna.trial.FrozenTrial | None = None, judge: bool = True) -> TrialOutcome:
    """Train one trial into ``run_dir`` (``trainer_args``: the bench, search data and config of
    :class:`~mtlflow.engine.trainer.Trainer`); ``resume``: the trial as the study holds it, whose worker died,
    and whose run is continued from its checkpoint; ``judge=False``: the epochs are not reported to the pruner."""
    import optuna

    started = time.perf_counter()
    if resume is not None:
        known = _recorded_outcome(run_dir, scorer, 0.0)
        if known is not None:
            return known
    reporter = TrialReporter(trial, scorer, *(() if resume is None else
                                              (resume.intermediate_values, resume.user_attrs.get(PRUNED_AFTER))),
                             judge=judge)
    try:
        with run_dir_guard(run_dir, resume=resume is not None):
            trainer = Trainer(trainer_args["bench"], trainer_args["data"], trainer_args["config"], run_dir,
                              progress=False, callbacks=[reporter], eval_splits=SEARCH_SPLITS)
            trainer.fit(resume=resume is not None)
    except optuna.TrialPruned:
        steps, epochs = recorded_steps(run_dir)
        return TrialOutcome(PRUNED, None, steps, epochs, time.perf_counter() - started, reporter.optuna_seconds)
    except NonFiniteLossError:
        steps, epochs = recorded_steps(run_dir)
        return TrialOutcome(DIVERGED, math.inf, max(steps, reporter.steps_at_failure or 0), epochs,
                            time.perf_counter() - started, reporter.optuna_seconds)
    # the epoch the run's selection rule keeps (its "final" metrics): the model this configuration delivers
    value = scorer(atomic.read_json(run_dir / "metrics.json", "run metrics")["final"]["val"])
    steps, epochs = recorded_steps(run_dir)
    return TrialOutcome(COMPLETE, value, steps, epochs, time.perf_counter() - started, reporter.optuna_seconds)
