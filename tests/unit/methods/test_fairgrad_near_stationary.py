"""FairGrad at gradients *nearly* Pareto-stationary: where the α-fair solve (Ban & Ji 2024) fails its residual
check close to the front, the min-norm weights are taken and counted; farther away the failure is raised.

The Gramians are built at a controlled margin: two gradients at an angle π − ε have the min-norm point of
their unit vectors at half their sum, of squared norm sin²(ε/2) -- the stationarity margin, by hand."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from mtlflow import methods
from mtlflow.core.errors import SolverError
from mtlflow.methods.solvers import (
    FAIRGRAD_NEAR_STATIONARITY_TOL,
    FAIRGRAD_STATIONARITY_TOL,
    FairGradResidualError,
    fairgrad_weights,
    stationarity_margin,
)


def opposed_pair(eps: float, ratio: float) -> np.ndarray:
    """Two gradients at an angle π − ε, of norms 1 and ``ratio`` (a loss in grams next to a 0-1 loss)."""
    return np.array([[1.0, 0.0], [-ratio * np.cos(eps), ratio * np.sin(eps)]])


def hand_min_norm_weights(g: np.ndarray) -> np.ndarray:
    """argmin_γ∈[0,1] ‖γ g1 + (1 − γ) g2‖²: γ = (g2·g2 − g1·g2) / ‖g1 − g2‖² (interior here)."""
    gamma = (g[1] @ g[1] - g[0] @ g[1]) / ((g[0] - g[1]) @ (g[0] - g[1]))
    assert 0 < gamma < 1
    return np.array([gamma, 1 - gamma])


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_fairgrad_takes_the_min_norm_weights_where_the_solve_fails_at_nearly_stationary_gradients(
        alpha: float, caplog: pytest.LogCaptureFixture) -> None:
    eps, ratio = 3e-3, 1e3
    g = opposed_pair(eps, ratio)
    margin = np.sin(eps / 2) ** 2
    assert stationarity_margin(g @ g.T) == pytest.approx(margin, rel=1e-6)
    # above the exact-stationarity pre-check, within the near-stationary tolerance
    assert FAIRGRAD_STATIONARITY_TOL < margin <= FAIRGRAD_NEAR_STATIONARITY_TOL
    with pytest.raises(FairGradResidualError):      # the solve itself really stops short here
        fairgrad_weights(g @ g.T, alpha)

    method = methods.build("fairgrad", 2, alpha=alpha)
    d = method.combine(torch.from_numpy(g), torch.ones(2, dtype=torch.float64))
    expected = hand_min_norm_weights(g)
    np.testing.assert_allclose(method.last_weights.numpy(), expected, rtol=1e-6)
    # the update is the min-norm point, up to the trainer's "mean" rescaling of the combined direction
    direction = expected @ g
    cosine = float(d.numpy() @ direction) / float(np.linalg.norm(d.numpy()) * np.linalg.norm(direction))
    assert cosine == pytest.approx(1.0, rel=1e-6)
    assert method.last_residual is None
    assert method.stationary_steps == 1 and method.near_stationary_steps == 1
    assert method.state_dict() == {"stationary_steps": 1, "near_stationary_steps": 1}
    with caplog.at_level(logging.INFO, logger="mtlflow.methods.fairgrad"):
        method.on_epoch_end(4)
        method.on_epoch_end(5)                       # nothing in this epoch: no line
    (record,) = caplog.records
    assert record.getMessage() == ("fairgrad: 1 step(s) of epoch 4 took the min-norm weights: the α-fair solve did "
                                   f"not converge at nearly Pareto-stationary gradients (stationarity margin up to "
                                   f"{margin:.3g})")


def test_fairgrad_still_raises_a_failed_solve_far_from_stationarity() -> None:
    eps, ratio = 1.0, 1e6                            # margin sin²(0.5) = 0.23, norms six orders apart
    g = opposed_pair(eps, ratio)
    margin = np.sin(eps / 2) ** 2
    assert stationarity_margin(g @ g.T) == pytest.approx(margin, rel=1e-6) and margin > FAIRGRAD_NEAR_STATIONARITY_TOL
    method = methods.build("fairgrad", 2, alpha=1.0)
    with pytest.raises(SolverError) as error:
        method.combine(torch.from_numpy(g), torch.ones(2, dtype=torch.float64))
    assert str(error.value).startswith("fairgrad: the α-fair solve stopped with relative residual ")
    assert str(error.value).endswith("; the task gradients are not near Pareto-stationary (stationarity margin "
                                     f"{margin:.3g} > {FAIRGRAD_NEAR_STATIONARITY_TOL:g})")
    assert method.stationary_steps == 0 and method.near_stationary_steps == 0


def test_fairgrad_solves_normally_at_the_same_norms_farther_from_the_front() -> None:
    """The fallback is for failed solves only: at ε = 0.3 (margin 0.022) the same norms solve to the residual."""
    g = opposed_pair(0.3, 1e3)
    method = methods.build("fairgrad", 2, alpha=1.0)
    method.combine(torch.from_numpy(g), torch.ones(2, dtype=torch.float64))
    w, m = method.last_weights.numpy(), g @ g.T
    assert method.near_stationary_steps == 0 and method.last_residual <= 1e-4
    assert np.max(np.abs(m @ w - 1 / w) * w) <= 1e-4          # α = 1: w_i (GᵀG w)_i = 1


def test_fairgrad_resumes_its_count_of_near_stationary_steps() -> None:
    saved = methods.build("fairgrad", 2)
    saved.stationary_steps, saved.near_stationary_steps = 5, 2
    resumed = methods.build("fairgrad", 2)
    resumed.load_state_dict(saved.state_dict())
    assert (resumed.stationary_steps, resumed.near_stationary_steps) == (5, 2)
    older = methods.build("fairgrad", 2)
    older.load_state_dict({"stationary_steps": 3})  # a checkpoint from before the near-stationary count
    assert (older.stationary_steps, older.near_stationary_steps) == (3, 0)
