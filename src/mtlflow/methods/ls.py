"""Linear scalarisation (LS / equal weighting): minimise Σ_i L_i.

The baseline of every MTL paper (e.g. COST, Zhou et al. NeurIPS 2025, Table 1 row "LS").
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.methods.base import LossWeighting


class LinearScalarization(LossWeighting):
    name = "ls"
    paper = "Linear scalarisation (equal weights), the standard MTL baseline"
    equations = "L = Σ_i L_i"

    def weights(self, losses: Tensor) -> Tensor:
        return torch.ones_like(losses)

    def objective(self, losses: Tensor) -> Tensor:
        # Σ_i L_i itself: the same value and gradient as Σ_i 1·L_i, bit for bit, without the product and its
        # backward (two kernels per step, ~1 % of a small tabular model's step)
        self.last_weights = torch.ones_like(losses)
        return losses.sum()
