"""Even grids on the preference simplex and PaLoRA's preference schedules.

Paper: Dimitriadis, Frossard & Fleuret, "Pareto Low-Rank Adapters: Efficient Multi-Task Learning with
Preferences" (PaLoRA; ``shared/seeds/palora-pareto-low-rank-adapters.txt``).

* **Grid** (Sec. 4.2, App. C): M preferences λ̃_1..λ̃_M evenly spaced in the simplex
  Δ_T = {λ ≥ 0, Σ_t λ_t = 1}. Two tasks: ``torch.linspace(0, 1, M)`` gives λ and the preference is
  [λ, 1 − λ]. Three or more tasks: the paper uses meshzoo's triangle; here the same simplex-lattice
  grid {k / n : k ∈ ℕ^T, Σ_t k_t = n}, which has C(n + T − 1, T − 1) points (Fig. 11's 10 points for
  three tasks are n = 3).
* **Deterministic annealed schedule** (Eq. 3): g_{τ,Q}(λ̃) = λ̃^{τ'} / Σ_t λ̃_t^{τ'} with τ' = τ / Q, the
  power taken element-wise, τ ∈ [0, 1] the training progress and Q the annealing temperature; at τ = 1
  it is g_{1,Q}(λ̃), the grid itself for Q = 1. ``annealed`` (the default) moves each ray on the straight
  line λ_m(τ) = (1 − τ)·c + τ·g_{1,Q}(λ̃_m) from the simplex centre c, the gradual motion of the paper's
  Fig. 11; ``annealed-eq3`` is λ_m(τ) = g_{τ,Q}(λ̃_m) literally, where 0^{τ'} = 0 puts every ray with a zero
  component on the boundary from the first step (a documented deviation, see :data:`SCHEDULES`).
  Algorithm 1 increments τ by one per batch while Eq. 3 needs τ ∈ [0, 1]; mtlflow uses
  τ = step / (total steps − 1), so the last step trains on g_{1,Q}(λ̃).
* **Ablation variants** (Sec. 6.1 and App. D): ``deterministic`` = g_{1,Q}(λ̃_m) at every step (no
  annealing); ``dirichlet`` = M rays drawn from Dirichlet(p·𝟏) per batch (M = 1: the PHN setting,
  M > 1: the PaMaL setting); ``dirichlet-annealed`` = Dirichlet(p(1 − τ)·𝟏). The concentration
  p(1 − τ) reaches 0 at τ = 1, where the Dirichlet is undefined, so it is floored at
  :data:`MIN_CONCENTRATION` (the draws are then vertices up to rounding).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import InvalidParameterError

#: ``annealed`` moves every ray on a straight line from the centre to Eq. 3's end point g_{1,Q}(λ̃) (the
#: gradual motion of the paper's Fig. 11); ``annealed-eq3`` is Eq. 3 taken literally, under which 0^{τ/Q} = 0
#: sends every ray with a zero component to its end point at the first step (3 tasks, M = 10: 9 of 10
#: rays jump and the six edge rays collapse in pairs, 7 distinct rays).
SCHEDULES = ("annealed", "annealed-eq3", "deterministic", "dirichlet", "dirichlet-annealed")
#: floor of the annealed Dirichlet concentration p(1 − τ), which is 0 at the end of training
MIN_CONCENTRATION = 1e-3
#: the evaluation grid for three or more tasks is the finest even grid with at most this many points
MAX_AUTO_EVAL_POINTS = 30


def grid_size(n_tasks: int, subdivisions: int) -> int:
    """Number of points of the even simplex grid with ``subdivisions`` steps per edge."""
    return math.comb(subdivisions + n_tasks - 1, n_tasks - 1)


def simplex_grid(n_tasks: int, subdivisions: int) -> Tensor:
    """``[N, T]`` float64 preferences evenly spaced in Δ_T (rows sum to 1).

    Two tasks: [λ, 1 − λ] for λ = ``torch.linspace(0, 1, subdivisions + 1)`` (App. C). More tasks: the
    points k / n with k ∈ ℕ^T, Σ k = n, in lexicographic order of k.
    """
    if n_tasks < 2:
        raise InvalidParameterError(f"a preference simplex needs at least 2 tasks, got {n_tasks}")
    if subdivisions < 1:
        raise InvalidParameterError(f"a simplex grid needs at least 1 subdivision, got {subdivisions}")
    if n_tasks == 2:
        lam = torch.linspace(0.0, 1.0, subdivisions + 1, dtype=torch.float64)
        return torch.stack([lam, 1.0 - lam], dim=1)
    rows = []
    # stars and bars: T - 1 bar positions among n + T - 1 slots give one composition of n into T parts
    for bars in itertools.combinations(range(subdivisions + n_tasks - 1), n_tasks - 1):
        edges = (-1, *bars, subdivisions + n_tasks - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(n_tasks)])
    rows.sort()
    return torch.tensor(rows, dtype=torch.float64) / subdivisions


def subdivisions_for(n_tasks: int, n_points: int) -> int:
    """The number of subdivisions whose even grid has exactly ``n_points`` points, or raise."""
    if n_tasks == 2:
        if n_points < 2:
            raise InvalidParameterError(f"an even grid of 2 tasks needs at least 2 rays, got {n_points}; "
                                        "use a Dirichlet schedule for a single ray")
        return n_points - 1
    n = 1
    while grid_size(n_tasks, n) < n_points:
        n += 1
    if grid_size(n_tasks, n) == n_points:
        return n
    valid = ", ".join(str(grid_size(n_tasks, k)) for k in range(1, 7))
    raise InvalidParameterError(f"{n_points} rays do not form an even grid on the simplex of {n_tasks} tasks; "
                                f"use one of {valid}, ...")


def default_rays(n_tasks: int) -> int:
    """M when not given: 5 for two tasks (Table 1, Fig. 2), 10 for three (Fig. 11), else the grid of the
    vertices and edge midpoints (2 subdivisions, T(T+1)/2 rays: the cost grows with T², so give M -- or a
    Dirichlet schedule with a few rays -- for many tasks)."""
    if n_tasks == 2:
        return 5
    if n_tasks == 3:
        return 10
    return grid_size(n_tasks, 2)


def default_eval_subdivisions(n_tasks: int) -> int:
    """Subdivisions of the evaluation grid when not given: 10 for two tasks (the paper's 11 points,
    λ ∈ {0, 0.1, ..., 1}); for more tasks the finest even grid with at most 30 points (at least the
    vertices)."""
    if n_tasks == 2:
        return 10
    n = 1
    while grid_size(n_tasks, n + 1) <= MAX_AUTO_EVAL_POINTS:
        n += 1
    return n


def anneal(grid: Tensor, progress: float, temperature: float) -> Tensor:
    """Eq. 3: g_{τ,Q}(λ̃) = λ̃^{τ/Q} / Σ_t λ̃_t^{τ/Q}, row-wise (0⁰ = 1, so τ = 0 gives the centre)."""
    powered = grid.pow(progress / temperature)
    return powered / powered.sum(dim=-1, keepdim=True)


@dataclass
class PreferenceSchedule:
    """The rays of one training step as a function of the training progress τ ∈ [0, 1]."""

    kind: str
    n_tasks: int
    n_rays: int
    temperature: float = 1.0
    concentration: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise InvalidParameterError(f"unknown preference schedule {self.kind!r}; valid: {', '.join(SCHEDULES)}")
        if self.n_rays < 1:
            raise InvalidParameterError(f"the number of rays must be >= 1, got {self.n_rays}")
        self.grid: Tensor | None = None
        if self.kind in ("annealed", "annealed-eq3", "deterministic"):
            self.grid = simplex_grid(self.n_tasks, subdivisions_for(self.n_tasks, self.n_rays))
        self.rng = np.random.default_rng([self.seed, 0x9A10A])

    @property
    def random(self) -> bool:
        return self.grid is None

    def rays(self, progress: float) -> Tensor:
        """``[M, T]`` float64 preferences for training progress ``progress`` (clamped to [0, 1])."""
        tau = min(max(float(progress), 0.0), 1.0)
        if self.kind == "annealed":
            centre = torch.full_like(self.grid, 1.0 / self.n_tasks)
            return (1.0 - tau) * centre + tau * anneal(self.grid, 1.0, self.temperature)
        if self.kind == "annealed-eq3":
            return anneal(self.grid, tau, self.temperature)
        if self.kind == "deterministic":
            return anneal(self.grid, 1.0, self.temperature)
        concentration = self.concentration
        if self.kind == "dirichlet-annealed":
            concentration = max(concentration * (1.0 - tau), MIN_CONCENTRATION)
        draws = self.rng.dirichlet(np.full(self.n_tasks, concentration), size=self.n_rays)
        return torch.from_numpy(draws / draws.sum(axis=1, keepdims=True))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
