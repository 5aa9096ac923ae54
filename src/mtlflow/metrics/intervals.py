"""Statistics over seeds: a mean with its 95 % interval, the difference of two methods, the probability of
improvement and a verdict in words.

Every interval is a percentile bootstrap (``scipy.stats.bootstrap``, Efron & Tibshirani 1993, ch. 13) over
the seeds of a method; a difference of two methods resamples each method's seeds independently (a bootstrap
stratified by method, as ``rliable`` does across runs: Agarwal et al., "Deep RL at the edge of the statistical
precipice", NeurIPS 2021, Sec. 4). The generator is seeded with :data:`BOOTSTRAP_SEED`, so the same results
give the same table to the last digit. The percentile method rather than BCa: BCa's acceleration is undefined
for the 3-5 seeds a sweep has (and for a constant sample), the percentile interval of a constant is the
constant. With few seeds the bootstrap interval is optimistic (3 seeds have 10 distinct resamples); the report
warns below 3 seeds and the interval covers seed-to-seed (training) noise only, not the sampling of the test
split.

* **Probability of improvement** (Agarwal et al. 2021, Eq. in Sec. 5; Bouthillier et al., MLSys 2021):
  ``P(X ≻ Y) = P(X better than Y) + ½ P(X = Y)`` over every pair of one seed of X and one of Y, i.e. the
  Mann-Whitney U statistic divided by ``n·m`` (``scipy.stats.mannwhitneyu``).
* **Verdict**: ``better`` / ``worse`` when the 95 % interval of the difference excludes 0, else
  ``indistinguishable at 95 %``; with one seed on either side there is no interval and no verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: the confidence level of every interval mtlflow reports
CONFIDENCE = 0.95
#: bootstrap resamples per interval (scipy's default is 9999; 4000 keeps the 2.5 % tail to ~100 resamples)
N_RESAMPLES = 4000
#: the bootstrap's fixed generator seed: the same numbers give the same interval, so tables reproduce exactly
BOOTSTRAP_SEED = 20260528

BETTER, WORSE, INDISTINGUISHABLE, NO_INTERVAL = "better", "worse", "indistinguishable at 95 %", "no interval"


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` seeds with its 95 % interval (``low``/``high`` None with fewer than 2 seeds)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def _values(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what}: need a non-empty 1-D sequence of numbers, got shape {arr.shape}")
    return arr


def bootstrap_interval(samples: Sequence[np.ndarray], statistic: Callable[..., Any],
                       vectorized: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The 95 % percentile interval of ``statistic(*samples)`` with every sample resampled independently
    (stratified by sample); deterministic (:data:`BOOTSTRAP_SEED`)."""
    from scipy.stats import bootstrap

    result = bootstrap(tuple(samples), statistic, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE,
                       method="percentile", paired=False, vectorized=vectorized,
                       rng=np.random.default_rng(BOOTSTRAP_SEED))
    return np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)


def _mean(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(sample, axis=axis)


def _mean_difference(first: np.ndarray, second: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(first, axis=axis) - np.mean(second, axis=axis)


def mean_interval(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` (one per seed) and its 95 % bootstrap interval; no interval for one seed."""
    arr = _values(values, "mean_interval")
    mean = float(np.mean(arr))
    if arr.size < 2:
        return Estimate(mean, None, None, 1)
    if not np.all(np.isfinite(arr)):  # a metric undefined for some seed (NaN): its mean is NaN, no interval
        return Estimate(mean, None, None, int(arr.size))
    low, high = bootstrap_interval([arr], _mean)
    return Estimate(mean, float(low), float(high), int(arr.size))


@dataclass(frozen=True)
class Comparison:
    """``first`` against ``second`` over seeds: the difference of their means (first - second) with its 95 %
    interval, the probability that a seed of ``first`` is better than one of ``second``, and the verdict."""

    difference: float
    low: float | None
    high: float | None
    probability_of_improvement: float
    verdict: str
    n_first: int
    n_second: int

    def as_dict(self) -> dict[str, Any]:
        return {"difference": self.difference, "low": self.low, "high": self.high,
                "probability_of_improvement": self.probability_of_improvement, "verdict": self.verdict,
                "n": [self.n_first, self.n_second]}


def difference_interval(first: Sequence[float], second: Sequence[float]) -> Estimate:
    """mean(first) - mean(second) and its 95 % interval from a bootstrap that resamples each method's seeds
    independently (stratified: a resample never moves a seed from one method to the other)."""
    x, y = _values(first, "difference_interval"), _values(second, "difference_interval")
    difference = float(np.mean(x) - np.mean(y))
    if x.size < 2 or y.size < 2 or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return Estimate(difference, None, None, min(x.size, y.size))
    low, high = bootstrap_interval([x, y], _mean_difference)
    return Estimate(difference, float(low), float(high), min(x.size, y.size))


def probability_of_improvement(first: Sequence[float], second: Sequence[float], lower_is_better: bool) -> float:
    """P(a seed of ``first`` beats a seed of ``second``) + ½ P(tie), over all n·m pairs: the Mann-Whitney U
    statistic of (first, second) over n·m, on values oriented so that larger is better."""
    from scipy.stats import mannwhitneyu

    x, y = _values(first, "probability_of_improvement"), _values(second, "probability_of_improvement")
    if lower_is_better:
        x, y = -x, -y
    return float(mannwhitneyu(x, y, alternative="two-sided").statistic / (x.size * y.size))


def verdict(low: float | None, high: float | None, lower_is_better: bool) -> str:
    """``better`` / ``worse`` (for the first of the two compared) when the interval of the difference
    (first - second) excludes 0, ``indistinguishable at 95 %`` when it holds 0, no verdict without one."""
    if low is None or high is None:
        return NO_INTERVAL
    if low > 0 or high < 0:
        first_larger = low > 0
        return BETTER if first_larger != lower_is_better else WORSE
    return INDISTINGUISHABLE


def compare(first: Sequence[float], second: Sequence[float], lower_is_better: bool) -> Comparison:
    """Everything :class:`Comparison` holds for ``first`` against ``second`` (one value per seed each)."""
    diff = difference_interval(first, second)
    return Comparison(diff.mean, diff.low, diff.high,
                      probability_of_improvement(first, second, lower_is_better),
                      verdict(diff.low, diff.high, lower_is_better), len(first), len(second))


def format_estimate(estimate: Estimate | dict[str, Any] | None, digits: int = 4, signed: bool = False) -> str:
    """``mean [low, high]`` or ``mean (1 seed: no interval)``; ``–`` for a missing value."""
    if estimate is None:
        return "–"
    e = estimate if isinstance(estimate, dict) else estimate.as_dict()
    spec = f"{'+' if signed else ''}.{digits}f"
    if e["mean"] is None or not np.isfinite(e["mean"]):
        return "–"
    text = format(e["mean"], spec)
    if e["low"] is None:
        return f"{text} ({'1 seed: ' if e['n'] == 1 else ''}no interval)"
    return f"{text} [{format(e['low'], spec)}, {format(e['high'], spec)}]"
