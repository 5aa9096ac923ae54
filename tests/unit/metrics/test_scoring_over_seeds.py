"""The scores over seeds added to mtlflow.metrics.scoring, against independent computations: the mean rank's
stratified bootstrap against a plain resampling loop, the Pareto set at 95 % against hand cases, Δ% per task and
the normalised hypervolume against their formulas."""

from __future__ import annotations

import numpy as np
import pytest

from mtlflow.metrics.scoring import (
    confident_pareto_mask,
    hypervolume,
    mean_rank,
    mean_rank_interval,
    normalised_hypervolume,
    task_delta,
)


def test_mean_rank_interval_matches_an_independent_stratified_resampling():
    rng = np.random.default_rng(0)
    values = {"a": rng.normal(0.0, 1.0, (4, 3)), "b": rng.normal(0.5, 1.0, (3, 3)), "c": rng.normal(1.0, 1.0, (5, 3))}
    higher = [False, True, False]
    got = mean_rank_interval(values, higher)
    other = np.random.default_rng(99)
    draws = {m: [] for m in values}
    for _ in range(6000):
        means = {m: v[other.integers(0, len(v), len(v))].mean(axis=0) for m, v in values.items()}
        tables = {m: {f"t{c}": {"x": means[m][c]} for c in range(3)} for m in values}
        specs = {f"t{c}": {"x": {"higher_is_better": higher[c]}} for c in range(3)}
        for m, r in mean_rank(tables, specs).items():
            draws[m].append(r)
    for m in values:  # ranks move in steps of 1/3: the percentiles agree to one step
        low, high = np.percentile(draws[m], [2.5, 97.5])
        assert abs(got[m][0] - low) <= 1 / 3 + 1e-9 and abs(got[m][1] - high) <= 1 / 3 + 1e-9


def test_mean_rank_interval_of_separated_methods_is_their_rank_and_none_with_one_seed():
    values = {"best": np.array([[0.1, 0.1], [0.11, 0.12]]), "mid": np.array([[0.5, 0.5], [0.52, 0.49]]),
              "worst": np.array([[0.9, 0.9], [0.95, 0.91]])}
    assert mean_rank_interval(values, [False, False]) == {"best": (1.0, 1.0), "mid": (2.0, 2.0), "worst": (3.0, 3.0)}
    assert mean_rank_interval({**values, "one": np.array([[0.3, 0.3]])}, [False, False]) is None


def test_confident_pareto_mask_hand_cases():
    top = [[0.10, 0.10], [0.11, 0.12], [0.09, 0.11]]
    far = [[0.50, 0.50], [0.52, 0.51], [0.49, 0.53]]
    trade = [[0.05, 0.90], [0.06, 0.91], [0.04, 0.92]]  # better than top on task 0: never dominated by it
    close = [[0.11, 0.105], [0.08, 0.125], [0.12, 0.10]]  # overlaps top on both tasks
    assert confident_pareto_mask([top, far, trade, close]) == [True, False, True, True]
    # one seed: no interval, so nothing is dominated with confidence
    assert confident_pareto_mask([[[0.1, 0.1]], [[0.9, 0.9]]]) == [True, True]


def test_task_delta_is_the_signed_relative_change():
    assert task_delta(0.90, 0.80, higher_is_better=True) == pytest.approx(-12.5)
    assert task_delta(22.0, 20.0, higher_is_better=False) == pytest.approx(10.0)
    assert np.isnan(task_delta(0.5, 0.0, higher_is_better=True))


def test_normalised_hypervolume_is_the_share_of_the_reference_box():
    assert normalised_hypervolume([[0.2, 10.0]], [1.0, 40.0]) == pytest.approx(0.8 * 0.75)
    # the same order as the raw hypervolume, divided by the box's volume
    points, scale = [[0.2, 10.0], [0.5, 5.0]], [1.0, 40.0]
    assert normalised_hypervolume(points, scale) == pytest.approx(hypervolume(points, scale) / 40.0)
