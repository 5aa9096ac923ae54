"""Paired comparison of two models on the same test examples, and the retrain gate's rule.

Both models are evaluated on the same split; example ``i`` of one is example ``i`` of the other
(:func:`mtlflow.metrics.evaluation.evaluate_examples`). Per task, the per-example difference
``d_i = error_candidate_i - error_baseline_i`` (lower error is better, so ``d < 0`` favours the
candidate) removes what both models share -- how hard each example is -- and its mean is the
difference of the two models' mean errors on that split.

**Interval.** A paired bootstrap over examples (Efron & Tibshirani, *An Introduction to the
Bootstrap*, 1993, ch. 13: the percentile interval) through :func:`scipy.stats.bootstrap`
(``paired=True``, ``method="percentile"``), resampling example indices, so each resample keeps every
example's tasks together. The percentile interval rather than BCa: BCa's jackknife evaluates the
statistic ``n`` more times (17 s instead of 2.5 s for one task of a 10 000-example split on a 2-core
machine) and is undefined when the resampled statistic is constant; for a mean over many examples both
agree to well within the interval's width. The random generator is seeded: the same two models on the
same split give the same interval. When every difference is the same value ``c`` (identical models: ``c = 0``), every
resample's mean is ``c`` and the interval is ``[c, c]``.

**Probability of improvement.** ``P(d < 0) + ½ P(d = 0)`` over the examples: the chance that the
candidate's error on a random test example is lower than the baseline's, ties counting one half
(the probability of improvement of Agarwal et al., *Deep RL at the Edge of the Statistical
Precipice*, NeurIPS 2021, taken over paired test examples instead of runs). 0.5 means no preference.

**Verdict.** ``"better"`` when the whole interval lies below 0, ``"worse"`` when above, else
``"indistinguishable at <level> %"``.

**Several tasks.** Tasks are compared on two levels:

1. *Per task*, at the Bonferroni-corrected level ``1 - α/K`` for ``K`` tasks (Dunn, JASA 1961;
   :func:`bonferroni_confidence`): with probability at least ``1 - α`` no task is declared worse (or
   better) wrongly, whatever the dependence between tasks.
2. *Combined*: the mean over tasks of the per-task mean differences -- the change of the model
   store's score (:func:`mtlflow.ops.model_store.score`: the mean over tasks of each task's primary
   error), at level ``1 - α``, bootstrapped jointly (one resample of examples for all tasks, so the
   correlation between tasks is kept).

**The gate** (:func:`gate`): promote the candidate only when it is *better* on the combined score
(interval entirely below 0), *by at least* ``min_improvement`` (``-mean difference >= min_improvement``,
in the score's units; refused when not below the champion's score, which no candidate can beat by more),
and *non-inferior on every task*: the upper bound of the task's error difference at the corrected level
is at most the task's margin (``margins``, in the task's per-example error units; by default
:data:`DEFAULT_RELATIVE_MARGIN` = 10 % of the champion's mean error on the task). "Not shown worse" is not
"not worse": a candidate whose interval on a task reaches beyond the margin is kept, even when the
interval includes 0, because the split cannot exclude a regression larger than the margin. The decision
names every condition that failed and the smallest difference the split could detect (each interval's
half-width; about ``n (half-width / margin)^2`` examples resolve a margin). A false promotion needs the
combined interval to miss the true difference on the wrong side, which happens with probability about
``α/2`` for two models that are equally good (the bootstrap's coverage is approximate); the per-task
checks only block (a candidate truly worse than the margin on a task passes with probability at most
``α/(2K)`` for that task).

**Two methods of a sweep** (:func:`compare_methods`, the ``paired`` entry of each comparison in
``results.json``): a method is trained with several seeds, each evaluated on the same test split.
Each example's error is first averaged over the method's seeds (:func:`seed_mean_errors`: the
method's expected error on that example, its seed-to-seed noise averaged out), then the two methods'
seed-averaged errors are compared as above -- per task at the Bonferroni-corrected level, and the
mean over tasks at ``1 - α`` -- by :func:`paired_comparison`, the computation the gate decides from.
The interval measures the sampling of the test examples for these trained models; the seeds' own
spread is what the intervals over seeds (:mod:`mtlflow.metrics.intervals`) measure.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mtlflow.core.errors import DataError, InvalidParameterError

#: the gate's family-wise confidence
CONFIDENCE = 0.95
#: bootstrap resamples: enough for the tails of a Bonferroni-corrected interval with several tasks
N_RESAMPLES = 9999
#: resampled values held in memory at once (per sample) while bootstrapping
BATCH_ELEMENTS = 4_000_000
#: seed of the bootstrap's generator (the gate is deterministic for given models and split)
SEED = 0


@dataclass(frozen=True)
class PairedDifference:
    """A paired comparison of two models' per-example errors (candidate minus baseline)."""

    statistic: str
    mean_difference: float
    low: float
    high: float
    confidence: float
    n: int
    probability_of_improvement: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bonferroni_confidence(confidence: float, comparisons: int) -> float:
    """The per-comparison confidence ``1 - (1 - confidence) / comparisons`` that keeps the family-wise
    confidence of ``comparisons`` intervals at least ``confidence`` (Bonferroni)."""
    if not 0 < confidence < 1:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {confidence}")
    if comparisons < 1:
        raise InvalidParameterError(f"need at least one comparison, got {comparisons}")
    return 1.0 - (1.0 - confidence) / comparisons


def verdict(low: float, high: float, confidence: float) -> str:
    """``"better"`` (interval of the error difference below 0), ``"worse"`` (above) or
    ``"indistinguishable at <level> %"``."""
    if high < 0:
        return "better"
    if low > 0:
        return "worse"
    return f"indistinguishable at {100 * confidence:g} %"


def probability_of_improvement(differences: np.ndarray) -> float:
    """``P(d < 0) + ½ P(d = 0)`` over the (non-NaN) per-example error differences."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[~np.isnan(d)]
    if d.size == 0:
        raise DataError("no example has a label for both models; cannot compare them")
    return float(np.mean(d < 0) + 0.5 * np.mean(d == 0))


def _pairs(candidate: np.ndarray, baseline: np.ndarray, what: str) -> np.ndarray:
    """The per-example differences, NaN where either model has no value (a missing label)."""
    cand, base = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if cand.shape != base.shape or cand.ndim != 1:
        raise DataError(f"{what}: the two models' per-example values have shapes {cand.shape} and {base.shape}; "
                        "evaluate both on the same split")
    return cand - base


def _bootstrap(samples: tuple[np.ndarray, ...], statistic, confidence: float, n_resamples: int,
               seed: int) -> tuple[float, float]:
    """The percentile interval of ``statistic`` over paired resamples of the examples. A resample in which
    some task has no labelled example has no value for that task (NaN); such resamples are left out (the
    interval is conditional on every task being observed), and refused when they exceed 1 %."""
    from scipy.stats import bootstrap

    n = samples[0].size
    with warnings.catch_warnings():  # the NaN of a resample without a task's labels is handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        result = bootstrap(samples, statistic, paired=True, vectorized=True, confidence_level=confidence,
                           n_resamples=n_resamples, method="percentile", batch=max(1, BATCH_ELEMENTS // n),
                           random_state=np.random.default_rng(seed))
    distribution = np.asarray(result.bootstrap_distribution, dtype=np.float64)
    defined = distribution[~np.isnan(distribution)]
    if defined.size < 0.99 * distribution.size:
        raise DataError(f"{distribution.size - defined.size} of {distribution.size} bootstrap resamples miss every "
                        "label of a task: too few labelled test examples for an interval; use a larger test split")
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(defined, [tail, 100.0 - tail])
    return float(low), float(high)


def _mean_over_examples(d: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.nanmean(d, axis=axis)


def paired_difference(candidate: np.ndarray, baseline: np.ndarray, statistic: str = "error",
                      confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                      seed: int = SEED) -> PairedDifference:
    """The mean of ``candidate - baseline`` over the examples both have, its paired-bootstrap interval
    at ``confidence``, the number of examples, the probability of improvement and the verdict."""
    d = _pairs(candidate, baseline, statistic)
    d = d[~np.isnan(d)]
    if d.size < 2:
        raise DataError(f"{statistic}: {d.size} example(s) with a label for both models; a paired interval "
                        "needs at least 2 (use a larger test split)")
    mean = float(d.mean())
    if np.all(d == d[0]):  # every resample has the same mean
        low = high = mean
    else:
        low, high = _bootstrap((d,), _mean_over_examples, confidence, n_resamples, seed)
    return PairedDifference(statistic, mean, low, high, confidence, int(d.size), probability_of_improvement(d),
                            verdict(low, high, confidence))


def combined_difference(candidate: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                        confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                        seed: int = SEED) -> PairedDifference:
    """The mean over tasks of the per-task mean differences, bootstrapped jointly over examples
    (NaN where a task's label is missing: each task averages over its labelled examples)."""
    tasks = sorted(candidate)
    if sorted(baseline) != tasks or not tasks:
        raise DataError(f"the models' tasks differ ({sorted(candidate)} vs {sorted(baseline)}); compare the same tasks")
    ds = tuple(_pairs(candidate[t], baseline[t], t) for t in tasks)
    if len({d.size for d in ds}) != 1:
        raise DataError("the tasks' per-example values have different lengths; evaluate every task on one split")
    labelled = [int((~np.isnan(d)).sum()) for d in ds]
    if min(labelled) < 2:
        raise DataError(f"task {tasks[int(np.argmin(labelled))]} has {min(labelled)} labelled example(s) in the split; "
                        "a paired interval needs at least 2 (use a larger test split)")

    def score_change(*task_differences: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean([np.nanmean(d, axis=axis) for d in task_differences], axis=0)

    mean = float(score_change(*ds))
    present = [d[~np.isnan(d)] for d in ds]
    if all(np.all(p == p[0]) for p in present):  # every resample gives the same per-task means
        low = high = mean
    else:
        low, high = _bootstrap(ds, score_change, confidence, n_resamples, seed)
    with np.errstate(invalid="ignore"):
        per_example = np.nanmean(np.stack(ds), axis=0)  # an example's mean difference over its labelled tasks
    return PairedDifference("mean over tasks", mean, low, high, confidence, int(ds[0].size),
                            probability_of_improvement(per_example), verdict(low, high, confidence))


@dataclass(frozen=True)
class PairedComparison:
    """Two models' per-example errors compared per task (at ``task_confidence``, Bonferroni over the tasks) and
    on the mean over tasks (at ``confidence``)."""

    confidence: float
    task_confidence: float
    combined: PairedDifference
    tasks: dict[str, PairedDifference]

    def as_dict(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "task_confidence": self.task_confidence, "n": self.combined.n,
                "combined": self.combined.as_dict(), "tasks": {t: d.as_dict() for t, d in self.tasks.items()}}


def paired_comparison(candidate: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray],
                      statistics: Mapping[str, str] | None = None, confidence: float = CONFIDENCE,
                      n_resamples: int = N_RESAMPLES, seed: int = SEED) -> PairedComparison:
    """``candidate - baseline`` per task (:func:`paired_difference` at :func:`bonferroni_confidence` over the
    tasks) and on the mean over tasks (:func:`combined_difference` at ``confidence``); ``statistics`` names each
    task's per-example error."""
    tasks = sorted(candidate)
    task_confidence = bonferroni_confidence(confidence, max(len(tasks), 1))
    combined = combined_difference(candidate, baseline, confidence, n_resamples, seed)
    per_task = {t: paired_difference(candidate[t], baseline[t], (statistics or {}).get(t, "error"),
                                     task_confidence, n_resamples, seed) for t in tasks}
    return PairedComparison(confidence, task_confidence, combined, per_task)


def seed_mean_errors(per_seed: Sequence[np.ndarray], what: str = "error") -> np.ndarray:
    """Each example's error averaged over a method's seeds (one array per seed, the split's order); NaN where
    the example has no label. The seeds must mark the same examples unlabelled (one test split)."""
    if not per_seed:
        raise DataError(f"{what}: no seed's per-example values to average")
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in per_seed])
    if stacked.ndim != 2:
        raise DataError(f"{what}: per-example values must be one 1-D array per seed, got shape {stacked.shape}")
    missing = np.isnan(stacked)
    if (missing != missing[0]).any():
        raise DataError(f"{what}: the seeds' per-example values leave different examples unlabelled; they were "
                        "not evaluated on the same test split")
    return stacked.mean(axis=0)  # NaN exactly where every seed has no label


def compare_methods(first: Mapping[str, Sequence[np.ndarray]], second: Mapping[str, Sequence[np.ndarray]],
                    statistics: Mapping[str, str] | None = None, confidence: float = CONFIDENCE,
                    n_resamples: int = N_RESAMPLES, seed: int = SEED) -> PairedComparison:
    """Method ``first`` against ``second`` on one test split from their per-example errors per task, one array
    per seed: each example's error averaged over each method's seeds (:func:`seed_mean_errors`), then
    :func:`paired_comparison` (``first - second``: negative favours ``first``)."""
    if sorted(first) != sorted(second) or not first:
        raise DataError(f"the methods' tasks differ ({sorted(first)} vs {sorted(second)}); compare the same tasks")
    return paired_comparison({t: seed_mean_errors(v, t) for t, v in first.items()},
                             {t: seed_mean_errors(v, t) for t, v in second.items()},
                             statistics, confidence, n_resamples, seed)


#: the default non-inferiority margin of a task: this share of the baseline's mean per-example error on it
DEFAULT_RELATIVE_MARGIN = 0.1


def default_margins(baseline: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The default non-inferiority margin per task: :data:`DEFAULT_RELATIVE_MARGIN` of the baseline's mean
    per-example error on the task (the candidate may be at most 10 % worse than the champion on a task)."""
    return {t: DEFAULT_RELATIVE_MARGIN * float(np.nanmean(np.asarray(v, dtype=np.float64))) for t, v in baseline.items()}


def check_margins(margins: Mapping[str, float], tasks: Sequence[str]) -> None:
    """Margins name known tasks and are finite numbers >= 0 (in the task's per-example error units)."""
    unknown = sorted(set(margins) - set(tasks))
    if unknown:
        raise InvalidParameterError(f"non_inferiority_margin names task(s) {', '.join(unknown)} that the models do "
                                    f"not have ({', '.join(sorted(tasks))}); fix the task names")
    bad = {t: m for t, m in margins.items() if isinstance(m, bool) or not isinstance(m, (int, float))
           or not math.isfinite(m) or m < 0}
    if bad:
        raise InvalidParameterError(f"non_inferiority_margin of {', '.join(bad)} must be a finite number >= 0 in the "
                                    f"task's error units, got {', '.join(repr(v) for v in bad.values())}")


def check_min_improvement(min_improvement: float, baseline: Mapping[str, np.ndarray]) -> None:
    """``min_improvement`` is a finite number >= 0 below the baseline's score on the split (the mean over tasks
    of its mean per-example error): per-example errors are >= 0, so no candidate lowers the score by more."""
    if isinstance(min_improvement, bool) or not math.isfinite(min_improvement) or min_improvement < 0:
        raise InvalidParameterError(f"min_improvement must be a finite number >= 0, got {min_improvement}")
    reachable = float(np.mean([np.nanmean(np.asarray(v, dtype=np.float64)) for v in baseline.values()]))
    if min_improvement > 0 and min_improvement >= reachable:
        raise InvalidParameterError(f"min_improvement {min_improvement:g} is not below the champion's score "
                                    f"{reachable:.4g} on the split, so no candidate could be promoted; use a value "
                                    "below it")


def resolution(difference: PairedDifference) -> float:
    """The smallest mean difference the split could detect at the interval's confidence: the interval's
    half-width (a true difference of that size puts the interval's edge at 0, on average)."""
    return 0.5 * (difference.high - difference.low)


@dataclass(frozen=True)
class GateDecision:
    """The retrain gate's decision and everything it was based on."""

    promote: bool
    reason: str
    rule: str
    min_improvement: float
    confidence: float
    task_confidence: float
    combined: PairedDifference
    tasks: dict[str, PairedDifference]
    margins: dict[str, float]
    margin_rule: dict[str, str]
    failed: tuple[str, ...]

    @property
    def non_inferior(self) -> dict[str, bool]:
        """Per task: the upper bound of the error difference at the corrected level is at most the margin."""
        return {t: d.high <= self.margins[t] for t, d in self.tasks.items()}

    @property
    def resolution(self) -> dict[str, float]:
        """The smallest difference the split could detect, per task and for the score (``all``)."""
        return {"all": resolution(self.combined), **{t: resolution(d) for t, d in self.tasks.items()}}

    def as_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reason": self.reason, "rule": self.rule,
                "min_improvement": self.min_improvement, "confidence": self.confidence,
                "task_confidence": self.task_confidence, "combined": self.combined.as_dict(),
                "tasks": {t: d.as_dict() for t, d in self.tasks.items()}, "margins": dict(self.margins),
                "margin_rule": dict(self.margin_rule), "non_inferior": self.non_inferior,
                "resolution": self.resolution, "failed": list(self.failed)}


RULE = ("promote when the candidate is better on the mean over tasks of the per-example error difference "
        "(paired bootstrap interval over test examples at {confidence:g} % entirely below 0), improves it by "
        "at least min_improvement={min_improvement:g}, and is non-inferior on every task: the upper bound of "
        "its per-task error difference (intervals at {task_confidence:g} %, Bonferroni over {tasks} task(s)) at "
        "most the task's non_inferiority_margin (default: {relative:g} of the champion's mean error on the task)")


def _reason(failed: Sequence[str], decision_parts: Mapping[str, str]) -> str:
    if not failed:
        return f"candidate better and non-inferior on every task: {decision_parts['interval']}"
    return "; ".join(decision_parts[f] for f in failed) + f" ({decision_parts['interval']})"


def gate(candidate: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray], min_improvement: float = 0.0,
         statistics: Mapping[str, str] | None = None, confidence: float = CONFIDENCE,
         n_resamples: int = N_RESAMPLES, seed: int = SEED,
         margins: Mapping[str, float] | None = None) -> GateDecision:
    """Decide whether ``candidate`` replaces ``baseline`` from their per-example errors per task on one
    split (see the module docstring for the rule); ``statistics`` names each task's per-example error,
    ``margins`` each task's non-inferiority margin (the default rule, :func:`default_margins`, for the others)."""
    tasks = sorted(candidate)
    check_min_improvement(min_improvement, baseline)
    check_margins(margins or {}, tasks)
    chosen = {**default_margins(baseline), **{t: float(m) for t, m in (margins or {}).items()}}
    margin_rule = {t: "given" if t in (margins or {}) else f"default: {DEFAULT_RELATIVE_MARGIN:g} of the champion's "
                   "mean error" for t in tasks}
    comparison = paired_comparison(candidate, baseline, statistics, confidence, n_resamples, seed)
    task_confidence, combined, per_task = comparison.task_confidence, comparison.combined, comparison.tasks
    inferior = [t for t, d in per_task.items() if d.high > chosen[t]]
    improvement = -combined.mean_difference
    failed = tuple(name for name, fails in (("not better", combined.verdict != "better"),
                                            ("too small", improvement < min_improvement),
                                            ("not non-inferior", bool(inferior))) if fails)
    parts = {
        "interval": (f"score change {combined.mean_difference:+.4f} [{combined.low:+.4f}, {combined.high:+.4f}] at "
                     f"{100 * confidence:g} % over n={combined.n} paired test examples; smallest detectable "
                     f"difference {resolution(combined):.4f}"),
        "not better": f"not better with confidence ({combined.verdict})",
        "too small": f"improvement {improvement:+.4f} below min_improvement {min_improvement:g}",
        "not non-inferior": "not shown non-inferior on task(s) " + ", ".join(
            f"{t} (upper bound {per_task[t].high:+.4f} > margin {chosen[t]:.4f} at {100 * task_confidence:g} %"
            + (f"; the split resolves only {resolution(per_task[t]):.4f}: about "
               f"{_examples_to_resolve(per_task[t], chosen[t])} test examples would resolve the margin"
               if resolution(per_task[t]) > chosen[t] else "") + ")" for t in inferior)}
    rule = RULE.format(confidence=100 * confidence, min_improvement=min_improvement,
                       task_confidence=100 * task_confidence, tasks=len(tasks), relative=DEFAULT_RELATIVE_MARGIN)
    return GateDecision(not failed, _reason(failed, parts), rule, float(min_improvement), confidence, task_confidence,
                        combined, per_task, chosen, margin_rule, failed)


def _examples_to_resolve(difference: PairedDifference, margin: float) -> str:
    """About how many paired examples an interval as narrow as ``margin`` needs (the width shrinks as 1/sqrt(n))."""
    if margin <= 0:
        return "no number of"
    return f"{math.ceil(difference.n * (resolution(difference) / margin) ** 2):,}"
