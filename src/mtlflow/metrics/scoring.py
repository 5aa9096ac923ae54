"""Multi-task scores: Δm%, mean rank, hypervolume and Pareto (non-dominated) sets.

* Δm% (Maninis et al., CVPR 2019; Eq. 14 of the COST paper):
  Δm = (1/N) Σ_{k} (-1)^{δ_k} (M_m,k - M_b,k) / M_b,k x 100 over all N task metrics, where
  δ_k = 1 if higher is better. Lower is better; 0 means "as good as the single-task references".
* Mean rank: for each metric, methods are ranked (1 = best, ties share the mean rank); a method's
  MR is the mean of its ranks over all metrics. It depends on the method set, which is recorded.
* Hypervolume: the volume dominated by a set of per-task error vectors up to a fixed reference
  point (``moocore.hypervolume``; minimisation). Points not strictly better than the reference in
  every coordinate contribute nothing.
* Pareto set: the points not dominated by any other (≤ in all coordinates, < in one).

Over seeds (:mod:`mtlflow.metrics.intervals` holds the bootstrap): the per-task Δ% (:func:`task_delta`), the
hypervolume on errors scaled by each task's reference error (:func:`normalised_hypervolume`), the Pareto set
at 95 % (:func:`confident_pareto_mask`) and the interval of the mean rank (:func:`mean_rank_interval`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.intervals import bootstrap_interval, difference_interval

MetricTable = Mapping[str, Mapping[str, float]]          # task -> metric -> value
Specs = Mapping[str, Mapping[str, Mapping[str, bool]]]   # task -> metric -> {"higher_is_better": ...}


def delta_m(values: MetricTable, references: MetricTable, specs: Specs,
            metrics: Mapping[str, Sequence[str]] | None = None) -> float:
    """Δm% of ``values`` against single-task ``references`` over the selected metrics per task.

    ``metrics`` defaults to every metric of each task except the training loss.
    """
    terms = []
    for task, ref_metrics in references.items():
        if task not in values:
            raise InvalidParameterError(f"Δm: results lack task {task!r} present in the references")
        names = metrics[task] if metrics is not None else [m for m in ref_metrics if m != "loss"]
        for name in names:
            ref = float(ref_metrics[name])
            if ref == 0:
                raise InvalidParameterError(f"Δm: reference {task}/{name} is 0, so relative change is undefined")
            sign = -1.0 if specs[task][name]["higher_is_better"] else 1.0
            terms.append(sign * (float(values[task][name]) - ref) / abs(ref))
    if not terms:
        raise InvalidParameterError("Δm: no metric to compare")
    return 100.0 * float(np.mean(terms))


def comparable_metrics(references: MetricTable) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The metrics of each task that Δm% can use against ``references`` (not the loss; a reference of 0 or
    NaN has no relative change: a single-task F1 of 0, a ROC-AUC on a split with one class) and those left
    out, per task."""
    usable: dict[str, list[str]] = {}
    excluded: dict[str, list[str]] = {}
    for task, ref_metrics in references.items():
        names = [m for m in ref_metrics if m != "loss"]
        usable[task] = [m for m in names if np.isfinite(ref_metrics[m]) and ref_metrics[m] != 0]
        if len(usable[task]) < len(names):
            excluded[task] = [m for m in names if m not in usable[task]]
    return usable, excluded


def rank_with_ties(scores: Sequence[float], higher_is_better: bool) -> list[float]:
    """Ranks (1 = best) with ties sharing their mean rank; a NaN score (a metric undefined for that method) ranks
    after every number, and the NaNs tie with each other (their order in ``scores`` says nothing)."""
    arr = np.asarray(scores, dtype=float)
    key = -arr if higher_is_better else arr
    order = np.argsort(key, kind="mergesort")  # NaNs last
    ranks = np.empty(len(arr))
    i = 0
    while i < len(arr):
        j = i
        while j + 1 < len(arr) and (key[order[j + 1]] == key[order[i]]
                                    or (np.isnan(key[order[j + 1]]) and np.isnan(key[order[i]]))):
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks.tolist()


def mean_rank(results: Mapping[str, MetricTable], specs: Specs,
              metrics: Mapping[str, Sequence[str]] | None = None) -> dict[str, float]:
    """MR of every method in ``results`` (method -> task -> metric -> value) over the given metrics."""
    methods = list(results)
    if not methods:
        return {}
    first = results[methods[0]]
    columns = [(t, m) for t in first for m in (metrics[t] if metrics is not None else
                                               [x for x in first[t] if x != "loss"])]
    totals = np.zeros(len(methods))
    for task, metric in columns:
        ranks = rank_with_ties([results[name][task][metric] for name in methods],
                               specs[task][metric]["higher_is_better"])
        totals += ranks
    return {name: float(total / len(columns)) for name, total in zip(methods, totals, strict=True)}


def pareto_mask(points: Sequence[Sequence[float]]) -> list[bool]:
    """True for points not dominated by any other (minimisation); duplicates are all kept."""
    pts = np.asarray(points, dtype=float)
    n = len(pts)
    mask = []
    for i in range(n):
        dominated = False
        for j in range(n):
            if j != i and np.all(pts[j] <= pts[i]) and np.any(pts[j] < pts[i]):
                dominated = True
                break
        mask.append(not dominated)
    return mask


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """Hypervolume dominated by ``points`` (minimisation) and bounded by ``reference``."""
    import moocore

    pts = np.asarray(points, dtype=float)
    ref = np.asarray(reference, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != ref.shape[0]:
        raise InvalidParameterError(f"hypervolume: points of shape {pts.shape} do not match a "
                                    f"{ref.shape[0]}-dimensional reference point")
    inside = pts[np.all(pts < ref, axis=1)]
    if len(inside) == 0:
        return 0.0
    return float(moocore.hypervolume(inside, ref=ref))


def task_delta(value: float, reference: float, higher_is_better: bool) -> float:
    """Δ% of one task metric against its single-task reference, oriented like Δm% (positive = worse than the
    reference): ``(-1)^δ (value - reference) / |reference| x 100``; NaN when the reference is 0 or undefined."""
    if not np.isfinite(reference) or reference == 0:
        return float("nan")
    sign = -1.0 if higher_is_better else 1.0
    return 100.0 * sign * (float(value) - reference) / abs(reference)


def normalised_hypervolume(errors: Sequence[Sequence[float]], scale: Sequence[float]) -> float:
    """Hypervolume of ``errors`` divided task by task by ``scale`` (the benchmark's per-task hypervolume
    reference error, in the task's own units) with the reference point 1 in every task: the share of the
    box [0, scale] the points dominate, a number in [0, 1] without units. It orders methods exactly as the
    hypervolume in raw units with reference point ``scale`` does (that one is this times ∏ scale)."""
    pts = np.asarray(errors, dtype=float) / np.asarray(scale, dtype=float)
    return hypervolume(pts, np.ones(pts.shape[1]))


def confident_pareto_mask(per_seed_errors: Sequence[Sequence[Sequence[float]]]) -> list[bool]:
    """True for the methods not dominated with confidence (minimisation). ``per_seed_errors[i]`` holds
    method i's per-task errors, one row per seed.

    Method i is dominated with confidence when some method j is better on every task with 95 % confidence:
    for every task, the stratified bootstrap interval of mean error_j - mean error_i
    (:func:`mtlflow.metrics.intervals.difference_interval`) lies entirely below 0. Requiring every task
    at 95 % is an intersection-union test, so its level is 95 % without a multiple-comparison correction.
    With one seed on either side there is no interval, so nothing is dominated with confidence.
    """
    seeds = [np.asarray(e, dtype=float) for e in per_seed_errors]
    n = len(seeds)

    def dominates(j: int, i: int) -> bool:
        for task in range(seeds[i].shape[1]):
            diff = difference_interval(seeds[j][:, task], seeds[i][:, task])
            if diff.high is None or diff.high >= 0:
                return False
        return True

    return [not any(j != i and dominates(j, i) for j in range(n)) for i in range(n)]


def mean_rank_interval(per_seed_values: Mapping[str, np.ndarray],
                       higher_is_better: Sequence[bool]) -> dict[str, tuple[float, float]] | None:
    """The 95 % interval of every method's mean rank: a bootstrap that resamples each method's seeds
    independently (stratified by method), ranks the methods' resampled means on every column (ties share
    the mean rank, an undefined value ranks last, as in :func:`mean_rank`) and averages the ranks.
    ``per_seed_values[method]`` is a (seeds, columns) array; ``higher_is_better`` orients each column.
    None when a method has a single seed (no interval)."""
    from scipy.stats import rankdata


    methods = list(per_seed_values)
    if len(methods) < 2 or any(len(per_seed_values[m]) < 2 for m in methods):
        return None
    sign = np.where(np.asarray(higher_is_better), -1.0, 1.0)
    oriented = [np.nan_to_num(np.asarray(per_seed_values[m], dtype=float) * sign, nan=np.inf) for m in methods]

    def ranks(*seed_indices: np.ndarray, axis: int = -1) -> np.ndarray:
        # seed_indices[m]: (..., resamples, seeds of m) -> means (methods, ..., resamples, columns)
        means = np.stack([o[idx.astype(int)].mean(axis=-2) for o, idx in zip(oriented, seed_indices, strict=True)])
        return rankdata(means, axis=0).mean(axis=-1)  # (methods, ..., resamples)

    low, high = bootstrap_interval([np.arange(len(o), dtype=float) for o in oriented], ranks)
    return {m: (float(lo), float(hi)) for m, lo, hi in zip(methods, low, high, strict=True)}
