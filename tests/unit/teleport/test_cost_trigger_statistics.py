"""COST trigger statistics: the telemetry's reason for the many-task rule states Eq. 4's threshold ⌈K/2⌉, and
the weak rule's names the most conflicting pair of distinct tasks."""

from __future__ import annotations

import torch

from mtlflow.teleport.triggers import describe, gradient_stats


def test_many_task_reason_states_the_ceil_half_threshold_for_an_odd_task_count():
    # K = 3: the mean of the rows is (1/6, 1/3); only the third row opposes it, and ⌈3/2⌉ = 2 are needed
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.5, 0.0]], dtype=torch.float64)
    reason = describe("many-task", gradient_stats(grads), ["a", "b", "c"])
    assert reason == "many-task conflict (Eq. 4): 1 of 3 tasks conflict with the mean gradient (>= 2)"


def test_weak_reason_names_the_most_negative_pair_of_distinct_tasks():
    # cos(a, b) = 0, cos(a, c) = -1/√2 ≈ -0.707, cos(b, c) = 1/√2: the pair (a, c); a task's cosine with itself
    # (1) is not a pair
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    reason = describe("weak", gradient_stats(grads, pairwise=True), ["a", "b", "c"])
    assert reason == "weak conflict (Def. 1): cos(g_a, g_c) = -0.707 < 0"
