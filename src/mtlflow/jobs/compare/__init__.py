"""The comparison of a sweep's runs: every run (with its evaluation files) loaded once
(:mod:`~mtlflow.jobs.compare.loading`), then pure functions for the rows, ranks, Pareto sets and comparisons
(:mod:`~mtlflow.jobs.compare.rows`, :mod:`~mtlflow.jobs.compare.paired`) and the warnings
(:mod:`~mtlflow.jobs.compare.caveats`), giving the typed :class:`~mtlflow.jobs.compare.summary.Summary` that
``results.json`` serialises (definitions in docs/guides/reading-the-report.md)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow import benchmarks
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.jobs.compare.baselines import baseline_rows, baseline_warnings, check_baselines, split_baselines
from mtlflow.jobs.compare.caveats import comparison_warnings
from mtlflow.jobs.compare.headline import (
    ILL_CONDITIONED_RULE,
    HeadlineChoice,
    delta_m_metrics,
    requested_metrics,
)
from mtlflow.jobs.compare.loading import LoadedRun, load_runs, split_evaluation_name
from mtlflow.jobs.compare.paired import method_examples, paired_rule, paired_versus
from mtlflow.jobs.compare.rows import (
    Setting,
    best_method,
    method_row,
    pareto_sets,
    sample_std,
    seed_versus,
    with_fronts,
    with_ranks,
)
from mtlflow.jobs.compare.summary import (
    SCHEMA,
    DeltaMExcluded,
    HeadlineRule,
    HypervolumeNormalisation,
    MethodRow,
    Paired,
    PaperReferences,
    References,
    ReferenceSource,
    StatisticsRule,
    Summary,
    read_summary,
    to_json,
)
from mtlflow.metrics.intervals import BOOTSTRAP_SEED, CONFIDENCE, N_RESAMPLES, mean_interval
from mtlflow.metrics.scoring import comparable_metrics, normalised_hypervolume

__all__ = ["Summary", "build_references", "paper_reference_table", "read_summary", "reference_table",
           "split_evaluation_name", "summarise", "to_json"]

HYPERVOLUME_OBJECTIVE = "error of each task's primary metric (1 - value for bounded higher-is-better metrics)"
HYPERVOLUME_DEFINITION = ("each task's error divided by the benchmark's hypervolume reference error of that task "
                          "(hypervolume_reference_point, in the task's units), reference point 1 per task: the share "
                          "of the box [0, reference] a method dominates; per seed, then mean and 95 % interval")
INTERVAL_RULE = ("percentile bootstrap over seeds (scipy.stats.bootstrap); differences and mean ranks resample each "
                 "method's seeds independently (stratified by method)")


def reference_table(refs: Sequence[LoadedRun], split: str = "test") -> References:
    """Single-task reference metrics: per task, the mean over seeds of the selected final metrics (``metrics``,
    what Δm% divides by) and their 95 % intervals over seeds (``intervals``)."""
    per_task: dict[str, list[Mapping[str, float]]] = {}
    hashes, sources, specs = set(), [], {}
    for ref in refs:
        if len(ref.tasks) != 1:
            raise InvalidParameterError(f"reference run {ref.dir} trains {len(ref.tasks)} tasks; "
                                        "references must be single-task runs (--tasks NAME)")
        task = ref.tasks[0]
        per_task.setdefault(task, []).append(ref.final(split)[task])
        specs[task] = ref.metrics["metric_specs"][task]
        hashes.add(ref.run["data_hash"])
        sources.append(ReferenceSource(run=ref.dir, task=task, seed=ref.seed, selection=ref.selection_rule))
    if len(hashes) > 1:
        raise DataError("reference runs were trained on different data versions; use one prepared dataset")
    return References(
        split=split, data_hash=hashes.pop() if hashes else None,
        metrics={task: {m: statistics.fmean(v[m] for v in values) for m in values[0]}
                 for task, values in per_task.items()},
        intervals={task: {m: mean_interval([v[m] for v in values]) for m in values[0]}
                   for task, values in per_task.items()},
        metric_specs=specs, sources=tuple(sources))


def build_references(reference_runs: Sequence[Mapping[str, Any]], split: str = "test") -> dict[str, Any]:
    """:func:`reference_table` of :func:`~mtlflow.engine.rundir.read_run` records, in its JSON form (results.json's
    ``references``)."""
    return to_json(reference_table(load_runs(reference_runs, split, with_evaluations=False), split))


def paper_reference_table(run: Mapping[str, Any], tasks: Sequence[str], wanted: bool | None) -> PaperReferences | None:
    """The benchmark's published single-task metrics for ``tasks``, or None: ``wanted`` None adds them when the
    benchmark has them, True requires them, False leaves them out."""
    if wanted is False:
        return None
    bench = benchmarks.build(run["benchmark"], **run.get("benchmark_config", {}))
    published = bench.published_references()
    metrics = published.restricted(tasks) if published is not None else {}
    if not metrics:
        if wanted:
            raise InvalidParameterError(f"benchmark {run['benchmark']!r} publishes no single-task references for "
                                        f"tasks {list(tasks)}; drop --paper-references")
        return None
    return PaperReferences(label=published.label, source=published.source, note=published.note, metrics=metrics)


def _groups(runs: Sequence[LoadedRun]) -> dict[str, list[LoadedRun]]:
    """The runs by method label (in the order given), refused when they mix benchmarks, data versions or task
    sets, or repeat a method and seed."""
    benches = {r.run["benchmark"] for r in runs}
    if len(benches) > 1:
        raise InvalidParameterError(f"runs mix benchmarks {sorted(benches)}; aggregate one benchmark at a time")
    if len({r.run["data_hash"] for r in runs}) > 1:
        raise DataError("runs were trained on different data versions; aggregate runs of one prepared dataset")
    groups: dict[str, list[LoadedRun]] = {}
    for r in runs:
        if r.tasks != runs[0].tasks:
            raise InvalidParameterError(f"run {r.dir} has tasks {r.tasks}, expected {runs[0].tasks}")
        groups.setdefault(r.label, []).append(r)
    for label, group in groups.items():
        dirs_by_seed: dict[int, list[str]] = {}
        for g in group:
            dirs_by_seed.setdefault(g.seed, []).append(g.dir)
        for seed, dirs in dirs_by_seed.items():
            if len(dirs) > 1:  # the same experiment twice would count as extra seeds with zero spread
                raise InvalidParameterError(f"runs {', '.join(dirs)} are all {label} with seed {seed}; "
                                            "keep one run per method and seed")
    return groups


def _reference_spreads(refs: Sequence[LoadedRun], split: str) -> dict[str, dict[str, float]]:
    """Per task and metric, the sample standard deviation of the single-task references over their seeds."""
    per_task: dict[str, list[Mapping[str, float]]] = {}
    for ref in refs:
        per_task.setdefault(ref.tasks[0], []).append(ref.final(split)[ref.tasks[0]])
    return {t: {m: sample_std([v[m] for v in values]) for m in values[0]} for t, values in per_task.items()}


def _setting(runs: Sequence[LoadedRun], refs: Sequence[LoadedRun], split: str,
             paper_references: bool | None) -> tuple[Setting, DeltaMExcluded, tuple[str, ...]]:
    """What every row shares, the metrics Δm% leaves out (reference 0 or undefined) and why the headline leaves
    out or replaces a metric (:mod:`~mtlflow.jobs.compare.headline`)."""
    first = runs[0].metrics
    tasks = first["tasks"]
    references = reference_table(refs, split) if refs else None
    if references and references.data_hash != runs[0].run["data_hash"]:
        raise DataError("single-task references were trained on another data version than the runs")
    paper = paper_reference_table(runs[0].run, tasks, paper_references)
    rule = benchmarks.get(runs[0].run["benchmark"]).headline_metrics(runs[0].run.get("benchmark_config", {}))
    requested = requested_metrics(rule, tasks, first["primary_metrics"], runs[0].final(split))
    own = delta_m_metrics(requested, references.metrics, _reference_spreads(refs, split), first["metric_specs"],
                          "own single-task references") if references else HeadlineChoice({}, ())
    published = delta_m_metrics(requested, paper.metrics, None, first["metric_specs"],
                                f"{paper.label}") if paper else HeadlineChoice({}, ())
    notes = [*own.notes, *published.notes]
    if paper and not any(published.metrics.values()):
        notes.append(f"no Δm% against {paper.label}: it publishes none of the metrics the headline averages")
        paper = None
    own_excluded = comparable_metrics(references.metrics)[1] if references else {}
    paper_excluded = comparable_metrics(paper.metrics)[1] if paper else {}
    setting = Setting(split=split, tasks=tuple(tasks), specs=first["metric_specs"], primary=first["primary_metrics"],
                      scale=tuple(float(first["hv_reference"][t]) for t in tasks), references=references,
                      paper=paper, own_usable=own.metrics, paper_usable=published.metrics, ranked=requested,
                      headline_rule=rule)
    if references and not setting.has_delta_m:
        notes.append("no Δm%: no metric the headline averages has a well-conditioned single-task reference; "
                     "methods are ordered by mean rank")
    excluded = DeltaMExcluded(
        references={t: tuple(m for m in names if m in requested[t]) for t, names in own_excluded.items()
                    if set(names) & set(requested[t])},
        paper_references={t: tuple(m for m in names if m in requested[t]) for t, names in paper_excluded.items()
                          if set(names) & set(requested[t])})
    return setting, excluded, tuple(notes)


def _with_versus(rows: dict[str, MethodRow], groups: Mapping[str, Sequence[LoadedRun]], setting: Setting,
                 baseline: str | None, best: str) -> dict[str, MethodRow]:
    """Each row against LS and the best method: over seeds, and paired over the shared test examples (LS as the
    best: one comparison serves both roles)."""
    examples = {label: method_examples(label, groups[label], setting.tasks) for label in rows}
    paired: dict[tuple[str, str], Paired] = {}
    compared = {}
    for label, row in rows.items():
        versus = {}
        for role, other in (("ls", baseline), ("best", best)):
            if other is None or other == label:
                continue
            if (label, other) not in paired:
                paired[(label, other)] = paired_versus(label, other, examples, setting.specs, setting.primary)
            versus[role] = dataclasses.replace(seed_versus(row, rows[other], setting, groups),
                                               paired=paired[(label, other)])
        compared[label] = dataclasses.replace(row, versus=versus)
    return compared


def compare_runs(runs: Sequence[LoadedRun], refs: Sequence[LoadedRun], method_set: Sequence[str] | None = None,
                 split: str = "test", paper_references: bool | None = None,
                 baselines: Sequence[LoadedRun] = ()) -> Summary:
    """The :class:`Summary` of loaded runs (grouped by method) against loaded single-task references, with the
    loaded ``baselines`` beside them (:mod:`~mtlflow.jobs.compare.baselines`)."""
    groups = _groups(runs)
    declared = list(method_set) if method_set else sorted(groups)
    missing = [m for m in declared if m not in groups]
    if missing:
        raise InvalidParameterError(f"declared method set names {missing} but no run has that method; "
                                    f"runs have: {', '.join(sorted(groups))}")
    setting, excluded, headline_notes = _setting(runs, refs, split, paper_references)
    rows = {label: method_row(label, group, setting) for label, group in sorted(groups.items())}
    rows = with_ranks(rows, groups, declared, setting)
    rows, pareto_set, pareto_confident = pareto_sets(rows)
    rows, front_methods = with_fronts(rows, groups, setting)
    best = best_method(rows, declared, by_delta_m=setting.has_delta_m)
    baseline = "ls" if "ls" in rows else None
    rows = _with_versus(rows, groups, setting, baseline, best)
    check_baselines(baselines, runs[0], setting.tasks)
    yardsticks = baseline_rows(baselines, groups, setting)
    scale = list(setting.scale)
    return Summary(
        schema=SCHEMA, benchmark=runs[0].run["benchmark"],
        dataset=runs[0].run.get("dataset", runs[0].run["benchmark"]), data_hash=runs[0].run["data_hash"],
        split=split, tasks=setting.tasks, metric_specs=setting.specs, primary_metrics=setting.primary,
        hypervolume_reference_point=setting.scale, hypervolume_objective=HYPERVOLUME_OBJECTIVE,
        hypervolume_normalised=HypervolumeNormalisation(scale=setting.scale, reference_point=(1.0,) * len(scale),
                                                        definition=HYPERVOLUME_DEFINITION),
        hypervolume_all_methods=normalised_hypervolume([list(rows[m].primary_errors) for m in sorted(rows)], scale),
        pareto_set=tuple(pareto_set), pareto_set_confident=tuple(pareto_confident),
        preference_front_methods=tuple(front_methods), mean_rank_method_set=tuple(declared),
        selection_rules=tuple(sorted({r.selection_rule for r in runs})), references=setting.references,
        paper_references=setting.paper, delta_m_excluded=excluded,
        statistics=StatisticsRule(confidence=CONFIDENCE, n_resamples=N_RESAMPLES, bootstrap_seed=BOOTSTRAP_SEED,
                                  interval=INTERVAL_RULE, paired=paired_rule()),
        baseline=baseline, best_method=best, best_by="delta_m" if setting.has_delta_m else "mean_rank",
        methods=rows, baselines=yardsticks or None,
        warnings=(*baseline_warnings(yardsticks, rows, setting),
                  *comparison_warnings(rows, runs, refs, setting, excluded.references), *headline_notes),
        headline=HeadlineRule(rule=setting.headline_rule, delta_m_metrics=_tuples(setting.own_usable),
                              delta_m_paper_metrics=_tuples(setting.paper_usable),
                              mean_rank_metrics=_tuples(setting.ranked), ill_conditioned=ILL_CONDITIONED_RULE))


def _tuples(metrics: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    return {t: tuple(names) for t, names in metrics.items()}


def summarise(runs: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]],
              method_set: Sequence[str] | None = None, split: str = "test",
              paper_references: bool | None = None, evaluations: Sequence[str | Path] = (),
              baselines: Sequence[Mapping[str, Any]] = ()) -> Summary:
    """The comparison of ``runs`` (:func:`~mtlflow.engine.rundir.read_run` records, grouped by method) against
    the single-task ``refs``: every number a mean over seeds with its 95 % interval
    (:mod:`mtlflow.metrics.intervals`), each method against LS and against the best method, the Pareto sets, the
    warnings and the verdict.

    Where both methods' runs kept per-example values of the same test split (the ``evaluations`` files, or the
    runs' own ``<split>_evaluation.json`` / ``evaluation.json``), each comparison also holds ``paired``: the paired
    bootstrap over test examples of :func:`mtlflow.metrics.paired.compare_methods` (each example's error averaged
    over a method's seeds); otherwise ``paired`` says why there is none.

    ``baselines`` (records of :mod:`mtlflow.jobs.baselines`' directories, also taken from ``runs`` by their
    ``kind``) become the summary's ``baselines``: yardsticks in no Δm%, mean rank or Pareto set, each paired with
    every method over the test examples, and the warnings "learned nothing" and "a classical per-task model beats
    every multi-task method"."""
    runs, among_runs = split_baselines(runs)
    if not runs:
        raise InvalidParameterError("the runs given are all baselines; give the sweep's trained runs too")
    return compare_runs(load_runs(runs, split, evaluations), load_runs(refs, split, with_evaluations=False),
                        method_set=method_set, split=split, paper_references=paper_references,
                        baselines=load_runs([*among_runs, *baselines], split))
