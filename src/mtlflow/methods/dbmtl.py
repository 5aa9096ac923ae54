"""DB-MTL: dual-balancing multi-task learning.

Lin, Jiang, Ye, Zhang, Chen, Chen, Liu, Tsang & Kwok, "Dual-Balancing for Multi-Task Learning",
arXiv:2308.12029 (2023). Two balancing steps:

* loss-scale balancing: train on log L_i instead of L_i (∇ log L_i = ∇L_i / L_i, invariant to a
  constant factor on L_i);
* gradient-magnitude balancing: an EMA of each task's log-loss gradient,
  ĝ_i ← β ĝ_i + (1 - β) ∇ log L_i (ĝ_i = 0 at start, β = 0.9), and the update

      d = Σ_i α_i ĝ_i,    α_i = max_j ||ĝ_j|| / ||ĝ_i||,

  so every task contributes a vector of the largest task's norm.

``beta_sigma`` (default 0, LibMTL's ``DB_beta_sigma``) decays the EMA factor as β / t^beta_sigma.
As in the paper, head i is trained on log L_i: the trainer's Jacobian pass leaves ∇L_i in head i's
``.grad`` and ``combine`` multiplies it by 1 / L_i (the heads are known after ``setup``).
The EMA state is K × P (the shared parameters), saved in checkpoints. ``min_losses`` shifts losses
that can be negative (the toy problem). ``last_weights`` logs the α_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam, non_negative
from mtlflow.methods._support import (
    head_parameters,
    min_losses_hparam,
    scale_head_gradients,
    shifted_losses,
)
from mtlflow.methods.base import GradientMethod


def max_norm_balance(ema_grads: Tensor) -> tuple[Tensor, Tensor]:
    """(d, α): d = Σ_i α_i ĝ_i with α_i = max_j ||ĝ_j|| / ||ĝ_i|| (α_i = 0 for a zero row).

    LibMTL divides by ||ĝ_i|| + 1e-8, which distorts α once the gradients are small; the exact
    ratio is used here.
    """
    norms = ema_grads.norm(dim=1)
    nonzero = norms > 0
    alpha = torch.where(nonzero, norms.max() / torch.where(nonzero, norms, 1.0), 0.0)
    return alpha @ ema_grads, alpha


class DualBalancing(GradientMethod):
    name = "dbmtl"
    paper = "Lin et al., Dual-Balancing for Multi-Task Learning, arXiv:2308.12029, 2023"
    equations = "log-loss gradients; EMA ĝ_i; d = Σ_i (max_j ||ĝ_j|| / ||ĝ_i||) ĝ_i"
    hparams = {
        # β = 1 would keep the EMA at its initial 0: every update zero
        "beta": HParam(0.9, "EMA factor β of the log-loss gradients", lambda v: 0 <= v < 1, "in [0, 1)"),
        "beta_sigma": HParam(0.0, "decay exponent: the EMA factor at step t is β / t^beta_sigma", non_negative),
        "min_losses": min_losses_hparam(),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.ema_grads: Tensor | None = None
        self.steps = 0
        self.heads: Sequence[Sequence[Tensor]] | None = None

    def setup(self, trainer: TrainerView) -> None:
        if getattr(trainer.config, "grad_wrt", "parameters") != "parameters":
            raise InvalidParameterError("dbmtl keeps an EMA of per-task gradients of the shared parameters; "
                                        "per-sample representation gradients change with every batch: "
                                        "use grad_wrt=parameters")
        self.heads = head_parameters(trainer)

    def combine(self, grads: Tensor, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses.detach(), self.min_losses).to(grads)
        self.steps += 1
        factor = self.hp["beta"] / self.steps ** self.hp["beta_sigma"]
        if self.ema_grads is None:
            self.ema_grads = torch.zeros_like(grads)
        if self.ema_grads.shape != grads.shape:
            raise InvalidParameterError(
                f"dbmtl keeps an EMA of per-task gradients of shape {tuple(self.ema_grads.shape)} but got "
                f"{tuple(grads.shape)}; use gradients w.r.t. the shared parameters (grad_wrt=parameters)")
        # ĝ ← β ĝ + (1 - β) g / L in place: fresh [K, P] temporaries (∇ log L, both products, their sum) made
        # DB-MTL's update a fifth of the step at K = 40 (issue 29)
        ema = self.ema_grads.to(grads)
        ema.mul_(factor).addcmul_(grads.detach(), ((1.0 - factor) / shifted)[:, None])
        self.ema_grads = ema
        direction, alpha = max_norm_balance(self.ema_grads)
        self.last_weights = alpha.detach()
        scale_head_gradients(self.heads, 1.0 / shifted)
        return direction

    def state_dict(self) -> dict[str, Any]:
        return {"ema_grads": None if self.ema_grads is None else self.ema_grads.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema_grads = None if state["ema_grads"] is None else state["ema_grads"].clone()
        self.steps = int(state["steps"])
