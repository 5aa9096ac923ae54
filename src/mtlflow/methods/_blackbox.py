"""ASMG: the adaptive stochastic multi-objective gradient method for black-box MOO.

Feiyang Ye, *Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization*, PhD
thesis, UTS 2024, Chapter 4, Algorithm 3 (Ye, Lyu, Wang, Zhang & Tsang, ICLR 2024). The objectives
F_1..F_m are only *evaluated*, never differentiated. Each is smoothed by a Gaussian search
distribution N(μ, Σ) with diagonal Σ, J_i(μ, Σ) = E[F_i(x)] (Eq. 4.3), and one iteration t is

* N samples x_j = μ_t + Σ_t^{1/2} z_j, z_j ~ N(0, I), and the m·(N + 1) values F_i(x_j), F_i(μ_t);
* Monte Carlo estimates with the baseline F_i(μ_t) (unbiased; Lemma A.6), elementwise for diagonal Σ
  with σ = diag(Σ) and ΔF_ij = F_i(x_j) − F_i(μ_t):
  p̂_i = (1/N) Σ_j z_j ΔF_ij (Eq. 4.12),  ĥ_i = (1/2N) Σ_j (z_j² − 1) ΔF_ij (Eq. 4.13),
  ĝ_i = σ^{-1/2} ⊙ p̂_i (Eq. 4.15, ∇_μ J_i),  Ĝ_i = σ^{-1} ⊙ ĥ_i (Eq. 4.16, diag ∇_Σ J_i);
* λ̃^t = argmin_{λ ∈ Δ} ‖Σ λ_i p̂_i‖² + 2‖Σ λ_i ĥ_i‖² (Eq. 4.10), i.e. the min-norm point of the
  columns (p̂_i; √2 ĥ_i) (Eq. 4.11), solved exactly on the m x m Gram matrix;
* momentum λ^t = (1 − γ_t) λ^{t−1} + γ_t λ̃^t with γ_t = 1/(t + 1) (Eq. 4.17; γ_0 = 1);
* μ_{t+1} = μ_t − β Σ_i λ_i Σ_t ĝ_i and Σ_{t+1}^{-1} = Σ_t^{-1} + 2β Σ_i λ_i Ĝ_i (Eq. 4.14).

``update="normalized"`` is the thesis' rank/scale transformation (Appendix A.2.5, Eqs. A.152/A.153):
the aggregated values Σ_i λ_i F_i(x_j) are standardised over the N samples (h_j) and
μ_{t+1} = μ_t − (β/N) Σ_j (x_j − μ_t) h_j, Σ_{t+1}^{-1} = Σ_t^{-1} + (β/N) Σ_j Σ_t^{-1} diag((x_j − μ_t)²Σ_t^{-1}) h_j.
The thesis recommends it "in practice, to avoid the scaling problem" without saying whether its
experiments use it; with the raw update (Eq. 4.14) the precision Σ^{-1} turns negative as soon as
2β·ΔF is large (Theorem 4.2 assumes Ĝ ⪰ 0), so it is the default here (see the measurements in docs/research/thesis.md).
Both updates multiply each precision by a ratio (1 + 2β Σ λ_i ĥ_i, resp. 1 + (β/N) Σ_j z_j² h_j) that
can reach ≤ 0 when the step overshoots (Theorem 4.2 assumes Ĝ_i ⪰ 0; small d with β = 0.5 triggers it).
The thesis has no guard; here the ratio is floored at ``min_precision_ratio`` (0.1: a variance grows at
most 10x per iteration; 0 turns the guard off and makes an overshoot an error) and ``clipped`` counts the
coordinates where the floor acted (0 in every synthetic run of docs/research/thesis.md).
``weighting="equal"`` is the thesis' ASMG-EW ablation (λ^t = 1/m). The iteration costs O(mNd).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.methods.solvers import min_norm_weights_qp

UPDATES = ("normalized", "raw")
WEIGHTINGS = ("adaptive", "equal")


def smoothing_estimates(z: Tensor, values: Tensor, center: Tensor) -> tuple[Tensor, Tensor]:
    """(p̂ [m, d], ĥ [m, d]) of Eqs. 4.12/4.13 from the noise ``z [N, d]``, ``values [N, m]`` = F(x_j)
    and ``center [m]`` = F(μ_t)."""
    delta = values - center.reshape(1, -1)                         # [N, m]
    n = z.shape[0]
    p_hat = delta.T @ z / n
    h_hat = delta.T @ (z * z - 1.0) / (2 * n)
    return p_hat, h_hat


def mean_gradient(p_hat: Tensor, sigma: Tensor) -> Tensor:
    """ĝ_i = Σ^{-1}(x − μ)ΔF averaged (Eq. 4.15) = σ^{-1/2} ⊙ p̂_i: the unbiased estimate of ∇_μ J_i."""
    return p_hat / sigma.sqrt()


def covariance_gradient(h_hat: Tensor, sigma: Tensor) -> Tensor:
    """Ĝ_i (Eq. 4.16) = σ^{-1} ⊙ ĥ_i: the unbiased estimate of diag(∇_Σ J_i)."""
    return h_hat / sigma


def asmg_lambda(p_hat: Tensor, h_hat: Tensor) -> Tensor:
    """λ̃ of Eq. 4.10: the min-norm weights of the columns (p̂_i; √2 ĥ_i) of Eq. 4.11 (float64, [m])."""
    gram = p_hat @ p_hat.T + 2.0 * (h_hat @ h_hat.T)
    return min_norm_weights_qp(gram).to(torch.float64)


@dataclass
class ASMGConfig:
    beta: float = 0.1
    n_samples: int = 50
    sigma0: float = 1.0
    update: str = "normalized"
    weighting: str = "adaptive"
    #: floor of the per-step ratio Σ_{t+1}^{-1} / Σ_t^{-1} (0 = none: a non-positive precision is an error)
    min_precision_ratio: float = 0.1

    def validate(self) -> None:
        if not self.beta > 0:
            raise InvalidParameterError(f"asmg: beta={self.beta!r} must be > 0")
        if not (isinstance(self.n_samples, int) and self.n_samples >= 2):
            raise InvalidParameterError(f"asmg: n_samples={self.n_samples!r} must be an integer >= 2")
        if not self.sigma0 > 0:
            raise InvalidParameterError(f"asmg: sigma0={self.sigma0!r} must be > 0")
        if self.update not in UPDATES:
            raise InvalidParameterError(f"asmg: update={self.update!r} must be one of {', '.join(UPDATES)}")
        if not 0 <= self.min_precision_ratio < 1:
            raise InvalidParameterError(f"asmg: min_precision_ratio={self.min_precision_ratio!r} must be in [0, 1)")
        if self.weighting not in WEIGHTINGS:
            raise InvalidParameterError(f"asmg: weighting={self.weighting!r} must be one of {', '.join(WEIGHTINGS)}")


@dataclass
class ASMGStep:
    """What one iteration computed (for logging and tests)."""

    lam: Tensor                # λ^t applied (after momentum)
    lam_solved: Tensor         # λ̃^t of the QP (1/m for ASMG-EW)
    center: Tensor             # F(μ_t), [m]
    extra: dict[str, Any] = field(default_factory=dict)


class ASMG:
    """Algorithm 3 on a search distribution N(μ, diag(σ)) in float64: ``ask`` the samples, ``tell`` the values."""

    def __init__(self, mean: Tensor, n_objectives: int, config: ASMGConfig, seed: int = 0):
        config.validate()
        self.config = config
        self.mean = mean.detach().to(torch.float64).reshape(-1).clone()
        self.precision = torch.full_like(self.mean, 1.0 / config.sigma0)        # diag(Σ^{-1})
        self.n_objectives = n_objectives
        self.lam = torch.full((n_objectives,), 1.0 / n_objectives, dtype=torch.float64, device=self.mean.device)
        self.t = 0
        #: coordinates whose precision update hit ``min_precision_ratio`` so far
        self.clipped = 0
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self._noise: Tensor | None = None

    @property
    def sigma(self) -> Tensor:
        """diag(Σ_t), the per-coordinate variance."""
        return 1.0 / self.precision

    def ask(self) -> Tensor:
        """The N points x_j = μ_t + Σ_t^{1/2} z_j to evaluate, ``[N, d]`` (Algorithm 3, steps 3-4)."""
        # drawn from the CPU generator, then moved: the same seed gives the same search on CPU and GPU
        self._noise = torch.randn(self.config.n_samples, self.mean.numel(), generator=self.generator,
                                  dtype=torch.float64).to(self.mean.device)
        return self.mean + self.sigma.sqrt() * self._noise

    def tell(self, values: Tensor, center: Tensor) -> ASMGStep:
        """Update μ and Σ from ``values [N, m]`` = F(x_j) and ``center [m]`` = F(μ_t) (steps 5-12)."""
        if self._noise is None:
            raise RuntimeError("ASMG.tell() called without ask()")
        z, self._noise = self._noise, None
        values = values.detach().to(self.mean.device, torch.float64)
        center = center.detach().to(self.mean.device, torch.float64).reshape(-1)
        if not (bool(torch.isfinite(values).all()) and bool(torch.isfinite(center).all())):
            raise NonFiniteLossError("asmg: an objective value is NaN or Inf; lower sigma0 or beta")
        p_hat, h_hat = smoothing_estimates(z, values, center)
        if self.config.weighting == "equal":
            solved = torch.full((self.n_objectives,), 1.0 / self.n_objectives, dtype=torch.float64,
                                device=self.mean.device)
        else:
            solved = asmg_lambda(p_hat, h_hat).to(self.mean.device)
        gamma = 1.0 / (self.t + 1)
        self.lam = (1.0 - gamma) * self.lam + gamma * solved
        sigma = self.sigma
        beta = self.config.beta
        if self.config.update == "raw":
            step_mean = sigma * (self.lam @ mean_gradient(p_hat, sigma))                  # Σ Σ λ_i ĝ_i
            # Σ^{-1} + 2β Σ λ_i Ĝ_i = Σ^{-1} ⊙ (1 + 2β Σ λ_i ĥ_i), since Ĝ_i = Σ^{-1} ĥ_i
            ratio = 1.0 + 2.0 * beta * (self.lam @ h_hat)
        else:
            aggregated = values @ self.lam
            spread = aggregated.std()
            fitness = (aggregated - aggregated.mean()) / spread if spread > 0 else torch.zeros_like(aggregated)
            step_mean = sigma.sqrt() * (fitness @ z) / z.shape[0]                         # (1/N) Σ (x_j − μ) h_j
            ratio = 1.0 + beta * (fitness @ (z * z)) / z.shape[0]                         # A.153 divided by Σ^{-1}
        floor = self.config.min_precision_ratio
        clipped = int((ratio < floor).sum()) if floor > 0 else int((ratio <= 0).sum())
        if floor <= 0 and clipped:
            raise NonFiniteLossError(f"asmg: the covariance update made Σ⁻¹ non-positive at iteration {self.t}; "
                                     "lower beta, use update=normalized or set min_precision_ratio > 0")
        new_precision = self.precision * ratio.clamp_min(floor)
        self.mean = self.mean - self.config.beta * step_mean
        self.precision = new_precision
        self.t += 1
        self.clipped += clipped
        return ASMGStep(self.lam.clone(), solved, center, {"clipped": clipped})

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.clone(), "precision": self.precision.clone(), "lam": self.lam.clone(),
                "t": self.t, "clipped": self.clipped, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.mean.device   # where this run keeps its search state, whatever the checkpoint's
        self.mean = state["mean"].to(device, torch.float64).clone()
        self.precision = state["precision"].to(device, torch.float64).clone()
        self.lam = state["lam"].to(device, torch.float64).clone()
        self.t = int(state["t"])
        self.clipped = int(state["clipped"])
        self.generator.set_state(state["generator"].to("cpu"))


def minimize(objective: Callable[[Tensor], Tensor], x0: Tensor, iterations: int, config: ASMGConfig, seed: int = 0,
             callback: Callable[[int, ASMG, ASMGStep], bool | None] | None = None) -> ASMG:
    """Run ``iterations`` ASMG iterations on ``objective`` (points ``[n, d]`` -> values ``[n, m]``).

    ``callback(t, optimizer, step)`` runs after every iteration; returning True stops early. The
    objective is called twice per iteration: once on the N samples, once on μ_t.
    """
    probe = objective(x0.reshape(1, -1).to(torch.float64))
    optimizer = ASMG(x0, probe.shape[1], config, seed=seed)
    for t in range(iterations):
        samples = optimizer.ask()
        center = objective(optimizer.mean.reshape(1, -1))[0]
        step = optimizer.tell(objective(samples), center)
        if callback is not None and callback(t, optimizer, step):
            break
    return optimizer
