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
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from mtlflow.core.errors import InvalidParameterError

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
    return {name: float(total / len(columns)) for name, total in zip(methods, totals)}


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
