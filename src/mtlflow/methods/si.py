"""SI: scale-invariant loss, Σ_i log L_i.

The "scale-invariant" baseline of Navon et al., "Multi-Task Learning as a Bargaining Game", ICML 2022
(baselines of the experiments; ``scaleinvls`` in their code, also in FAMO's and FairGrad's): minimise

    L_SI = Σ_i log L_i,        ∇L_SI = Σ_i (1 / L_i) ∇L_i,

so the effective weight of task i is 1 / L_i and multiplying any L_i by a constant leaves the update
unchanged. ``min_losses`` (default 0) replaces L_i by L_i - L_i^min for losses that can be negative
(the toy problem); the shifted losses must stay positive.
"""

from __future__ import annotations

from torch import Tensor

from mtlflow.methods._support import min_losses_hparam, shifted_losses
from mtlflow.methods.base import LossWeighting


class ScaleInvariant(LossWeighting):
    name = "si"
    paper = "Scale-invariant baseline (Σ log L_i) as in Navon et al., Multi-Task Learning as a Bargaining Game, ICML 2022"
    equations = "L = Σ_i log L_i; effective weights 1 / L_i"
    hparams = {"min_losses": min_losses_hparam()}

    def weights(self, losses: Tensor) -> Tensor:
        return 1.0 / shifted_losses(self.name, losses.detach(), self.min_losses)

    def objective(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses, self.min_losses)
        self.last_weights = 1.0 / shifted.detach()
        return shifted.log().sum()
