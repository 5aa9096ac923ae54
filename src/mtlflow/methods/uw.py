"""UW: uncertainty weighting with learned homoscedastic task uncertainty.

Kendall, Gal & Cipolla, "Multi-Task Learning Using Uncertainty to Weigh Losses for Scene Geometry and
Semantics", CVPR 2018. With the paper's regression form 1/(2σ_i²) L_i + log σ_i and its
parametrisation s_i = log σ_i² (learned for numerical stability), the objective is

    L = Σ_i ½ (e^{-s_i} L_i + s_i),      ∂L/∂s_i = ½ (1 - e^{-s_i} L_i),

so each s_i tracks log L_i and the effective weight ½ e^{-s_i} ≈ 1/(2 L_i). s starts at 0 (σ = 1) and
is a learnable parameter: the trainer puts it into its optimizer with ``method_lr`` (0.025, as the
Nash-MTL/FAMO code); ``state_dict`` keeps its value. All tasks use the regression form, as the
public implementations do (the paper's classification form drops the ½ on the loss term).
``min_losses`` shifts losses that can be negative (for L_i < 0 the objective has no minimum in s).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.methods._support import min_losses_hparam, shifted_losses
from mtlflow.methods.base import LossWeighting


class UncertaintyWeighting(LossWeighting):
    name = "uw"
    paper = ("Kendall, Gal & Cipolla, Multi-Task Learning Using Uncertainty to Weigh Losses for Scene "
             "Geometry and Semantics, CVPR 2018")
    equations = "L = Σ_i ½(e^{-s_i} L_i + s_i), s_i = log σ_i² learned"
    hparams = {"min_losses": min_losses_hparam()}
    learned = {"log_variances": 0.0}
    log_variances: Tensor

    def weights(self, losses: Tensor) -> Tensor:
        return 0.5 * torch.exp(-self.log_variances.detach()).to(losses)

    def objective(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses, self.min_losses)
        s = self.log_variances.to(shifted.dtype)
        self.last_weights = self.weights(shifted.detach())
        return 0.5 * (torch.exp(-s) * shifted + s).sum()
