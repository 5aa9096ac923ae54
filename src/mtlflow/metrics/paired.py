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
in the score's units), and *worse on no task* at the corrected level. A false promotion needs the
combined interval to miss the true difference on the wrong side, which happens with probability about
``α/2`` for two models that are equally good (the bootstrap's coverage is approximate); the per-task
checks only block.

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
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

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

    def as_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reason": self.reason, "rule": self.rule,
                "min_improvement": self.min_improvement, "confidence": self.confidence,
                "task_confidence": self.task_confidence, "combined": self.combined.as_dict(),
                "tasks": {t: d.as_dict() for t, d in self.tasks.items()}}


RULE = ("promote when the candidate is better on the mean over tasks of the per-example error difference "
        "(paired bootstrap interval over test examples at {confidence:g} % entirely below 0), improves it by "
        "at least min_improvement={min_improvement:g}, and is worse on no task (per-task intervals at "
        "{task_confidence:g} %, Bonferroni over {tasks} task(s))")


def gate(candidate: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray], min_improvement: float = 0.0,
         statistics: Mapping[str, str] | None = None, confidence: float = CONFIDENCE,
         n_resamples: int = N_RESAMPLES, seed: int = SEED) -> GateDecision:
    """Decide whether ``candidate`` replaces ``baseline`` from their per-example errors per task on one
    split (see the module docstring for the rule); ``statistics`` names each task's per-example error."""
    if min_improvement < 0 or not math.isfinite(min_improvement):
        raise InvalidParameterError(f"min_improvement must be a finite number >= 0, got {min_improvement}")
    tasks = sorted(candidate)
    comparison = paired_comparison(candidate, baseline, statistics, confidence, n_resamples, seed)
    task_confidence, combined, per_task = comparison.task_confidence, comparison.combined, comparison.tasks
    worse = [t for t, d in per_task.items() if d.verdict == "worse"]
    improvement = -combined.mean_difference
    better = combined.verdict == "better"
    promote = better and improvement >= min_improvement and not worse
    interval = (f"score change {combined.mean_difference:+.4f} [{combined.low:+.4f}, {combined.high:+.4f}] "
                f"at {100 * confidence:g} % over n={combined.n} paired test examples")
    if promote:
        reason = f"candidate better: {interval}, improvement {improvement:.4f} >= {min_improvement:g}"
    elif worse:
        reason = f"candidate worse on task(s) {', '.join(worse)} at {100 * task_confidence:g} %; {interval}"
    elif not better:
        reason = f"not better with confidence ({combined.verdict}): {interval}"
    else:
        reason = f"better but by less than min_improvement {min_improvement:g}: {interval}"
    rule = RULE.format(confidence=100 * confidence, min_improvement=min_improvement,
                       task_confidence=100 * task_confidence, tasks=len(tasks))
    return GateDecision(promote, reason, rule, float(min_improvement), confidence, task_confidence, combined, per_task)
