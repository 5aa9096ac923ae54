"""GradNorm: gradient normalisation for adaptive loss balancing.

Chen, Badrinarayanan, Lee & Rabinovich, "GradNorm: Gradient Normalization for Adaptive Loss Balancing
in Deep Multitask Networks", ICML 2018 (the GradNorm algorithm). The model minimises Σ_i w_i L_i with
learnable weights w (initialised to 1). With W the last shared layer,

    G_i = ||∇_W w_i L_i||,   Ḡ = mean_i G_i,   L̃_i = L_i(t) / L_i(0),   r_i = L̃_i / mean_j L̃_j,

the weights follow the gradient of L_grad = Σ_i |G_i - Ḡ r_i^α| with the target Ḡ r_i^α held
constant, i.e. ∂L_grad/∂w_i = sign(G_i - Ḡ r_i^α) ||∇_W L_i||, and are renormalised to Σ_i w_i = K
after every step. α = 1.5 (the strength of the restoring force towards a common training rate).

Implementation: W is the parameter set of the trunk's last parametrised module (``setup``); the K
gradient norms come from K ``autograd.grad`` calls on that layer only (cost O(K) on one layer, not
on the whole trunk), made inside ``objective`` before the trainer's backward of Σ w_i L_i. w is a
method parameter: the trainer's optimizer updates it with ``method_lr``; ``after_optimizer_step``
floors it at 1e-6 (the paper does not say how to keep w positive) and renormalises. L_i(0) is the
loss of the first training step, kept in the checkpoint with w.
Differences to LibMTL: it parametrises w = K·softmax(ξ), uses all shared parameters for G_i and
starts after one epoch of equal weights; the paper uses the last shared layer from the first step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.hparams import HParam, SearchRange, non_negative
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods._support import last_shared_layer, min_losses_hparam, shifted_losses
from mtlflow.methods.base import LossWeighting, StepContext

WEIGHT_FLOOR = 1e-6


def gradnorm_weight_gradient(weights: Tensor, grad_norms: Tensor, losses: Tensor, initial_losses: Tensor,
                             alpha: float) -> Tensor:
    """∂L_grad/∂w with the target held constant: sign(w_i n_i - Ḡ r_i^α) n_i, n_i = ||∇_W L_i||."""
    weighted = weights * grad_norms
    relative = losses / initial_losses
    rates = relative / relative.mean()
    target = weighted.mean() * rates.pow(alpha)
    return torch.sign(weighted - target) * grad_norms


class GradNorm(LossWeighting):
    name = "gradnorm"
    cost = "O(K) (last shared layer)"
    paper = ("Chen et al., GradNorm: Gradient Normalization for Adaptive Loss Balancing in Deep Multitask "
             "Networks, ICML 2018")
    equations = "L_grad = Σ_i |G_i - Ḡ r_i^α|, w renormalised to Σ w = K"
    learned = {"task_weights": 1.0}
    task_weights: Tensor
    hparams = {
        "alpha": HParam(1.5, "asymmetry α: strength of the pull towards a common training rate", non_negative,
                        search=SearchRange("linear", 0.0, 3.0, source="Chen et al. 2018 §5: α in [0, 3] (1.5 on NYUv2)")),
        "min_losses": min_losses_hparam(),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.initial_losses: Tensor | None = None
        self.shared_layer: list[Tensor] | None = None
        #: ||∇_W L_i|| of the last step (float64), for logging and tests
        self.last_grad_norms: Tensor | None = None

    def setup(self, trainer: TrainerView) -> None:
        self.shared_layer = last_shared_layer(trainer.model)

    def weights(self, losses: Tensor) -> Tensor:
        return self.task_weights.detach().to(losses)

    def objective(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses, self.min_losses)
        if self.shared_layer is not None and shifted.requires_grad:
            self._set_weight_gradient(shifted)
        w = self.weights(shifted.detach())
        self.last_weights = w
        return (w * shifted).sum()

    def _set_weight_gradient(self, shifted: Tensor) -> None:
        norms = []
        for i in range(self.n_tasks):
            grads = torch.autograd.grad(shifted[i], self.shared_layer, retain_graph=True, allow_unused=True)
            norms.append(torch.sqrt(sum(g.double().pow(2).sum() for g in grads if g is not None)))
        grad_norms = torch.stack([n.to("cpu") for n in norms])
        current = cpu_float64(shifted)
        if self.initial_losses is None:
            self.initial_losses = current.clone()
        self.last_grad_norms = grad_norms
        weights = cpu_float64(self.task_weights)
        grad = gradnorm_weight_gradient(weights, grad_norms, current, self.initial_losses, self.hp["alpha"])
        self.task_weights.grad = grad.to(self.task_weights)

    def after_optimizer_step(self, ctx: StepContext) -> None:
        self.renormalise()

    def renormalise(self) -> None:
        """Σ_i w_i = K with every w_i ≥ 1e-6."""
        with torch.no_grad():
            self.task_weights.clamp_(min=WEIGHT_FLOOR)
            self.task_weights.mul_(self.n_tasks / self.task_weights.sum())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(),
                "initial_losses": None if self.initial_losses is None else self.initial_losses.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        initial = state["initial_losses"]
        self.initial_losses = None if initial is None else cpu_float64(initial)
