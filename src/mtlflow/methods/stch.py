"""STCH: smooth Tchebycheff scalarisation.

Lin, Zhang, Yang, Liu, Wang & Zhang, "Smooth Tchebycheff Scalarization for Multi-Objective
Optimization", ICML 2024. The Tchebycheff scalarisation max_i λ_i (f_i - z_i*) is
replaced by its smooth upper bound

    g_μ(x) = μ log Σ_i exp(λ_i (f_i(x) - z_i*) / μ),
    max_i u_i ≤ μ log Σ_i exp(u_i / μ) ≤ max_i u_i + μ log K,

whose gradient is the softmax(u/μ)-weighted sum of the task gradients: the worst task (relative to
the reference point) gets most of the weight, all of it as μ → 0.

For multi-task learning this file follows LibMTL's STCH, which LibMTL adapted from the official
STCH_MTL code (we read LibMTL, not the official repository); its defaults ``STCH_mu 1.0`` and
``STCH_warmup_epoch 4`` are the defaults here. It works on normalised log-losses:

* epochs 1..warmup_epochs: the scale-invariant objective Σ_i log L_i;
* epoch warmup_epochs + 1: the same objective, and the mean training loss of every task over this
  epoch becomes the nadir vector n;
* afterwards: L = K μ log Σ_i exp(log(L_i / n_i) / μ), i.e. f_i = log L_i, z_i* = log n_i, λ = 1,
  multiplied by K as LibMTL does (so that it is on the scale of a sum of K losses).

The effective loss weights (logged) are K softmax(u/μ)_i / L_i with u_i = log(L_i / n_i).
``min_losses`` shifts losses that can be negative (the toy problem).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, non_negative, positive
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods._support import min_losses_hparam, shifted_losses
from mtlflow.methods.base import LossWeighting


def smooth_tchebycheff(values: Tensor, mu: float) -> Tensor:
    """μ log Σ_i exp(u_i / μ), computed stably (logsumexp)."""
    return mu * torch.logsumexp(values / mu, dim=-1)


class SmoothTchebycheff(LossWeighting):
    name = "stch"
    paper = "Lin et al., Smooth Tchebycheff Scalarization for Multi-Objective Optimization, ICML 2024"
    equations = "g_μ = μ log Σ_i exp((f_i - z_i*)/μ) on f = log L, z* = log(nadir); Σ log L warm-up"
    hparams = {
        "min_losses": min_losses_hparam(),
        "mu": HParam(1.0, "smoothing parameter μ", positive),
        "warmup_epochs": HParam(4, "epochs of Σ log L_i before the nadir epoch", non_negative, kind=int),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.completed_epochs = 0
        self.nadir: Tensor | None = None
        self._nadir_sum = torch.zeros(n_tasks, dtype=torch.float64)
        self._nadir_steps = 0

    @property
    def phase(self) -> str:
        """'warmup', 'nadir' (the epoch estimating the nadir vector) or 'stch'."""
        if self.nadir is not None:
            return "stch"
        return "warmup" if self.completed_epochs < self.hp["warmup_epochs"] else "nadir"

    def normalised_log_losses(self, shifted: Tensor) -> Tensor:
        return torch.log(shifted / self.nadir.to(shifted))

    def weights(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses.detach(), self.min_losses)
        if self.nadir is None:
            return 1.0 / shifted
        soft = torch.softmax(self.normalised_log_losses(shifted) / self.hp["mu"], dim=0)
        return self.n_tasks * soft / shifted

    def objective(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses, self.min_losses)
        self.last_weights = self.weights(losses.detach())
        if self.nadir is None:
            if self.phase == "nadir":
                self._nadir_sum += cpu_float64(shifted)
                self._nadir_steps += 1
            return shifted.log().sum()
        return self.n_tasks * smooth_tchebycheff(self.normalised_log_losses(shifted), self.hp["mu"])

    def on_epoch_end(self, epoch: int) -> None:
        if self.phase == "nadir" and self._nadir_steps > 0:
            self.nadir = self._nadir_sum / self._nadir_steps
        self.completed_epochs += 1

    def state_dict(self) -> dict[str, Any]:
        return {"completed_epochs": self.completed_epochs,
                "nadir": None if self.nadir is None else self.nadir.clone(),
                "nadir_sum": self._nadir_sum.clone(), "nadir_steps": self._nadir_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.completed_epochs = int(state["completed_epochs"])
        self.nadir = None if state["nadir"] is None else cpu_float64(state["nadir"])
        self._nadir_sum = cpu_float64(state["nadir_sum"])
        self._nadir_steps = int(state["nadir_steps"])
