"""PaLoRA's preference grids and schedules (Eq. 3, App. C, Sec. 6.1 / App. D variants)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtlflow.core.errors import InvalidParameterError
from mtlflow.pareto.simplex import (
    MIN_CONCENTRATION,
    PreferenceSchedule,
    anneal,
    default_eval_subdivisions,
    default_rays,
    grid_size,
    simplex_grid,
    subdivisions_for,
)


def test_two_task_grid_is_the_papers_linspace():
    grid = simplex_grid(2, 4)
    lam = torch.linspace(0, 1, 5, dtype=torch.float64)  # App. C: torch.linspace(0, 1, M), λ = [λ, 1 − λ]
    assert torch.equal(grid, torch.stack([lam, 1 - lam], dim=1))
    assert simplex_grid(2, default_eval_subdivisions(2)).shape == (11, 2)  # the 11-point evaluation grid


@pytest.mark.parametrize("n_tasks,subdivisions", [(3, 3), (3, 5), (4, 2), (5, 3)])
def test_triangular_grid_is_even_and_complete(n_tasks, subdivisions):
    grid = simplex_grid(n_tasks, subdivisions)
    assert grid.shape == (grid_size(n_tasks, subdivisions), n_tasks) == (math.comb(subdivisions + n_tasks - 1,
                                                                                     n_tasks - 1), n_tasks)
    assert torch.allclose(grid.sum(dim=1), torch.ones(len(grid), dtype=torch.float64))
    steps = grid * subdivisions
    assert torch.allclose(steps, steps.round()) and bool((grid >= 0).all())  # lattice points k / n
    assert len({tuple(r) for r in steps.round().int().tolist()}) == len(grid)  # no duplicates
    assert simplex_grid(3, 3).shape[0] == 10  # Fig. 11: 10 rays for three tasks


def test_ray_counts_must_form_an_even_grid():
    assert subdivisions_for(3, 10) == 3 and subdivisions_for(2, 5) == 4
    with pytest.raises(InvalidParameterError) as caught:
        subdivisions_for(3, 7)
    # the first six grid sizes of three tasks, C(n + 2, 2) for n = 1..6
    assert str(caught.value) == ("7 rays do not form an even grid on the simplex of 3 tasks; "
                                 "use one of 3, 6, 10, 15, 21, 28, ...")
    with pytest.raises(InvalidParameterError) as caught:
        PreferenceSchedule("annealed", 2, 1)
    assert str(caught.value) == ("an even grid of 2 tasks needs at least 2 rays, got 1; "
                                 "use a Dirichlet schedule for a single ray")
    assert default_rays(2) == 5 and default_rays(3) == 10 and default_rays(5) == grid_size(5, 2)
    assert grid_size(3, default_eval_subdivisions(3)) <= 30


@pytest.mark.parametrize("n_tasks", range(3, 13))
def test_the_default_evaluation_grid_is_the_finest_with_at_most_30_points_or_the_vertices(n_tasks):
    # brute force over the subdivisions: the largest n whose grid has at most 30 points; 1 (the K vertices)
    # when even n = 2 has more (K >= 8: K(K + 1)/2 > 30)
    fitting = [n for n in range(1, 40) if grid_size(n_tasks, n) <= 30]
    assert default_eval_subdivisions(n_tasks) == (max(fitting) if fitting else 1)
    assert default_eval_subdivisions(8) == 1 and grid_size(8, 2) == 36


@settings(max_examples=40, deadline=None)
@given(n_tasks=st.integers(2, 4), subdivisions=st.integers(1, 4), temperature=st.floats(0.5, 5.0))
def test_annealed_schedule_starts_at_the_centre_and_ends_at_the_grid(n_tasks, subdivisions, temperature):
    grid = simplex_grid(n_tasks, subdivisions)
    sched = PreferenceSchedule("annealed", n_tasks, len(grid), temperature=temperature)
    centre = torch.full((len(grid), n_tasks), 1.0 / n_tasks, dtype=torch.float64)
    assert torch.allclose(sched.rays(0.0), centre)
    end = sched.rays(1.0)
    # τ = 1: g_{1,Q}(λ̃), the non-annealed deterministic rays; for Q = 1 exactly the grid
    fixed = PreferenceSchedule("deterministic", n_tasks, len(grid), temperature=temperature)
    assert torch.allclose(end, fixed.rays(0.3))
    assert torch.allclose(PreferenceSchedule("annealed", n_tasks, len(grid)).rays(1.0), grid)
    for tau in (0.0, 0.25, 0.5, 1.0):
        rays = sched.rays(tau)
        assert torch.allclose(rays.sum(dim=1), torch.ones(len(grid), dtype=torch.float64)) and bool((rays >= 0).all())


def test_annealed_rays_move_monotonically_from_the_centre_to_the_faces():
    sched = PreferenceSchedule("annealed", 3, 10)
    centre = torch.full((3,), 1 / 3, dtype=torch.float64)
    distances = torch.stack([(sched.rays(t) - centre).norm(dim=1) for t in torch.linspace(0, 1, 21).tolist()])
    assert bool((distances[1:] >= distances[:-1] - 1e-12).all())
    assert float(distances[-1].max()) > 0.5  # the vertices are reached


@pytest.mark.parametrize("kind", ["annealed", "annealed-eq3"])
def test_progress_outside_zero_one_is_clamped_to_the_schedule_s_ends(kind):
    # a run trained past its stored horizon keeps the final rays; τ = 1.5 would extrapolate past the grid
    sched = PreferenceSchedule(kind, 3, 10, temperature=2.0)
    assert torch.equal(sched.rays(1.5), sched.rays(1.0)) and torch.equal(sched.rays(-0.5), sched.rays(0.0))
    assert not torch.allclose(sched.rays(1.0), sched.rays(0.99))


def test_eq3_by_hand():
    grid = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    tau, q = 0.6, 2.0
    expected = torch.tensor([0.25 ** (tau / q), 0.75 ** (tau / q)], dtype=torch.float64)
    assert torch.allclose(anneal(grid, tau, q), (expected / expected.sum()).unsqueeze(0))


def test_dirichlet_variants_are_seeded_resumable_and_anneal_to_the_vertices():
    a = PreferenceSchedule("dirichlet", 3, 4, concentration=2.0, seed=7)
    b = PreferenceSchedule("dirichlet", 3, 4, concentration=2.0, seed=7)
    first = a.rays(0.1)
    assert first.shape == (4, 3) and torch.equal(first, b.rays(0.9))  # random: τ does not matter
    state = a.state_dict()
    nxt = a.rays(0.2)
    a.load_state_dict(state)
    assert torch.equal(a.rays(0.2), nxt)  # exact resume from the checkpointed generator
    assert not torch.equal(PreferenceSchedule("dirichlet", 3, 4, seed=8).rays(0.0), first)
    single = PreferenceSchedule("dirichlet", 2, 1)  # the PHN setting: one random ray per batch
    assert single.rays(0.5).shape == (1, 2)
    late = PreferenceSchedule("dirichlet-annealed", 2, 200, concentration=1.0, seed=1).rays(1.0)
    early = PreferenceSchedule("dirichlet-annealed", 2, 200, concentration=1.0, seed=1).rays(0.0)
    assert torch.isfinite(late).all() and torch.allclose(late.sum(dim=1), torch.ones(200, dtype=torch.float64))
    # concentration p(1 − τ) → MIN_CONCENTRATION: the draws collapse onto the vertices
    assert float(late.max(dim=1).values.min()) > 0.99 > float(early.max(dim=1).values.min())
    assert MIN_CONCENTRATION > 0


def _distinct(rays: torch.Tensor) -> int:
    return len({tuple(round(float(v), 9) for v in r) for r in rays})


def test_three_task_rays_leave_the_centre_gradually_and_stay_distinct():
    # Fig. 11 (3 tasks, M = 10): every ray starts at the centre and its distance to it grows in
    # proportion to τ until it reaches its grid point; no two rays coincide once training has started
    sched = PreferenceSchedule("annealed", 3, 10)
    grid = simplex_grid(3, 3)
    centre = torch.full((3,), 1 / 3, dtype=torch.float64)
    final = (grid - centre).norm(dim=1)
    for tau in torch.linspace(0, 1, 41).tolist():
        rays = sched.rays(tau)
        assert torch.allclose((rays - centre).norm(dim=1), tau * final, atol=1e-12)
        assert _distinct(rays) == (1 if tau == 0 else 10)
    assert torch.allclose(sched.rays(1.0), grid)


def test_literal_eq3_schedule_puts_edge_rays_on_the_boundary_at_the_first_step():
    # the audit's finding, kept as the `annealed-eq3` option: just after τ = 0 the 9 rays with a zero
    # component already lie on the simplex's boundary (0^{τ/Q} = 0) and the 6 edge rays collapse in
    # pairs onto the edge midpoints, leaving 7 distinct rays (within 0.01) instead of 10
    rays = PreferenceSchedule("annealed-eq3", 3, 10).rays(0.01)
    assert int((rays == 0).any(dim=1).sum()) == 9
    clusters: list[torch.Tensor] = []
    for r in rays:
        if not any(float((r - c).abs().max()) < 0.01 for c in clusters):
            clusters.append(r)
    assert len(clusters) == 7
    assert (PreferenceSchedule("annealed", 3, 10).rays(0.01) == 0).any(dim=1).sum() == 0


def test_palora_checkpoint_keeps_the_schedule_horizon():
    from mtlflow.methods.palora import PaLoRA

    method = PaLoRA(2)
    method.total_steps = 120
    resumed = PaLoRA(2)
    resumed.total_steps = 240          # what setup() computes for a resume with twice the epochs
    resumed.load_state_dict(method.state_dict())
    assert resumed.total_steps == 120
    assert resumed.progress(60) == method.progress(60) == pytest.approx(60 / 119)


@pytest.mark.parametrize("call, message", [
    (lambda: simplex_grid(1, 3), "a preference simplex needs at least 2 tasks, got 1"),
    (lambda: simplex_grid(3, 0), "a simplex grid needs at least 1 subdivision, got 0"),
    (lambda: PreferenceSchedule("cosine", 2, 5),
     "unknown preference schedule 'cosine'; valid: annealed, annealed-eq3, deterministic, dirichlet, "
     "dirichlet-annealed"),
    (lambda: PreferenceSchedule("dirichlet", 2, 0), "the number of rays must be >= 1, got 0"),
])
def test_invalid_grids_and_schedules_are_refused_with_one_clear_line(call, message):
    with pytest.raises(InvalidParameterError) as error:
        call()
    assert str(error.value) == message


def test_only_grid_schedules_have_a_grid():
    for kind in ("dirichlet", "dirichlet-annealed"):
        sched = PreferenceSchedule(kind, 3, 4)
        assert sched.grid is None and sched.random
    for kind in ("annealed", "annealed-eq3", "deterministic"):
        sched = PreferenceSchedule(kind, 3, 10)
        assert torch.equal(sched.grid, simplex_grid(3, 3)) and not sched.random
