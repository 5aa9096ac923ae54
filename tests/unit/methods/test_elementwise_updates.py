"""MoCo, DB-MTL and ExcessMTL update K x P state element-wise every step (issue 29: fresh [K, P] temporaries
made their update a fifth to a quarter of the training step at K = 40). Each update is checked against a
plain float64 implementation of its paper's equations over several steps, in float32 and float64, and the
steps after the first (which creates the state) are watched: no tensor operation makes a new tensor of
K·P entries or more.
"""

from __future__ import annotations

import math

import pytest
import torch
from method_helpers import jacobian, positive_losses
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from mtlflow import methods
from mtlflow.core import numerics
from mtlflow.methods import excessmtl

K, P, STEPS = 5, 4000, 4


class FreshAllocations(TorchFunctionMode):
    """Sizes of the tensors that torch functions return and that share no storage with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {x.untyped_storage().data_ptr() for x in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(x, torch.Tensor)}
        self.sizes += [x.numel() for x in tree_flatten(out)[0]
                       if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs]
        return out


def run_steps(method, steps: list[tuple[torch.Tensor, torch.Tensor]], monkeypatch) -> tuple[list[torch.Tensor], int]:
    """The directions of ``method`` on ``steps`` and the largest fresh tensor made after the first step (the
    work buffers limited to 500 columns, so that a K·P temporary cannot hide in a buffer's size)."""
    monkeypatch.setattr(numerics, "GRAMIAN_BLOCK", (K + 1) * 500)
    monkeypatch.setattr(excessmtl, "BLOCK", K * 500)
    directions = [method.combine(*steps[0])]
    watch = FreshAllocations()
    with watch:
        directions += [method.combine(grads, losses) for grads, losses in steps[1:]]
    return directions, max(watch.sizes)


def random_steps(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(jacobian(10 + t, K, P, scale=1.0 + t).to(dtype), positive_losses(10 + t, K).to(dtype))
            for t in range(STEPS)]


def assert_directions_close(directions: list[torch.Tensor], expected: list[torch.Tensor], dtype) -> None:
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    for got, want in zip(directions, expected, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance * float(want.abs().max()))


def simplex_projection(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto the simplex by bisection on the threshold θ of max(v - θ, 0) (independent of
    the sort-based production code)."""
    low, high = float(v.min()) - 1.0, float(v.max())
    for _ in range(200):
        theta = 0.5 * (low + high)
        low, high = (theta, high) if float(torch.clamp(v - theta, min=0).sum()) > 1.0 else (low, theta)
    return torch.clamp(v - 0.5 * (low + high), min=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moco_update_is_algorithm_1_in_float64_without_jacobian_sized_temporaries(dtype, monkeypatch) -> None:
    """Fernando et al. 2023, Alg. 1: y_i ← y_i − β_k(y_i − h_i); λ ← Π_Δ(λ − γ_k(YYᵀ+ρI)λ); d = Yᵀλ, with
    β_k = β/k^β_σ, γ_k = γ/k^γ_σ divided by trace(YYᵀ+ρI)/K (the default ``step_scale``)."""
    beta, beta_sigma, gamma, gamma_sigma, rho = 0.6, 0.5, 0.3, 0.5, 0.05
    steps = random_steps(dtype)
    method = methods.build("moco", K, beta=beta, beta_sigma=beta_sigma, gamma=gamma, gamma_sigma=gamma_sigma,
                           rho=rho)
    directions, largest = run_steps(method, steps, monkeypatch)
    assert largest < K * P
    y, lam, expected = torch.zeros(K, P, dtype=torch.float64), torch.full((K,), 1.0 / K, dtype=torch.float64), []
    for k, (grads, _) in enumerate(steps, start=1):
        y = y - beta / k ** beta_sigma * (y - grads.double())
        gram = y @ y.T + rho * torch.eye(K, dtype=torch.float64)
        lam = simplex_projection(lam - gamma / k ** gamma_sigma / (torch.trace(gram) / K) * (gram @ lam))
        expected.append(lam @ y)
    assert_directions_close(directions, expected, dtype)
    torch.testing.assert_close(method.last_weights, lam, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dbmtl_update_is_the_papers_balancing_in_float64_without_jacobian_sized_temporaries(dtype, monkeypatch):
    """Lin et al. 2023 (gradient-magnitude balancing of log-loss gradients): ĝ_i ← β_t ĝ_i + (1 − β_t) g_i / L_i
    with β_t = β / t^β_σ, d = Σ_i (max_j ‖ĝ_j‖ / ‖ĝ_i‖) ĝ_i."""
    beta, beta_sigma = 0.8, 0.5
    steps = random_steps(dtype)
    directions, largest = run_steps(methods.build("dbmtl", K, beta=beta, beta_sigma=beta_sigma), steps,
                                    monkeypatch)
    assert largest < K * P
    ema, expected = torch.zeros(K, P, dtype=torch.float64), []
    for t, (grads, losses) in enumerate(steps, start=1):
        factor = beta / t ** beta_sigma
        ema = factor * ema + (1 - factor) * grads.double() / losses.double()[:, None]
        norms = torch.sqrt((ema * ema).sum(dim=1))
        expected.append((norms.max() / norms) @ ema)
    assert_directions_close(directions, expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_excessmtl_update_is_algorithm_1_in_float64_without_jacobian_sized_temporaries(dtype, monkeypatch):
    """He et al. 2024, Alg. 1: S_i ← S_i + g_i ⊙ g_i, e_i = Σ_j g_ij² / √(S_ij + ε); the first step's e is the
    baseline e⁰; then w_i ← w_i exp(η e_i/e_i⁰) / Σ_j w_j exp(η e_j/e_j⁰); d = Σ_i w_i g_i."""
    eta = 0.7
    steps = random_steps(dtype)
    method = methods.build("excessmtl", K, robust_step_size=eta)
    directions, largest = run_steps(method, steps, monkeypatch)
    assert largest < K * P
    squares, weights, baseline, expected = torch.zeros(K, P, dtype=torch.float64), [1.0 / K] * K, None, []
    for grads, _ in steps:
        g = grads.double()
        squares = squares + g * g
        excess = [float(sum(g[i] ** 2 / torch.sqrt(squares[i] + 1e-7))) for i in range(K)]
        if baseline is None:
            baseline = excess
        else:
            raised = [w * math.exp(eta * e / e0) for w, e, e0 in zip(weights, excess, baseline, strict=True)]
            weights = [r / sum(raised) for r in raised]
        expected.append(torch.tensor(weights, dtype=torch.float64) @ g)
    assert_directions_close(directions, expected, dtype)
    torch.testing.assert_close(method.last_weights, torch.tensor(weights, dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_imtl_update_is_imtlg_closed_form_on_scaled_gradients_without_jacobian_sized_temporaries(dtype, monkeypatch):
    """Liu et al. 2021 (hybrid IMTL): IMTL-G on the scaled gradients h_i = e^{s_i} g_i, in its closed form
    α_{2..K} = h_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 − Σ_{i≥2} α_i (D = [h_1 − h_i], U = [u_1 − u_i], u_i = h_i/‖h_i‖), and
    d = Σ_i α_i h_i; logged weights α_i e^{s_i}."""
    method = methods.build("imtl", K)
    with torch.no_grad():
        method.log_scales.copy_(torch.tensor([0.4, -0.3, 1.1, 0.0, -0.8]))
    steps = random_steps(dtype)
    directions, largest = run_steps(method, steps, monkeypatch)
    assert largest < K * P
    scales, expected = torch.exp(method.log_scales.detach().double()), []
    for grads, _ in steps:
        h = scales[:, None] * grads.double()
        u = h / torch.sqrt((h * h).sum(dim=1, keepdim=True))
        d_rows, u_rows = h[:1] - h[1:], u[:1] - u[1:]
        rest = torch.linalg.solve((d_rows @ u_rows.T).T, (h[0] @ u_rows.T))   # α_{2..K}ᵀ: (D Uᵀ)ᵀ α = U h_1
        alpha = torch.cat([1 - rest.sum().reshape(1), rest])
        expected.append(alpha @ h)
    assert_directions_close(directions, expected, dtype)
    torch.testing.assert_close(method.last_weights.double(), alpha * scales, rtol=1e-5, atol=1e-7)
