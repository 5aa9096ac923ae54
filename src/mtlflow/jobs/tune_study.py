"""The Optuna side of ``mtlflow tune``: storage, sampler, pruner, the search space as distributions, the budget
and which worker runs which trial.

**Storage.** Every study of a tuning run lives in one journal file in its work directory
(``JournalStorage(JournalFileBackend(<out>/study.journal))``): an append-only log that several processes on one
file system share (no SQLite "database is locked"), and that ``optuna-dashboard <out>/study.journal`` opens.

**Sampler and pruner.** The same for every study: Optuna's TPE with every argument whose default Optuna 5 changed
or may change passed explicitly (``SAMPLER_SETTINGS``; the arguments Optuna 5 deprecates -- consider_prior,
prior_weight, consider_magic_clip, consider_endpoints, gamma, weights -- are fixed by Optuna and warn when given),
reseeded for every trial from (seed, trial number), so that a study resumed in a new process draws what an
uninterrupted one draws (and studies over the same space start from the same random configurations: common random
numbers across methods); successive halving (or Hyperband) over epochs with every argument explicit. The
``grid`` sampler (Optuna's GridSampler over a space of categorical ranges, each point once in a seeded order) is
the exhaustive reference the multi-fidelity search is measured against (:mod:`mtlflow.experiments.tune_bench`).

**Budget.** Every study gets the same budget in optimizer steps. A trial is started only while the budget covers a
whole trial on top of the steps of the finished trials (their own record) and a whole trial for each running one,
so a study never spends more than its budget and leaves less than one trial unspent; pruned trials count the
steps they ran.

**Workers and resume.** Each ``tune`` process is a worker holding a lock file (``workers/<id>.lock``) for its
life; a trial records its worker. A RUNNING trial whose worker's lock is free was left by a killed process: the
next worker to claim a trial adopts it -- same trial, same number, same parameters -- and continues its run from
the checkpoint, so no trial is lost or repeated, and its steps count once (from the resumed run's record).
Claims are made holding the study lock (``study.lock``), so two workers never claim the same trial or budget.
"""

from __future__ import annotations

import contextlib
import functools
import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange
from mtlflow.core.locks import file_lock, file_lock_or_fail

if TYPE_CHECKING:  # pragma: no cover
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.storages import JournalStorage
    from optuna.trial import FrozenTrial

JOURNAL_NAME = "study.journal"
STUDY_LOCK = "study.lock"
WORKERS_DIR = "workers"

#: TPESampler's arguments besides the seed, all explicit (Optuna 5 made multivariate default to None -- on for one
#: objective -- and constant_liar default to True); constant_liar keeps parallel workers off running trials' points
SAMPLER_SETTINGS: dict[str, Any] = {"multivariate": True, "group": False, "constant_liar": True,
                                    "n_ei_candidates": 24}
#: the default number of random trials before TPE models the history (Optuna's default, explicit)
STARTUP_TRIALS = 10
PRUNERS = ("successive-halving", "hyperband", "none")
SAMPLERS = ("tpe", "grid")
#: successive halving: rungs at epochs 1, 3, 9, ... (min_resource x reduction_factor^k); Optuna's defaults are
#: min_resource "auto" (from the first finished trials) and reduction_factor 4
HALVING_SETTINGS: dict[str, Any] = {"min_resource": 1, "reduction_factor": 3, "min_early_stopping_rate": 0,
                                    "bootstrap_count": 0}

#: the trial attributes a study's trials carry
WORKER, STEPS, RUN_DIR = "worker", "steps", "run_dir"


def storage(work_dir: Path) -> JournalStorage:
    """The journal storage of a tuning run's studies (created on first use)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(work_dir / JOURNAL_NAME)))


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial ``number`` of a study seeded ``seed`` (independent streams per trial)."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def build_sampler(seed: int, startup_trials: int = STARTUP_TRIALS,
                  grid: Mapping[str, list[Any]] | None = None) -> optuna.samplers.BaseSampler:
    """TPE (the search), or with ``grid`` (``{setting: values}``) Optuna's GridSampler over it."""
    import optuna

    if grid is not None:
        return _ask_tell_grid_sampler()(dict(grid), seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, **SAMPLER_SETTINGS)


@functools.cache
def _ask_tell_grid_sampler() -> type:
    """GridSampler without its ``study.stop()`` after the last point: that works inside ``study.optimize`` only,
    and a tuning study is driven by ask and tell, its budget (the grid's size) ending it."""
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return AskTellGridSampler


def grid_of(space: Mapping[str, SearchRange]) -> dict[str, list[Any]]:
    """The grid of a space whose every range is categorical (the ``grid`` sampler's points)."""
    open_ranges = sorted(name for name, search in space.items() if search.scale != "categorical")
    if open_ranges:
        raise InvalidParameterError(f"the grid sampler needs categorical ranges; {', '.join(open_ranges)} "
                                    "is not (give it as {choices: [...]} in the search space)")
    return {name: list(search.choices) for name, search in space.items()}


def pruner_settings(kind: str, max_epochs: int) -> dict[str, Any]:
    """The pruner's name and every argument it is built with (recorded in the tune result)."""
    if kind == "successive-halving":
        return {"name": "SuccessiveHalvingPruner", **HALVING_SETTINGS}
    if kind == "hyperband":
        return {"name": "HyperbandPruner", "min_resource": HALVING_SETTINGS["min_resource"], "max_resource": max_epochs,
                "reduction_factor": HALVING_SETTINGS["reduction_factor"], "bootstrap_count": 0}
    if kind == "none":
        return {"name": "NopPruner"}
    raise InvalidParameterError(f"unknown pruner {kind!r}; valid: {', '.join(PRUNERS)}")


def build_pruner(kind: str, max_epochs: int) -> optuna.pruners.BasePruner:
    import optuna

    settings = pruner_settings(kind, max_epochs)
    name = settings.pop("name")
    return getattr(optuna.pruners, name)(**settings)


def distribution(name: str, search: SearchRange) -> BaseDistribution:
    """Optuna's distribution of one search range."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if search.scale == "categorical":
        return CategoricalDistribution(list(search.choices))
    if search.scale == "int":
        return IntDistribution(int(search.low), int(search.high))
    return FloatDistribution(float(search.low), float(search.high), log=search.scale == "log")


@contextlib.contextmanager
def worker_lock(work_dir: Path) -> Iterator[str]:
    """This process as a worker of the tuning run: a fresh id whose lock file is held while it runs."""
    worker = uuid.uuid4().hex[:12]
    path = work_dir / WORKERS_DIR / f"{worker}.lock"
    with file_lock_or_fail(path, lambda: RuntimeError("worker id clash")):
        try:
            yield worker
        finally:  # a missing lock file reads as a dead worker too: nobody else ever takes this id
            path.unlink(missing_ok=True)


def worker_alive(work_dir: Path, worker: str | None) -> bool:
    """Whether the worker ``worker`` still runs (holds its lock); a trial without a worker is not stale."""
    if worker is None:
        return True
    try:
        with file_lock_or_fail(work_dir / WORKERS_DIR / f"{worker}.lock", _WorkerBusy):
            return False
    except _WorkerBusy:
        return True


class _WorkerBusy(Exception):
    """A worker's lock is held: the worker runs."""


def _unfinished(trial: FrozenTrial) -> bool:
    return trial.state.name in ("RUNNING", "WAITING")


def spent_steps(trials: list[FrozenTrial]) -> int:
    """Optimizer steps of the finished trials (each from its run's record, stored as the ``steps`` attribute)."""
    return sum(int(t.user_attrs.get(STEPS, 0)) for t in trials if not _unfinished(t))


@dataclass(frozen=True)
class Claim:
    """A trial for this worker: a new one, or (``adopted``) one whose worker died, to be continued."""

    trial: optuna.Trial
    adopted: FrozenTrial | None


@dataclass(frozen=True)
class Budget:
    """A study's budget in optimizer steps and the length of one whole trial (steps and epochs)."""

    steps: int
    trial_steps: int
    trial_epochs: int

    def allows(self, trials: list[FrozenTrial]) -> bool:
        running = sum(1 for t in trials if _unfinished(t))
        return self.steps - spent_steps(trials) - running * self.trial_steps >= self.trial_steps


def claim_trial(study: optuna.Study, work_dir: Path, worker: str, space: Mapping[str, SearchRange],
                budget: Budget, seed: int, startup_trials: int, grid: bool = False) -> Claim | None:
    """The next trial of ``study`` for ``worker``: a stale one adopted, else a new one while the budget allows,
    else None. Holds the study lock, so that concurrent workers claim different trials and budget."""
    import optuna

    with file_lock(work_dir / STUDY_LOCK):
        trials = study.get_trials(deepcopy=False)
        for frozen in trials:
            if frozen.state.name == "RUNNING" and not worker_alive(work_dir, frozen.user_attrs.get(WORKER)):
                # Optuna has no public handle on an existing trial: Trial(study, id) is what study.ask() returns
                adopted = optuna.trial.Trial(study, frozen._trial_id)
                adopted.set_user_attr(WORKER, worker)
                return Claim(adopted, frozen)
        if not budget.allows(trials):
            return None
        # the grid's order is fixed by the study's seed (GridSampler gives trial n the n-th point of its shuffle)
        study.sampler = (build_sampler(seed, grid=grid_of(space)) if grid else
                         build_sampler(trial_seed(seed, len(trials)), startup_trials))
        trial = study.ask({name: distribution(name, search) for name, search in space.items()})
        trial.set_user_attr(WORKER, worker)
        return Claim(trial, None)


def others_running(study: optuna.Study, work_dir: Path) -> bool:
    """Whether a live worker still runs a trial of ``study`` (a dead worker's trial is adopted, not awaited)."""
    return any(t.state.name == "RUNNING" and worker_alive(work_dir, t.user_attrs.get(WORKER))
               for t in study.get_trials(deepcopy=False))


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed trial of the lowest finite value (the earliest of equal ones), or None."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)]
    return min(done, key=lambda t: (t.value, t.number)) if done else None
