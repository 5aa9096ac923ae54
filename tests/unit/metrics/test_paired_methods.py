"""Two methods of a sweep compared on one test split (mtlflow.metrics.paired.compare_methods): each example's
error averaged over a method's seeds, then the gate's paired comparison, against a hand computation."""

import numpy as np
import pytest

from mtlflow.core.errors import DataError
from mtlflow.metrics import paired


def test_each_example_is_averaged_over_the_seeds_before_pairing():
    # method A, 2 seeds: example errors (0, 1, 0, 1) and (1, 1, 0, 0) -> seed means (½, 1, 0, ½)
    # method B, 3 seeds: (1, 1, 1, 0), (1, 0, 1, 0), (1, 1, 1, 0)    -> seed means (1, ⅔, 1, 0)
    first = {"t": [np.array([0.0, 1, 0, 1]), np.array([1.0, 1, 0, 0])]}
    second = {"t": [np.array([1.0, 1, 1, 0]), np.array([1.0, 0, 1, 0]), np.array([1.0, 1, 1, 0])]}
    result = paired.compare_methods(first, second, n_resamples=999)
    # differences (-½, ⅓, -1, ½): mean -1/6; P(d < 0) = 2/4, no tie
    task = result.tasks["t"]
    assert task.mean_difference == pytest.approx(-1 / 6, abs=1e-15)
    assert task.probability_of_improvement == pytest.approx(0.5, abs=1e-15)
    assert result.combined.mean_difference == pytest.approx(-1 / 6, abs=1e-15)  # one task: the same mean
    assert result.task_confidence == result.confidence == 0.95  # Bonferroni over 1 task changes nothing


def test_unlabelled_examples_stay_unlabelled_and_must_agree_between_seeds():
    a = np.array([0.0, np.nan, 1.0])
    assert np.array_equal(paired.seed_mean_errors([a, np.array([1.0, np.nan, 1.0])]),
                          np.array([0.5, np.nan, 1.0]), equal_nan=True)
    with pytest.raises(DataError, match="not evaluated on the same test split"):
        paired.seed_mean_errors([a, np.array([1.0, 0.0, 1.0])])
    with pytest.raises(DataError, match="tasks differ"):
        paired.compare_methods({"t": [a]}, {"u": [a]})
