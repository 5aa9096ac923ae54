"""RLW: random loss weighting.

Lin, Ye, Zhang & Tsang, "Reasonable Effectiveness of Random Weighting: A Litmus Test for Multi-Task
Learning", TMLR 2022 (RLW with the standard normal as sampling distribution, as in LibMTL, whose
maintainer is the paper's first author). Each step draws fresh weights

    λ̃ ~ N(0, I_K),   λ = softmax(λ̃),   L = Σ_i λ_i L_i,

so λ lies on the simplex (as in LibMTL and the Nash-MTL/FAMO code, all a plain softmax). The weights
sum to 1, so by the scale convention (:attr:`~mtlflow.methods.base.Method.natural_scale`) the trainer
multiplies the objective by K; ``--hp scale_convention=reference`` trains on Σ λ_i L_i as those codes
do (``reference_scale = "sum"``). The
weights come from a generator owned by the method, seeded from the run seed in ``setup`` and saved in
the checkpoint: a resumed run draws the same weights as an uninterrupted one and the global RNG
streams (data order) do not depend on the method.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.methods.base import LossWeighting


class RandomLossWeighting(LossWeighting):
    name = "rlw"
    paper = "Lin et al., Reasonable Effectiveness of Random Weighting: A Litmus Test for Multi-Task Learning, TMLR 2022"
    stochastic = True
    equations = "λ = softmax(λ̃), λ̃ ~ N(0, I) each step; L = Σ_i λ_i L_i"
    natural_scale = "mean"
    reference_scale = "sum"

    def weights(self, losses: Tensor) -> Tensor:
        """Draws the weights of one step (each call draws anew)."""
        logits = torch.randn(self.n_tasks, generator=self.rng.generator, dtype=torch.float64)
        return torch.softmax(logits, dim=0).to(losses)
