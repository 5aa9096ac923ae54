"""The statistics of a comparison, as pure functions of the loaded runs: each method's row (means, intervals,
Δm%, hypervolume), the mean ranks, the Pareto sets, the learned fronts and the comparisons over seeds."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtlflow.jobs.compare.loading import LoadedRun
from mtlflow.jobs.compare.summary import (
    DeltaM,
    MeanRank,
    MethodRow,
    MetricTable,
    PaperReferences,
    PreferenceFront,
    References,
    SeedComparison,
    Versus,
    from_json,
)
from mtlflow.metrics.intervals import compare, mean_interval
from mtlflow.metrics.scoring import (
    confident_pareto_mask,
    delta_m,
    hypervolume,
    mean_rank,
    mean_rank_interval,
    normalised_hypervolume,
    pareto_mask,
    task_delta,
)
from mtlflow.metrics.task import metric_error
from mtlflow.pareto.front import attach_fronts


@dataclass(frozen=True)
class Setting:
    """What every row of one comparison shares: the tasks, their metrics and the references."""

    split: str
    tasks: tuple[str, ...]
    specs: dict[str, dict[str, dict[str, Any]]]
    primary: dict[str, str]
    scale: tuple[float, ...]  # each task's hypervolume reference error
    references: References | None
    paper: PaperReferences | None
    own_usable: dict[str, list[str]]  # per task, the metrics Δm% averages against ``references``
    paper_usable: dict[str, list[str]]  # ... and against ``paper``
    ranked: dict[str, list[str]]  # per task, the metrics the mean rank averages
    headline_rule: str = "primary"  # :data:`mtlflow.jobs.compare.headline.HEADLINE_RULES`

    @property
    def has_delta_m(self) -> bool:
        """Whether Δm% against the own references has a metric to average."""
        return self.references is not None and any(self.own_usable.values())

    def errors(self, values: MetricTable) -> tuple[float, ...]:
        """The error of each task's primary metric (:func:`mtlflow.metrics.task.metric_error`)."""
        return tuple(metric_error(values[t][self.primary[t]], self.specs[t][self.primary[t]]["higher_is_better"],
                                  self.specs[t][self.primary[t]]["unit_interval"]) for t in self.tasks)


def sample_std(values: Sequence[float]) -> float:
    """The seeds' sample standard deviation (0 for one seed); NaN, not an error, when a value is NaN (a metric
    undefined for one seed), which ``statistics.stdev`` cannot take."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _delta_m(finals: Sequence[MetricTable], references: MetricTable, setting: Setting,
             usable: Mapping[str, Sequence[str]]) -> DeltaM:
    per_seed = [delta_m(f, references, setting.specs, usable) for f in finals]
    interval = mean_interval(per_seed)
    return DeltaM(mean=interval.mean, std=sample_std(per_seed), per_seed=tuple(per_seed), interval=interval)


def _delta_task(finals: Sequence[MetricTable], references: MetricTable, setting: Setting) -> dict[str, Any]:
    """Per task with a reference, the Δ% of its primary metric against it, over seeds."""
    primary, specs = setting.primary, setting.specs
    return {t: mean_interval([task_delta(f[t][primary[t]], references[t][primary[t]],
                                         specs[t][primary[t]]["higher_is_better"]) for f in finals])
            for t in setting.tasks if t in references}


def method_row(label: str, group: Sequence[LoadedRun], setting: Setting) -> MethodRow:
    """One method over its seeds (sorted by seed), before ranks, Pareto sets and comparisons."""
    group = sorted(group, key=lambda g: g.seed)
    finals = [g.final(setting.split) for g in group]
    tasks, scale = setting.tasks, list(setting.scale)
    mean = {t: {m: statistics.fmean(f[t][m] for f in finals) for m in finals[0][t]} for t in tasks}
    seed_errors = tuple(setting.errors(f) for f in finals)
    seed_hv = [normalised_hypervolume([list(e)], scale) for e in seed_errors]
    hv = mean_interval(seed_hv)
    references, paper = setting.references, setting.paper
    return MethodRow(
        method=label, seeds=tuple(g.seed for g in group), runs=tuple(g.dir for g in group),
        selection=tuple(sorted({g.selection_rule for g in group})), mean=mean,
        std={t: {m: sample_std([f[t][m] for f in finals]) for m in finals[0][t]} for t in tasks},
        intervals={t: {m: mean_interval([f[t][m] for f in finals]) for m in finals[0][t]} for t in tasks},
        primary_errors=setting.errors(mean), primary_errors_per_seed=seed_errors,
        hypervolume=hv.mean, hypervolume_interval=hv, hypervolume_per_seed=tuple(seed_hv),
        hypervolume_raw=hypervolume([list(setting.errors(mean))], scale),
        step_seconds_median=statistics.fmean(g.metrics["epochs"][-1]["step_seconds_median"] for g in group),
        peak_memory_bytes=max(g.metrics["epochs"][-1]["peak_memory_bytes"] for g in group),
        not_converged=tuple(g.dir for g in group if g.not_converged),
        delta_m=_delta_m(finals, references.metrics, setting, setting.own_usable) if setting.has_delta_m else None,
        delta_task=_delta_task(finals, references.metrics, setting) if references else None,
        delta_m_paper=_delta_m(finals, paper.metrics, setting, setting.paper_usable) if paper else None,
        pareto_optimal=False, pareto_confident=False, versus={})


def with_ranks(rows: dict[str, MethodRow], groups: Mapping[str, Sequence[LoadedRun]], declared: Sequence[str],
               setting: Setting) -> dict[str, MethodRow]:
    """The declared methods' mean rank over the headline's metrics (``setting.ranked``: each task's primary
    metric by default), and its interval over seeds (the seeds in the order the runs were given)."""
    specs = setting.specs
    ranks = mean_rank({m: rows[m].mean for m in declared}, specs, setting.ranked)
    columns = [(t, m) for t in setting.tasks for m in setting.ranked[t]]
    intervals = mean_rank_interval(
        {m: np.array([[f[t][c] for t, c in columns] for f in (g.final(setting.split) for g in groups[m])])
         for m in declared},
        [specs[t][c]["higher_is_better"] for t, c in columns])
    ranked = dict(rows)
    for m in declared:
        interval = tuple(intervals[m]) if intervals else None
        ranked[m] = dataclasses.replace(rows[m], mean_rank=MeanRank(mean=ranks[m], interval=interval))
    return ranked


def pareto_sets(rows: dict[str, MethodRow]) -> tuple[dict[str, MethodRow], list[str], list[str]]:
    """Each row's Pareto membership by the means and with confidence, and the two sets (sorted)."""
    labels = sorted(rows)
    mask = pareto_mask([list(rows[m].primary_errors) for m in labels])
    confident = confident_pareto_mask([[list(e) for e in rows[m].primary_errors_per_seed] for m in labels])
    marked = {m: dataclasses.replace(rows[m], pareto_optimal=bool(keep), pareto_confident=bool(sure))
              for m, keep, sure in zip(labels, mask, confident, strict=True)}
    return ({m: marked[m] for m in rows}, [m for m, keep in zip(labels, mask, strict=True) if keep],
            [m for m, keep in zip(labels, confident, strict=True) if keep])


def with_fronts(rows: dict[str, MethodRow], groups: Mapping[str, Sequence[LoadedRun]],
                setting: Setting) -> tuple[dict[str, MethodRow], list[str]]:
    """Pareto-front methods (PaLoRA) also get their whole front and the methods it dominates
    (:func:`mtlflow.pareto.front.attach_fronts`); returns the rows and the front methods."""
    records = {m: {"primary_errors": list(row.primary_errors)} for m, row in rows.items()}
    labels = attach_fronts(records, {m: [{"metrics": g.metrics} for g in group] for m, group in groups.items()},
                           setting.split, list(setting.tasks), setting.primary, setting.specs)
    fronted = dict(rows)
    for m in labels:
        front = from_json(PreferenceFront, records[m]["preference_front"], f"the front of {m}")
        fronted[m] = dataclasses.replace(rows[m], preference_front=front)
    return fronted, labels


def best_method(rows: Mapping[str, MethodRow], declared: Sequence[str], by_delta_m: bool) -> str:
    """The declared method with the lowest Δm% (with references) or mean rank; an undefined (NaN) one last."""
    def score(m: str) -> float:
        return rows[m].delta_m.mean if by_delta_m else rows[m].mean_rank.mean

    return min(declared, key=lambda m: (not np.isfinite(score(m)), score(m), m))


def seed_versus(mine: MethodRow, other: MethodRow, setting: Setting,
                groups: Mapping[str, Sequence[LoadedRun]]) -> Versus:
    """One method against another over seeds: each task's primary metric and Δm% (when references exist)."""
    def per_seed(row: MethodRow, task: str) -> list[float]:
        group = sorted(groups[row.method], key=lambda g: g.seed)
        return [g.final(setting.split)[task][setting.primary[task]] for g in group]

    lower = {t: not setting.specs[t][setting.primary[t]]["higher_is_better"] for t in setting.tasks}
    tasks = {t: SeedComparison.of(compare(per_seed(mine, t), per_seed(other, t), lower_is_better=lower[t]))
             for t in setting.tasks}
    delta_m = None
    if mine.delta_m is not None and other.delta_m is not None:
        delta_m = SeedComparison.of(compare(list(mine.delta_m.per_seed), list(other.delta_m.per_seed),
                                            lower_is_better=True))
    return Versus(tasks=tasks, delta_m=delta_m)
