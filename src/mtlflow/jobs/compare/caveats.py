"""What a reader must know before trusting a comparison's table, as pure functions of its rows and runs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from mtlflow.jobs.compare.loading import LoadedRun
from mtlflow.jobs.compare.rows import Setting
from mtlflow.jobs.compare.summary import MethodRow

#: fewer seeds than this and the report warns that the interval rests on too few runs
MIN_SEEDS = 3


def _convergence(rows: Mapping[str, MethodRow], refs: Sequence[LoadedRun]) -> list[str]:
    unconverged = [f"{m} ({len(row.not_converged)} of {len(row.runs)} runs)"
                   for m, row in sorted(rows.items()) if row.not_converged]
    for task in sorted({r.tasks[0] for r in refs}):
        of_task = [r for r in refs if r.tasks[0] == task]
        if any(r.not_converged for r in of_task):
            unconverged.append(f"reference {task} ({sum(r.not_converged for r in of_task)} of {len(of_task)} runs)")
    if not unconverged:
        return []
    return ["not converged: train longer (the validation metric was still improving at the end of "
            f"{', '.join(unconverged)})"]


def _seeds(rows: Mapping[str, MethodRow], refs: Sequence[LoadedRun]) -> list[str]:
    warnings = []
    few = [f"{m} ({len(row.seeds)})" for m, row in sorted(rows.items()) if len(row.seeds) < MIN_SEEDS]
    if few:
        warnings.append(f"fewer than {MIN_SEEDS} seeds: {', '.join(few)}"
                        + (" (1 seed: no interval, no verdict)" if any(len(r.seeds) == 1 for r in rows.values())
                           else " (the bootstrap interval of 2 seeds is their range)"))
    ref_seeds: dict[str, int] = {}
    for r in refs:
        ref_seeds[r.tasks[0]] = ref_seeds.get(r.tasks[0], 0) + 1
    few_refs = [f"{t} ({n})" for t, n in sorted(ref_seeds.items()) if n < MIN_SEEDS]
    if few_refs:
        warnings.append(f"single-task references with fewer than {MIN_SEEDS} seeds: {', '.join(few_refs)}")
    return warnings


#: the normal quantile of a two-sided 95 % interval (rounded, as the warning's "about" says)
Z95 = 1.96


def hanley_mcneil_se(auc: float, positives: int, negatives: int) -> float:
    """The standard error of a ROC-AUC estimated from ``positives`` and ``negatives`` examples (Hanley & McNeil
    1982, Radiology 143:29, Eq. 2, with Q1 = A / (2 - A) and Q2 = 2A² / (1 + A))."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc**2) + (negatives - 1) * (q2 - auc**2)) \
        / (positives * negatives)
    return math.sqrt(max(variance, 0.0))


def _sampling_half_width(task: str, metric: str, value: float, runs: Sequence[LoadedRun],
                         setting: Setting) -> tuple[float, int, str] | None:
    """The 95 % half-width of ``metric`` (at ``value``) from the choice of the test examples alone, the number of
    examples, and how it is computed; None when the runs say too little (no split size, no class counts)."""
    spec = setting.specs[task][metric]
    samples = [r.samples[task] for r in runs if task in r.samples]
    n = runs[0].split_size(setting.split, task)
    if metric == "roc_auc":  # a rank statistic: its variance depends on the two classes' sizes, not on n alone
        counted = [s.classes for s in samples if s.classes is not None and min(s.classes) > 0]
        if not counted:
            return None
        positives, negatives = counted[0]
        return (Z95 * hanley_mcneil_se(value, positives, negatives), positives + negatives,
                f"Hanley-McNeil, {positives} positive and {negatives} negative")
    errors = [s.errors for s in samples if s.errors.size > 1]
    if errors and samples[0].statistic == metric and not spec["higher_is_better"]:  # a mean error (MAE)
        se = statistics.fmean(float(np.std(e, ddof=1)) / math.sqrt(e.size) for e in errors)
        return Z95 * se, errors[0].size, "standard error of the mean of the per-example errors"
    if errors and metric == "rmse" and samples[0].statistic == "loss":  # the mean squared error, then its root
        relative = statistics.fmean(float(np.std(e, ddof=1)) / (math.sqrt(e.size) * float(np.mean(e))) / 2
                                    for e in errors if np.mean(e) > 0)
        return (Z95 * value * relative, errors[0].size,
                "standard error of the mean squared error from the per-example values, delta method")
    if spec["unit_interval"] and n is not None:  # a share of examples (exact for accuracy; F1 approximately)
        how = "binomial" if samples and samples[0].statistic == f"{metric}_error" else "binomial approximation"
        return Z95 * math.sqrt(value * (1 - value) / n), n, how
    return None


def _split_too_small(rows: Mapping[str, MethodRow], runs: Sequence[LoadedRun], setting: Setting) -> list[str]:
    """A primary metric whose sampling over the test examples (:func:`_sampling_half_width`) exceeds every seed
    interval, or, with one seed (no interval to compare with), the sampling alone."""
    warnings = []
    for task in setting.tasks:
        metric = setting.primary[task]
        value = statistics.fmean(row.mean[task][metric] for row in rows.values())
        if not math.isfinite(value):
            continue
        sampled = _sampling_half_width(task, metric, value, runs, setting)
        if sampled is None:
            continue
        half, n, how = sampled
        widths = [row.intervals[task][metric].high - row.intervals[task][metric].low
                  for row in rows.values() if row.intervals[task][metric].low is not None]
        alone = (f"{task} has {n} {setting.split} examples, so its {metric} alone varies by about ±{half:.4f} "
                 f"(95 %, {how}) from the choice of test examples")
        if not widths:
            warnings.append(f"1 seed, no seed interval: {alone}; differences smaller than that are not resolved")
        elif 2 * half > max(widths):
            warnings.append(f"test split too small for the interval printed: {alone}, more than the seed intervals "
                            f"(widest {max(widths):.4f}); differences smaller than that are not resolved")
    return warnings


def _degenerate_references(setting: Setting, excluded: Mapping[str, Sequence[str]]) -> list[str]:
    warnings = [f"degenerate single-task reference for {task}: {', '.join(names)} is 0 or undefined, left out of Δm%"
                for task, names in sorted(excluded.items())]
    for task, values in sorted((setting.references.metrics if setting.references else {}).items()):
        metric = setting.primary[task]
        spec = setting.specs[task][metric]
        if spec["unit_interval"] and spec["higher_is_better"] and values.get(metric) == 1.0:
            warnings.append(f"degenerate single-task reference for {task}: {metric} = 1 (no error), a multi-task "
                            f"method can only tie or lose on it")
    return warnings


def comparison_warnings(rows: Mapping[str, MethodRow], runs: Sequence[LoadedRun], refs: Sequence[LoadedRun],
                        setting: Setting, excluded: Mapping[str, Sequence[str]]) -> list[str]:
    """Runs not converged, too few seeds, a test split too small for the printed interval, a degenerate
    single-task reference (``excluded``: the metrics Δm% leaves out, per task)."""
    return [*_convergence(rows, refs), *_seeds(rows, refs), *_split_too_small(rows, runs, setting),
            *_degenerate_references(setting, excluded)]
