"""MoCo: multi-objective gradient correction with tracked gradients.

Fernando, Shen, Liu, Chaudhury, Murugesan & Chen, "Mitigating Gradient Bias in Multi-objective
Learning: A Provably Convergent Approach", ICLR 2023 (Algorithm 1). MGDA applied to stochastic
gradients is biased; MoCo tracks each task gradient with a moving average and runs projected gradient
descent on the MGDA weights instead of solving the min-norm problem exactly. At step k (k = 1, 2, …)
with stochastic task gradients h_i:

    y_i ← y_i − β_k (y_i − h_i)                              (gradient tracking, Y = [y_1; …; y_K])
    λ  ← Π_Δ( λ − γ_k (Y Yᵀ + ρ I) λ )                       (projected gradient step on ½λᵀ(YYᵀ+ρI)λ)
    d  = Yᵀ λ

with β_k = β / k^{β_σ}, γ_k = γ / k^{γ_σ}, Π_Δ the Euclidean projection onto the simplex, Y = 0 and
λ = 1/K initially (as in LibMTL). For fixed gradients, Y → J and λ → the min-norm (MGDA) weights of
J (of JJᵀ + ρI when ρ > 0), so MoCo tends to MGDA's common descent direction.

Defaults are LibMTL's (implemented from the authors' code): β = 0.5, β_σ = 0.5, γ = 0.1,
γ_σ = 0.5, ρ = 0. Two choices of the authors' code differ from the algorithm and are options:

* ``lambda_update="softmax"``: λ ← softmax(λ − γ_k (YYᵀ + ρI)λ) instead of the projection;
* ``normalize_grads=true``: h_i = L_i · g_i / ‖g_i‖ (gradients rescaled to the loss value) before
  tracking.

Step scale (``step_scale``, a deviation from Algorithm 1 by default): the λ step γ_k (YYᵀ + ρI)λ has
the units of a squared gradient, so a fixed γ suits one gradient scale only -- measured on three
tasks after 2,000 steps, |λ − w_MGDA| = 0.11 at ‖g_i‖ = 0.1 and 7e-5 at ‖g_i‖ = 1, and γ_k ‖YYᵀ‖ > 2
diverges. By default γ_k is divided by trace(YYᵀ + ρI)/K, which makes λ's trajectory independent of
the gradient scale (the same 6e-5 at every scale); the step is then γ_k λmax K/trace ≤ γ_k K,
stable (< 2) for the default γ = 0.1 up to K = 20 tasks whatever the gradients;
``step_scale=none`` is Algorithm 1 and the authors' code (with ``lambda_update=softmax
normalize_grads=true``).

The state (Y, λ, k) is checkpointed. The direction is a convex combination of tracked gradients, so
the trainer multiplies it by K (LibMTL applies no such factor: ``--hp scale_convention=reference``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtlflow.core.errors import NonFiniteValueError
from mtlflow.core.hparams import HParam, non_negative, one_of, positive
from mtlflow.core.numerics import cpu_float64, gramian_float64
from mtlflow.methods.base import GradientMethod


def project_to_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of ``v`` onto {x ≥ 0, Σx = 1} (sort-based algorithm)."""
    u, _ = torch.sort(v, descending=True)
    cumulative = torch.cumsum(u, dim=0) - 1.0
    index = torch.arange(1, v.numel() + 1, dtype=v.dtype, device=v.device)
    support = u - cumulative / index > 0
    rho = int(torch.nonzero(support).max())
    theta = cumulative[rho] / (rho + 1)
    return torch.clamp(v - theta, min=0.0)


class MoCo(GradientMethod):
    name = "moco"
    paper = ("Fernando et al., Mitigating Gradient Bias in Multi-objective Learning: A Provably Convergent "
             "Approach, ICLR 2023")
    equations = "Alg. 1: y_i ← y_i − β_k(y_i − h_i); λ ← Π_Δ(λ − γ_k(YYᵀ+ρI)λ); d = Yᵀλ"
    natural_scale = "mean"
    reference_scale = "sum"
    hparams = {
        "beta": HParam(0.5, "tracking step β (β_k = β / k^beta_sigma)", lambda v: 0 < v <= 1, "in (0, 1]"),
        "beta_sigma": HParam(0.5, "decay exponent of the tracking step", non_negative),
        "gamma": HParam(0.1, "weight step γ (γ_k = γ / k^gamma_sigma)", positive),
        "gamma_sigma": HParam(0.5, "decay exponent of the weight step", non_negative),
        "rho": HParam(0.0, "ℓ2 regularisation ρ of the weight update", non_negative),
        "lambda_update": HParam("projection", "'projection' onto the simplex (Algorithm 1) or 'softmax' "
                                "(the authors' code, LibMTL)", one_of("projection", "softmax")),
        "step_scale": HParam("trace", "'trace': γ_k is divided by trace(YYᵀ + ρI)/K, the mean squared norm of "
                             "the tracked gradients (a step independent of the gradient scale); 'none': γ_k "
                             "as is (Algorithm 1, for gradients of norm ~1)",
                             one_of("trace", "none")),
        "normalize_grads": HParam(False, "rescale each task gradient to norm L_i before tracking (authors' "
                                  "code, LibMTL)", kind=bool),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.tracked: Tensor | None = None   # Y, [K, P]
        self.lam = torch.full((n_tasks,), 1.0 / n_tasks, dtype=torch.float64)
        self.step = 0

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        h = grads.detach()
        if self.hp["normalize_grads"]:
            h = h * (losses.detach().to(h) / (h.norm(dim=1) + 1e-8))[:, None]
        if self.tracked is None:
            self.tracked = torch.zeros_like(h)
        y = self.tracked.to(device=h.device, dtype=h.dtype)
        self.step += 1
        beta_k = self.hp["beta"] / self.step ** self.hp["beta_sigma"]
        gamma_k = self.hp["gamma"] / self.step ** self.hp["gamma_sigma"]
        # y ← y − β_k(y − h) in place: fresh [K, P] temporaries made MoCo's update a fifth of the step at K = 40
        y.lerp_(h, beta_k)
        self.tracked = y
        gram = gramian_float64(y).cpu() + self.hp["rho"] * torch.eye(self.n_tasks, dtype=torch.float64)
        if not bool(torch.isfinite(gram).all()):
            raise NonFiniteValueError("moco: the tracked gradients contain NaN or Inf; check the losses and --lr")
        if self.hp["step_scale"] == "trace":
            mean_square = float(torch.trace(gram)) / self.n_tasks
            if mean_square > 0:   # Y = 0: no gradient information, λ stays
                gamma_k = gamma_k / mean_square
        moved = self.lam - gamma_k * (gram @ self.lam)
        if self.hp["lambda_update"] == "projection":
            self.lam = project_to_simplex(moved)
        else:
            self.lam = torch.softmax(moved, dim=0)
        self.last_weights = self.lam.clone()
        return self.lam.to(device=y.device, dtype=y.dtype) @ y

    def state_dict(self) -> dict[str, Any]:
        return {"tracked": None if self.tracked is None else self.tracked.clone(),
                "lambda": self.lam.clone(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        tracked = state["tracked"]
        self.tracked = None if tracked is None else tracked.clone()
        self.lam = cpu_float64(state["lambda"])
        self.step = int(state["step"])
