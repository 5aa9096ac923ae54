"""FAMO: fast adaptive multitask optimisation, O(1) time and memory.

Liu, Liu & Stone, "FAMO: Fast Adaptive Multitask Optimization", NeurIPS 2023 (Sec. 3, Alg. 1).

Task weights z = softmax(ξ). The model step follows the gradient of

    Σ_i z_i log(L_i - L_i^min + ε) / c,   c = Σ_i z_i / (L_i - L_i^min + ε)  (held constant),

i.e. effective loss weights w_i = z_i / (c (L_i - L_i^min + ε)), which decrease all log-losses at an
equal rate. After the optimizer step the losses are re-evaluated on the same batch and the logits
are updated with the observed log-loss decrease δ_i = log D_i(before) - log D_i(after),
D = L - L^min + ε: ξ's gradient is J_softmax(ξ)ᵀ δ, applied with Adam (lr ``w_lr``, weight decay
``gamma``). The effective weights sum to 1, so by the scale convention
(:attr:`~mtlflow.methods.base.Method.natural_scale`) the trainer multiplies the step by K; the
official code does not (``--hp scale_convention=reference``). The re-evaluation needs the ``after_optimizer_step`` hook and one extra forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam, SearchRange, non_negative, positive
from mtlflow.methods._support import min_losses_hparam
from mtlflow.methods.base import LossWeighting, StepContext


class FAMO(LossWeighting):
    name = "famo"
    paper = "Liu, Liu & Stone, FAMO: Fast Adaptive Multitask Optimization, NeurIPS 2023"
    equations = "Sec. 3 / Alg. 1: weighted log-loss step, logit update with J_softmaxᵀ δ"
    natural_scale = "mean"
    reference_scale = "sum"
    hparams = {
        "w_lr": HParam(0.025, "learning rate of the logits ξ", positive),
        "gamma": HParam(1e-3, "weight decay of the logits (0.01 CityScapes, 0.001 otherwise)",
                        non_negative, search=SearchRange("categorical", choices=(1e-4, 1e-3, 1e-2),
                                                         source="Gama & Grassi 2025 grid {1e-2, 1e-3, 1e-4}; "
                                                                "FAMO's scripts 1e-3 and 1e-2 (CityScapes)")),
        "eps": HParam(1e-8, "ε added to L - L^min", positive),
        "min_losses": min_losses_hparam(),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.logits = torch.zeros(n_tasks, requires_grad=True)
        self._optimizer = torch.optim.Adam([self.logits], lr=self.hp["w_lr"], weight_decay=self.hp["gamma"])
        self._losses_before: Tensor | None = None

    def _shifted(self, losses: Tensor) -> Tensor:
        shifted = losses - self.min_losses.to(losses) + self.hp["eps"]
        if bool((shifted.detach() <= 0).any()):
            raise InvalidParameterError(
                f"famo: a loss fell below its lower bound (losses {losses.detach().tolist()}, min_losses "
                f"{self.min_losses.tolist()}); set --hp min_losses=[...] below the attainable losses")
        return shifted

    def task_weights(self) -> Tensor:
        """z = softmax(ξ)."""
        return torch.softmax(self.logits.detach(), dim=-1)

    def weights(self, losses: Tensor) -> Tensor:
        z = self.task_weights().to(losses)
        inv = z / self._shifted(losses)
        return inv / inv.sum()

    def objective(self, losses: Tensor) -> Tensor:
        z = self.task_weights().to(losses)
        shifted = self._shifted(losses)
        c = (z / shifted.detach()).sum()
        self.last_weights = self.weights(losses.detach())
        return (z * shifted.log()).sum() / c

    def before_backward(self, ctx: StepContext) -> None:
        self._losses_before = ctx.losses.detach().clone()

    def after_optimizer_step(self, ctx: StepContext) -> None:
        if self._losses_before is None:
            return
        new_losses = ctx.recompute_losses().detach().to(self.logits.device)
        before = self._losses_before.to(self.logits.device)
        delta = self._shifted(before).log() - self._shifted(new_losses).log()
        self.update_logits(delta)
        self._losses_before = None

    def update_logits(self, delta: Tensor) -> None:
        """One Adam step on ξ with gradient J_softmax(ξ)ᵀ δ."""
        self._optimizer.zero_grad(set_to_none=True)
        z = torch.softmax(self.logits, dim=-1)
        torch.autograd.backward(z, grad_tensors=delta.to(z))
        self._optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"logits": self.logits.detach().clone(), "min_losses": self.min_losses.clone(),
                "optimizer": self._optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.min_losses = state["min_losses"].clone()
        self._optimizer.load_state_dict(state["optimizer"])
