"""The statistics over seeds (mtlflow.metrics.intervals) against independent computations: hand-computed
cases, the t-interval, a brute-force double loop and the support of a stratified resample."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from mtlflow.metrics import intervals
from mtlflow.metrics.intervals import (
    BETTER,
    INDISTINGUISHABLE,
    NO_INTERVAL,
    WORSE,
    compare,
    difference_interval,
    format_estimate,
    mean_interval,
    probability_of_improvement,
    verdict,
)


def test_the_interval_of_a_constant_has_zero_width_at_the_constant():
    estimate = mean_interval([0.25, 0.25, 0.25, 0.25])
    assert (estimate.mean, estimate.low, estimate.high, estimate.n) == (0.25, 0.25, 0.25, 4)


def test_one_seed_has_no_interval_and_says_so():
    estimate = mean_interval([0.9390])
    assert estimate.low is None and estimate.high is None and estimate.n == 1
    assert format_estimate(estimate) == "0.9390 (1 seed: no interval)"
    assert "±" not in format_estimate(estimate)


def test_the_interval_of_two_seeds_spans_exactly_their_values():
    # the resampled means of {a, b} are a, (a+b)/2 and b, with a and b each drawn with probability 1/4 > 2.5 %
    estimate = mean_interval([1.0, 3.0])
    assert (estimate.mean, estimate.low, estimate.high) == (2.0, 1.0, 3.0)


def test_a_normal_sample_gives_about_the_t_interval():
    sample = np.random.default_rng(3).normal(10.0, 2.0, size=400)
    estimate = mean_interval(sample)
    low, high = stats.t.interval(0.95, len(sample) - 1, loc=sample.mean(), scale=stats.sem(sample))
    half = (high - low) / 2
    assert estimate.mean == pytest.approx(sample.mean(), rel=1e-12)
    assert estimate.low == pytest.approx(low, abs=0.08 * half) and estimate.high == pytest.approx(high, abs=0.08 * half)


def test_the_interval_is_deterministic():
    values = [0.1, 0.4, 0.35, 0.2, 0.3]
    assert mean_interval(values) == mean_interval(values)
    assert difference_interval(values, [0.3, 0.2, 0.1]) == difference_interval(values, [0.3, 0.2, 0.1])


def test_the_difference_of_two_constant_methods_is_exact_so_resamples_never_mix_methods():
    # a resample that moved a seed from one method to the other would give a difference other than -1
    estimate = difference_interval([0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    assert (estimate.mean, estimate.low, estimate.high) == (-1.0, -1.0, -1.0)


def test_the_difference_interval_matches_an_independent_stratified_resampling():
    x, y = np.array([0.30, 0.32, 0.35, 0.31]), np.array([0.40, 0.38, 0.45])
    estimate = difference_interval(x, y)
    rng = np.random.default_rng(11)  # another generator: agreement within Monte Carlo error, not equality
    diffs = [rng.choice(x, x.size).mean() - rng.choice(y, y.size).mean() for _ in range(20000)]
    low, high = np.percentile(diffs, [2.5, 97.5])
    assert estimate.mean == pytest.approx(x.mean() - y.mean(), rel=1e-12)
    assert estimate.low == pytest.approx(low, abs=0.004) and estimate.high == pytest.approx(high, abs=0.004)
    # every resampled difference lies between the extremes of a within-method resample
    assert x.min() - y.max() <= estimate.low and estimate.high <= x.max() - y.min()


def _brute_force_poi(x, y, lower_is_better):
    wins = 0.0
    for a, b in itertools.product(x, y):
        if a == b:
            wins += 0.5
        elif (a < b) == lower_is_better:
            wins += 1.0
    return wins / (len(x) * len(y))


@pytest.mark.parametrize("lower_is_better", [True, False])
def test_probability_of_improvement_is_the_double_loop_count(lower_is_better):
    rng = np.random.default_rng(5)
    for _ in range(20):
        x = rng.integers(0, 5, size=rng.integers(1, 6)).astype(float)  # small integers: many ties
        y = rng.integers(0, 5, size=rng.integers(1, 6)).astype(float)
        assert probability_of_improvement(x, y, lower_is_better) == pytest.approx(
            _brute_force_poi(x, y, lower_is_better), abs=1e-12)


def test_probability_of_improvement_hand_cases():
    assert probability_of_improvement([1.0, 2.0], [3.0, 4.0], lower_is_better=True) == 1.0
    assert probability_of_improvement([1.0, 2.0], [3.0, 4.0], lower_is_better=False) == 0.0
    assert probability_of_improvement([1.0, 3.0], [2.0, 3.0], lower_is_better=False) == pytest.approx(0.375)


def test_verdicts_in_words():
    assert verdict(-0.3, -0.1, lower_is_better=True) == BETTER   # first - second < 0 on an error
    assert verdict(-0.3, -0.1, lower_is_better=False) == WORSE   # ... on an accuracy
    assert verdict(0.1, 0.3, lower_is_better=False) == BETTER
    assert verdict(-0.1, 0.2, lower_is_better=True) == INDISTINGUISHABLE
    assert verdict(None, None, lower_is_better=True) == NO_INTERVAL


def test_compare_separated_and_overlapping_methods():
    clear = compare([0.10, 0.11, 0.12], [0.30, 0.31, 0.29], lower_is_better=True)
    assert clear.verdict == BETTER and clear.probability_of_improvement == 1.0
    assert clear.difference == pytest.approx(-0.19)
    noise = compare([0.30, 0.10, 0.20], [0.21, 0.19, 0.25], lower_is_better=True)
    assert noise.verdict == INDISTINGUISHABLE and noise.low < 0 < noise.high
    assert compare([0.1], [0.2, 0.3], lower_is_better=True).verdict == NO_INTERVAL


def test_format_estimate():
    assert format_estimate({"mean": 1.5, "low": 1.0, "high": 2.25, "n": 3}, digits=2) == "1.50 [1.00, 2.25]"
    assert format_estimate({"mean": -1.5, "low": -2.0, "high": 0.5, "n": 3}, digits=2, signed=True) == \
        "-1.50 [-2.00, +0.50]"
    assert format_estimate(None) == "–"


def test_the_resample_count_and_level_are_what_the_docs_say():
    assert intervals.CONFIDENCE == 0.95 and intervals.N_RESAMPLES >= 2000
