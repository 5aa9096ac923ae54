"""The paired comparisons of two methods over their shared test examples (``versus[role].paired``), from the
per-example errors the loaded runs carry."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtlflow.core.errors import DataError
from mtlflow.jobs.compare.loading import LoadedRun, TestSet
from mtlflow.jobs.compare.summary import Paired
from mtlflow.metrics.paired import N_RESAMPLES as PAIRED_RESAMPLES
from mtlflow.metrics.paired import SEED as PAIRED_SEED
from mtlflow.metrics.paired import compare_methods

#: how the ``paired`` entry of a comparison is computed (results.json's ``statistics.paired``)
PAIRED_RULE = ("paired percentile bootstrap over the test examples (scipy.stats.bootstrap, paired; {n_resamples} "
               "resamples, generator seed {seed}) where both methods' runs kept per-example values of the same test "
               "split (same data hash, split and examples): each example's error (the task's paired statistic) is "
               "first averaged over each method's seeds, then this method minus the other; per task at 1 - 0.05/K "
               "(Bonferroni over the K tasks), and the mean over tasks of the per-task differences at 95 % "
               "(mtlflow.metrics.paired, the retrain gate's rule); it measures the sampling of the test examples, "
               "not the seed-to-seed spread")


def paired_rule() -> str:
    return PAIRED_RULE.format(n_resamples=PAIRED_RESAMPLES, seed=PAIRED_SEED)


@dataclass(frozen=True)
class MethodExamples:
    """Every seed's per-example errors of one method (``errors``: task -> one array per seed) on its test set,
    or why a paired comparison of the method is impossible (``verdict`` in short, ``missing`` in full)."""

    test_set: TestSet | None = None
    errors: dict[str, list[np.ndarray]] | None = None
    verdict: str | None = None
    missing: str | None = None


def method_examples(label: str, group: Sequence[LoadedRun], tasks: Sequence[str]) -> MethodExamples:
    """The per-example errors of the runs of one method (in the order the runs were given)."""
    absent = [g.dir for g in group if g.examples is None]
    if absent:
        return MethodExamples(verdict="no per-example values",
                              missing=f"no per-example values for {label} ({len(absent)} of {len(group)} runs, e.g. "
                                      f"{absent[0]})")
    sets = [g.examples.test_set for g in group]
    if any(s != sets[0] for s in sets) or any(len(g.examples.errors[t]) != sets[0].examples
                                               for g in group for t in tasks):
        return MethodExamples(verdict="different test sets",
                              missing=f"the runs of {label} were evaluated on different test sets")
    return MethodExamples(test_set=sets[0], errors={t: [g.examples.errors[t] for g in group] for t in tasks})


def mixed_units(statistics: Mapping[str, str], specs: Mapping[str, Mapping[str, Mapping[str, Any]]],
                primary: Mapping[str, str]) -> str | None:
    """Why the mean over tasks of the per-example errors would add different quantities, or None when every task
    shares the paired statistic, the primary metric and its unit: a 0/1 error (``<metric>_error``) or the loss
    of tasks with the same primary metric (the same loss) is unit-free; any other statistic (an absolute error
    in each target's own units) adds up only where every task's metric spec names the same ``unit``."""
    kinds = {(statistics[t], primary[t]) for t in statistics}
    if len(kinds) > 1:
        return "the tasks' paired errors are of different kinds (" + ", ".join(
            f"{t}: {statistics[t]}" for t in statistics) + ")"
    statistic = next(iter(kinds))[0]
    if statistic.endswith("_error") or statistic == "loss":
        return None
    units = {specs[t][primary[t]].get("unit") for t in statistics}
    if len(units) == 1 and None not in units:
        return None
    return f"each task's {statistic} is in its own target's units"


def paired_versus(label: str, other: str, examples: Mapping[str, MethodExamples],
                  specs: Mapping[str, Mapping[str, Mapping[str, Any]]], primary: Mapping[str, str]) -> Paired:
    """``label`` against ``other``: :func:`mtlflow.metrics.paired.compare_methods` over their shared test
    examples, or why there is none; the mean over tasks (``combined``) only where the tasks' errors share a kind
    and a unit (:func:`mixed_units`; ``combined_note`` says why not)."""
    mine, theirs = examples[label], examples[other]
    fallback = "intervals over seeds only"
    for side in (mine, theirs):
        if side.missing is not None:
            return Paired(available=False, verdict=side.verdict, reason=f"{side.missing}: {fallback}")
    if mine.test_set != theirs.test_set:
        differ = [f.name for f in dataclasses.fields(TestSet)
                  if getattr(mine.test_set, f.name) != getattr(theirs.test_set, f.name)]
        return Paired(available=False, verdict="different test sets",
                      reason=f"{label} and {other} were evaluated on different test sets ({', '.join(differ)} differ): "
                             f"{fallback}")
    try:
        comparison = compare_methods(mine.errors, theirs.errors, mine.test_set.statistics,
                                     n_resamples=PAIRED_RESAMPLES, seed=PAIRED_SEED)
    except DataError as exc:  # e.g. too few labelled test examples: said in the entry, the table stays
        return Paired(available=False, verdict="no paired interval", reason=f"{exc}: {fallback}")
    mixed = mixed_units(mine.test_set.statistics, specs, primary) if len(comparison.tasks) > 1 else None
    return Paired(available=True, confidence=comparison.confidence, task_confidence=comparison.task_confidence,
                  n=comparison.combined.n, combined=None if mixed else comparison.combined,
                  combined_note=f"no mean over tasks: {mixed}" if mixed else None, tasks=comparison.tasks,
                  statistics=mine.test_set.statistics,
                  seeds=(len(next(iter(mine.errors.values()))), len(next(iter(theirs.errors.values())))))
