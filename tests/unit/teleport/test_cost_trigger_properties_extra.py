"""COST trigger rules at their boundaries: the released-code rule fires at cos = 0 with the mean
gradient and not above it, and the weak rule says how to get the pairwise cosines it needs.

Each test pins a behaviour that the mutation run (docs/development/mutation-testing.md) found unchecked.
"""

from __future__ import annotations

import pytest
import torch

from mtlflow.core.errors import InvalidParameterError
from mtlflow.teleport.triggers import RULES, gradient_stats


def test_released_rule_is_quiet_when_every_task_agrees_with_the_mean() -> None:
    # g1 = (1, 0), g2 = (1, 1): mean (1, 0.5); cos(g1, mean) = 2/sqrt(5), cos(g2, mean) = 3/sqrt(10)
    stats = gradient_stats(torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(stats.cos_to_mean, torch.tensor([2 / 5 ** 0.5, 3 / 10 ** 0.5], dtype=torch.float64))
    assert RULES["released"](stats) is False


def test_released_rule_fires_at_a_right_angle_to_the_mean() -> None:
    # g1 = (1, 0), g2 = (-1, 2): mean (0, 1) is orthogonal to g1, so min cos = 0 and "<= 0" holds
    stats = gradient_stats(torch.tensor([[1.0, 0.0], [-1.0, 2.0]], dtype=torch.float64))
    assert float(stats.cos_to_mean[0]) == 0.0
    assert RULES["released"](stats) is True
    assert RULES["dominated"](stats) is False  # Eq. 3 is strict: cos < 0


def test_weak_rule_without_pairwise_cosines_says_how_to_get_them() -> None:
    stats = gradient_stats(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(InvalidParameterError) as caught:
        RULES["weak"](stats)
    assert str(caught.value) == ("the weak-conflict rule needs pairwise cosines; "
                                 "use gradient_stats(..., pairwise=True)")
