"""When COST teleports: trigger rules on the per-task gradients of one step (COST paper, Sec. 4.1).

Zhou et al., *Continual Optimization with Symmetry Teleportation for Multi-Task Learning*, NeurIPS 2025
(``shared/seeds/cost-symmetry-teleportation.txt``). With g_i the gradient of task i w.r.t. the shared
parameters and g_0 = (1/K) Σ_i g_i the mean gradient:

* ``dominated`` -- *dominated conflict*, Eq. 3: cos(g_i, g_0) < 0 for the task i with the smallest
  gradient norm (the paper's main trigger);
* ``weak`` -- *weak conflict*, Def. 1: cos(g_i, g_j) < 0 for some pair of tasks (App. A.4, Table 7);
* ``many-task`` -- Eq. 4: at least ⌈K/2⌉ tasks have cos(g_j, g_0) < 0 (the many-task rule, CelebA);
* ``released`` -- the rule of the released code (zzpustc/COST, ``methods-cost.md`` §1.2 item 3): some
  task has cos(g_i, g_0) ≤ 0 (``≤``, and any task rather than the smallest-norm one);
* ``always`` -- fires on every checked step (for timing the teleport itself, e.g. ``mtlflow bench``).

Every rule is a pure function of :class:`GradientStats`, computed from the Jacobian ``[K, P]`` in
O(KP) (the K x K Gramian, O(K²P), only for ``weak``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mtlflow.core.errors import InvalidParameterError

#: cosines are computed with norms clamped at this value (a zero gradient has cosine 0 to everything)
_TINY = 1e-30


@dataclass(frozen=True)
class GradientStats:
    """Norms and cosines of the per-task gradients of one step (float64, on the CPU)."""

    norms: Tensor            # [K] ‖g_i‖
    cos_to_mean: Tensor      # [K] cos(g_i, g_0)
    mean_norm: float         # ‖g_0‖
    pairwise_cos: Tensor | None = None  # [K, K] cos(g_i, g_j), only when a rule needs it

    @property
    def n_tasks(self) -> int:
        return int(self.norms.numel())

    @property
    def conflicting(self) -> int:
        """Number of tasks whose gradient has a negative cosine with the mean gradient."""
        return int((self.cos_to_mean < 0).sum())


def gradient_stats(grads: Tensor, pairwise: bool = False) -> GradientStats:
    """:class:`GradientStats` of the rows of ``grads [K, P]``; ``pairwise`` adds the K x K cosines."""
    if grads.ndim != 2 or grads.shape[0] < 2:
        raise InvalidParameterError(f"COST needs per-task gradients of at least 2 tasks, got shape {tuple(grads.shape)}")
    g = grads.detach()
    mean = g.mean(dim=0)
    norms = g.norm(dim=1).to(torch.float64)
    mean_norm = mean.norm().to(torch.float64)
    cos_to_mean = (g @ mean).to(torch.float64) / (norms * mean_norm).clamp_min(_TINY)
    pair = None
    if pairwise:
        gram = (g @ g.T).to(torch.float64)
        pair = gram / torch.outer(norms, norms).clamp_min(_TINY)
    return GradientStats(norms.cpu(), cos_to_mean.cpu(), float(mean_norm), None if pair is None else pair.cpu())


def dominated_conflict(stats: GradientStats) -> bool:
    """Eq. 3: the smallest-norm task gradient has a negative cosine with the mean gradient."""
    weakest = int(torch.argmin(stats.norms))
    return bool(stats.cos_to_mean[weakest] < 0)


def weak_conflict(stats: GradientStats) -> bool:
    """Def. 1: some pair of task gradients has a negative cosine."""
    if stats.pairwise_cos is None:
        raise InvalidParameterError("the weak-conflict rule needs pairwise cosines; use gradient_stats(..., pairwise=True)")
    k = stats.n_tasks
    off_diagonal = ~torch.eye(k, dtype=torch.bool)
    return bool((stats.pairwise_cos[off_diagonal] < 0).any())


def many_task_conflict(stats: GradientStats) -> bool:
    """Eq. 4: Σ_j 1[cos(g_j, g_0) < 0] ≥ ⌈K/2⌉."""
    return stats.conflicting >= math.ceil(stats.n_tasks / 2)


def released_conflict(stats: GradientStats) -> bool:
    """The released code's rule: min_i cos(g_i, g_0) ≤ 0."""
    return bool(stats.cos_to_mean.min() <= 0)


def always(stats: GradientStats) -> bool:
    """Fires on every checked step (timing only)."""
    return True


RULES: dict[str, Callable[[GradientStats], bool]] = {
    "dominated": dominated_conflict,
    "weak": weak_conflict,
    "many-task": many_task_conflict,
    "released": released_conflict,
    "always": always,
}


def needs_pairwise(rule: str) -> bool:
    return rule == "weak"


def describe(rule: str, stats: GradientStats, task_names: list[str]) -> str:
    """One line saying why ``rule`` fired (the telemetry's trigger reason)."""
    if rule == "dominated":
        i = int(torch.argmin(stats.norms))
        return (f"dominated conflict (Eq. 3): smallest-norm task {task_names[i]} has cos "
                f"{float(stats.cos_to_mean[i]):.3f} < 0 with the mean gradient")
    if rule == "weak":
        k = stats.n_tasks
        masked = stats.pairwise_cos + torch.eye(k, dtype=torch.float64) * 2.0
        flat = int(torch.argmin(masked))
        i, j = divmod(flat, k)
        return f"weak conflict (Def. 1): cos(g_{task_names[i]}, g_{task_names[j]}) = {float(masked[i, j]):.3f} < 0"
    if rule == "many-task":
        return (f"many-task conflict (Eq. 4): {stats.conflicting} of {stats.n_tasks} tasks conflict with the mean "
                f"gradient (>= {math.ceil(stats.n_tasks / 2)})")
    if rule == "released":
        i = int(torch.argmin(stats.cos_to_mean))
        return f"released-code rule: task {task_names[i]} has cos {float(stats.cos_to_mean[i]):.3f} <= 0 with the mean"
    return "always (timing)"
