"""ExcessMTL: task weights driven by estimated excess risks.

He, Zhou, Zhang, Yun, Xu, Zeng, Chilimbi & Zhao, "Robust Multi-Task Learning with Excess Risks",
ICML 2024 (Algorithm 1). Loss-based weighting over-weights tasks with label noise (a large
Bayes error); ExcessMTL weights tasks by their *excess* risk L_i(θ) − L_i(θ_i*), i.e. by how far each
task is from convergence, in a min–max (robust) formulation solved by exponentiated-gradient updates
of the weights on the simplex.

* Excess-risk estimate: a second-order Taylor expansion around the task optimum gives
  L_i(θ) − L_i(θ_i*) ≈ ½ g_iᵀ H_i⁻¹ g_i; H_i is approximated by the diagonal AdaGrad / empirical-Fisher
  matrix of the accumulated squared gradients, H_i ≈ diag(√(Σ_{s≤t} g_{i,s}² + ε)), so

      e_i = Σ_j g_ij² / √(S_ij + ε),    S_i ← S_i + g_i ⊙ g_i,   ε = 1e-7

  (the constant ½ cancels in the normalisation below; S_i is a K×P state, checkpointed, updated in
  place; e is summed in float32 -- float64 for float64 gradients -- through a block-sized buffer).
* Scale normalisation: r_i = e_i / e_i⁰ with e⁰ the estimate at the first step (the official code and
  LibMTL), or its mean over ``warmup_epochs`` epochs during which the weights stay uniform (the
  paper's appendix recommends collecting statistics for a few epochs, 3 per TorchJD's documentation).
* Weight update (multiplicative weights / exponentiated gradient, step η = ``robust_step_size``):
  w_i ← w_i exp(η r_i) / Σ_j w_j exp(η r_j), from w = 1/K; done in log space (no overflow).
* Update: d = Σ_i w_i g_i.

Choices (documented deviations): defaults are the official code's and LibMTL's (η = 1e-2,
first-step baseline; TorchJD uses η = 1); the first step only records the baseline and does not
update the weights (official code; TorchJD updates once with the raw estimates); weights live on the
simplex (the paper) where the official code keeps them summing to K -- the trainer's ×K rescaling of
convex combinations restores the official scale. If a task's baseline estimate is zero (a zero
gradient) the baseline is recorded at the next step instead (the official code would divide by
zero).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, non_negative, positive
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods.base import GradientMethod

EPS = 1e-7
#: entries of J that :func:`excess_risk_estimates` reads at once (its work buffer)
BLOCK = 1 << 19


def excess_risk_estimates(grads: Tensor, sq_sum: Tensor) -> Tensor:
    """e_i = Σ_j g_ij² / √(S_ij + ε) ``[K]`` in float32 (float64 for float64 gradients), read block by block
    through one small buffer: fresh [K, P] temporaries for g², S + ε, its root and the quotient made
    ExcessMTL's update a quarter of the training step at K = 40 (issue 29)."""
    k, p = grads.shape
    dtype = torch.float64 if grads.dtype == torch.float64 else torch.float32
    columns = max(1, min(p, BLOCK // max(k, 1)))
    buffer = torch.empty(k, columns, dtype=dtype, device=grads.device)
    estimates = torch.zeros(k, dtype=dtype, device=grads.device)
    for start in range(0, p, columns):
        rows = grads[:, start:start + columns]
        part = buffer[:, :rows.shape[1]]
        part.copy_(sq_sum[:, start:start + columns]).add_(EPS).sqrt_()   # √(S + ε)
        torch.div(rows, part, out=part).mul_(rows)                       # g² / √(S + ε)
        estimates += part.sum(dim=1)
    return estimates


class ExcessMTL(GradientMethod):
    name = "excessmtl"
    paper = "He et al., Robust Multi-Task Learning with Excess Risks, ICML 2024"
    equations = ("Alg. 1: e_i = Σ_j g_ij²/√(S_ij+ε) (Taylor + diagonal AdaGrad Hessian); "
                 "w ← w ⊙ exp(η e/e⁰) / Z; d = Σ w_i g_i")
    natural_scale = "mean"
    hparams = {
        "robust_step_size": HParam(1e-2, "step η of the exponentiated weight update", positive),
        "warmup_epochs": HParam(0, "epochs with uniform weights whose mean excess-risk estimate is the "
                                "baseline (0: the first step's estimate, as the official code)",
                                non_negative, kind=int),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.sq_sum: Tensor | None = None                  # S, [K, P]
        self.log_weights = torch.full((n_tasks,), -math.log(n_tasks), dtype=torch.float64)
        self.baseline: Tensor | None = None                # e⁰, [K]
        self.warmup_sum = torch.zeros(n_tasks, dtype=torch.float64)
        self.warmup_steps = 0
        self.epochs_done = 0

    def excess_risks(self, grads: Tensor) -> Tensor:
        """Accumulate g ⊙ g into S (in place) and return the estimates e_i (float64, CPU)."""
        g = grads.detach()
        if self.sq_sum is None:
            self.sq_sum = torch.zeros_like(g)
        self.sq_sum = self.sq_sum.to(device=g.device, dtype=g.dtype)
        self.sq_sum.addcmul_(g, g)
        return cpu_float64(excess_risk_estimates(g, self.sq_sum))

    def task_weights(self) -> Tensor:
        return torch.softmax(self.log_weights, dim=0)

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        excess = self.excess_risks(grads)
        if self.epochs_done < self.hp["warmup_epochs"]:
            self.warmup_sum += excess
            self.warmup_steps += 1
        elif self.baseline is None:
            warmup_mean = self.warmup_sum / max(self.warmup_steps, 1)
            from_warmup = self.warmup_steps > 0 and bool((warmup_mean > 0).all())
            candidate = warmup_mean if from_warmup else excess
            if bool((candidate > 0).all()):
                self.baseline = candidate.clone()
                if from_warmup:  # the first step after the warm-up already updates the weights
                    self._update(excess)
        else:
            self._update(excess)
        w = self.task_weights()
        self.last_weights = w.clone()
        return w.to(device=grads.device, dtype=grads.dtype) @ grads

    def _update(self, excess: Tensor) -> None:
        self.log_weights = torch.log_softmax(self.log_weights + self.hp["robust_step_size"] * excess / self.baseline,
                                             dim=0)

    def on_epoch_end(self, epoch: int) -> None:
        self.epochs_done += 1

    def state_dict(self) -> dict[str, Any]:
        return {"sq_sum": None if self.sq_sum is None else self.sq_sum.clone(),
                "log_weights": self.log_weights.clone(),
                "baseline": None if self.baseline is None else self.baseline.clone(),
                "warmup_sum": self.warmup_sum.clone(), "warmup_steps": self.warmup_steps,
                "epochs_done": self.epochs_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sq_sum = None if state["sq_sum"] is None else state["sq_sum"].clone()
        self.log_weights = cpu_float64(state["log_weights"])
        self.baseline = None if state["baseline"] is None else cpu_float64(state["baseline"])
        self.warmup_sum = cpu_float64(state["warmup_sum"])
        self.warmup_steps = int(state["warmup_steps"])
        self.epochs_done = int(state["epochs_done"])
