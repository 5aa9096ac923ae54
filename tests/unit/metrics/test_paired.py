"""The paired comparison and the retrain gate's rule (mtlflow.metrics.paired), each statistic against a
hand computation or a case with a known answer."""

import math

import numpy as np
import pytest
from scipy import stats

from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.metrics import paired


def test_hand_computed_mean_probability_and_count():
    candidate = np.array([0.0, 1.0, 0.0, 1.0, 0.0, np.nan])
    baseline = np.array([1.0, 1.0, 0.0, 0.0, 1.0, np.nan])
    result = paired.paired_difference(candidate, baseline)
    # differences -1, 0, 0, +1, -1 (the unlabelled example is left out): mean -1/5,
    # P(d < 0) + ½ P(d = 0) = 2/5 + ½ · 2/5 = 3/5
    assert result.n == 5
    assert result.mean_difference == pytest.approx(-0.2, abs=1e-15)
    assert result.probability_of_improvement == pytest.approx(0.6, abs=1e-15)
    assert result.low <= result.mean_difference <= result.high


def test_identical_models_differ_by_exactly_zero_and_are_indistinguishable():
    errors = np.random.default_rng(0).random(500)
    result = paired.paired_difference(errors, errors.copy())
    assert result.mean_difference == result.low == result.high == 0.0
    assert result.verdict == "indistinguishable at 95 %" and result.probability_of_improvement == 0.5


def test_a_constant_shift_is_its_own_interval_and_a_verdict():
    base = np.random.default_rng(1).random(300)
    better = paired.paired_difference(base - 0.25, base)
    assert better.low == better.high == pytest.approx(-0.25) and better.verdict == "better"
    worse = paired.paired_difference(base + 0.25, base)
    assert worse.verdict == "worse" and worse.probability_of_improvement == 0.0


def test_a_large_noisy_shift_excludes_zero():
    rng = np.random.default_rng(2)
    base = rng.random(400)
    result = paired.paired_difference(base - 0.1 + rng.normal(0, 0.3, 400), base)
    assert result.high < 0 and result.verdict == "better"


def test_bootstrap_interval_matches_the_t_interval_on_a_large_sample():
    rng = np.random.default_rng(3)
    candidate, baseline = rng.normal(0.0, 1.0, 4000), rng.normal(0.05, 1.0, 4000)
    d = candidate - baseline
    result = paired.paired_difference(candidate, baseline)
    low, high = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    width = high - low
    assert result.mean_difference == pytest.approx(d.mean(), abs=1e-12)
    assert result.low == pytest.approx(low, abs=0.05 * width)
    assert result.high == pytest.approx(high, abs=0.05 * width)


def test_bootstrap_interval_of_a_bernoulli_difference_matches_the_normal_approximation():
    """0/1 errors: the interval of the mean difference against mean ± z·sd/√n (the CLT)."""
    rng = np.random.default_rng(4)
    candidate = (rng.random(5000) < 0.10).astype(float)
    baseline = (rng.random(5000) < 0.13).astype(float)
    d = candidate - baseline
    result = paired.paired_difference(candidate, baseline, confidence=0.99)
    half = stats.norm.ppf(0.995) * d.std(ddof=1) / math.sqrt(d.size)
    assert result.low == pytest.approx(d.mean() - half, abs=0.06 * 2 * half)
    assert result.high == pytest.approx(d.mean() + half, abs=0.06 * 2 * half)
    assert result.verdict == "better"


def test_the_interval_is_seeded():
    rng = np.random.default_rng(5)
    a, b = rng.random(200), rng.random(200)
    assert paired.paired_difference(a, b) == paired.paired_difference(a, b)


def test_bonferroni_by_hand():
    assert paired.bonferroni_confidence(0.95, 1) == pytest.approx(0.95)
    assert paired.bonferroni_confidence(0.95, 2) == pytest.approx(0.975)
    assert paired.bonferroni_confidence(0.90, 4) == pytest.approx(0.975)
    with pytest.raises(InvalidParameterError):
        paired.bonferroni_confidence(1.0, 2)
    with pytest.raises(InvalidParameterError):
        paired.bonferroni_confidence(0.95, 0)


def test_combined_difference_is_the_mean_over_tasks_of_each_tasks_mean_difference():
    cand = {"a": np.array([0.0, 1.0, np.nan, 0.0]), "b": np.array([2.0, 4.0, 6.0, 8.0])}
    base = {"a": np.array([1.0, 1.0, np.nan, 1.0]), "b": np.array([1.0, 1.0, 1.0, 1.0])}
    result = paired.combined_difference(cand, base)
    # task a: (-1 + 0 - 1) / 3 = -2/3 over its 3 labelled examples; task b: (1 + 3 + 5 + 7) / 4 = 4
    assert result.mean_difference == pytest.approx((-2 / 3 + 4) / 2)
    assert result.n == 4 and result.statistic == "mean over tasks"
    # per example over its labelled tasks: (-1+1)/2=0, (0+3)/2, 5, (-1+7)/2 -> 1 tie, 3 worse
    assert result.probability_of_improvement == pytest.approx(0.5 / 4)


def test_gate_uses_bonferroni_per_task_and_the_combined_interval():
    rng = np.random.default_rng(6)
    base = {t: rng.random(600) for t in ("x", "y", "z")}
    cand = {t: v - 0.2 for t, v in base.items()}
    decision = paired.gate(cand, base)
    assert decision.promote and decision.combined.verdict == "better"
    assert decision.task_confidence == pytest.approx(1 - 0.05 / 3)
    for task in base:
        expected = paired.paired_difference(cand[task], base[task], confidence=1 - 0.05 / 3)
        assert decision.tasks[task] == expected
    assert "Bonferroni over 3 task(s)" in decision.rule


def test_gate_keeps_a_champion_the_candidate_is_worse_than_on_one_task():
    rng = np.random.default_rng(7)
    base = {"x": rng.random(500), "y": rng.random(500)}
    cand = {"x": base["x"] - 0.5, "y": base["y"] + 0.1}  # much better on x, worse on y: the score improves
    decision = paired.gate(cand, base)
    assert decision.combined.verdict == "better" and decision.tasks["y"].verdict == "worse"
    assert not decision.promote and "not shown non-inferior on task(s) y" in decision.reason


def test_gate_needs_min_improvement_and_confidence():
    rng = np.random.default_rng(8)
    base = {"x": rng.random(500)}
    cand = {"x": base["x"] - 0.1}
    assert paired.gate(cand, base, min_improvement=0.1 - 1e-9).promote
    kept = paired.gate(cand, base, min_improvement=0.1 + 1e-9)
    assert not kept.promote and "below min_improvement" in kept.reason
    noisy = {"x": base["x"] + rng.normal(0, 0.5, 500)}
    assert not paired.gate(noisy, base).promote
    with pytest.raises(InvalidParameterError, match="min_improvement"):
        paired.gate(cand, base, min_improvement=-0.1)


def test_bad_inputs_are_refused_with_a_reason():
    with pytest.raises(DataError, match="same split"):
        paired.paired_difference(np.zeros(3), np.zeros(4))
    with pytest.raises(DataError, match="at least 2"):
        paired.paired_difference(np.array([1.0, np.nan]), np.array([0.0, np.nan]))
    with pytest.raises(DataError, match="tasks differ"):
        paired.combined_difference({"a": np.zeros(3)}, {"b": np.zeros(3)})
