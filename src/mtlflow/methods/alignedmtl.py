"""Aligned-MTL: independent component alignment of the task gradients.

Senushkin, Patakin, Kuznetsov & Konushin, "Independent Component Alignment for Multi-Task Learning",
CVPR 2023 (Algorithm 1). Instability of the update is measured by the condition number of
the Jacobian J = [g_1; …; g_K]. Aligned-MTL replaces J by the closest matrix whose non-zero singular
values are all equal to σ: with the eigendecomposition of the Gramian JJᵀ = V Λ Vᵀ (rank r,
Λ = diag(λ_1 ≥ … ≥ λ_r > 0), V ∈ ℝ^{K×r}),

    B = σ V Λ^{-1/2} Vᵀ,     Ĵ = B J = σ V Uᵀ   (J = V Λ^{1/2} Uᵀ),

so Ĵ has condition number 1 on its row space, and the update is Ĵᵀ w with the preference weights
w = 1/K, i.e. d = Jᵀ (B w): a Gramian weighting with task weights B w.

σ² (``scale_mode``): ``min`` = λ_r, the smallest non-zero eigenvalue (σ = σ_min(J), the paper's
choice and LibMTL's); ``median`` = the median eigenvalue; ``rmse`` = the mean eigenvalue (as in the
SamsungLabs code, per TorchJD). Eigenvalues below λ_1 · K · ε(dtype) count as zero, as in the
official code.

Scale: d is on the scale of the mean gradient (w = 1/K); the trainer multiplies it by K, which
matches the official/LibMTL update Jᵀ(B 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, one_of
from mtlflow.core.numerics import gramian_array
from mtlflow.methods.base import GramianWeighting

SCALE_MODES = ("min", "median", "rmse")


def balance_transform(gramian: Tensor, scale_mode: str) -> Tensor:
    """B = σ V Λ^{-1/2} Vᵀ (K×K) such that B J has all non-zero singular values equal to σ."""
    # float64 (bf16 has no eigh), but the rank cut-off keeps the precision the Gramian was formed in
    g = torch.from_numpy(gramian_array(gramian, "alignedmtl")).to(gramian.device)
    eigenvalues, vectors = torch.linalg.eigh(g)
    k = g.shape[0]
    tol = eigenvalues.max() * k * torch.finfo(gramian.dtype).eps
    keep = eigenvalues > tol
    if not bool(keep.any()):
        return torch.eye(k, dtype=g.dtype, device=g.device)
    lam, v = eigenvalues[keep], vectors[:, keep]
    if scale_mode == "min":
        sigma_sq = lam.min()
    elif scale_mode == "median":
        sigma_sq = lam.median()
    else:
        sigma_sq = lam.mean()
    return sigma_sq.sqrt() * (v / lam.sqrt()) @ v.T


class AlignedMTL(GramianWeighting):
    name = "alignedmtl"
    paper = "Senushkin et al., Independent Component Alignment for Multi-Task Learning, CVPR 2023"
    equations = "Alg. 1: Ĵ = σ V Uᵀ (equal singular values), d = Ĵᵀ 1/K"
    natural_scale = "mean"
    hparams = {
        "scale_mode": HParam("min", "σ² of the aligned gradients: smallest ('min'), median or mean ('rmse') "
                             "non-zero eigenvalue of the Gramian", one_of(*SCALE_MODES)),
    }

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        b = balance_transform(gramian.detach(), self.hp["scale_mode"])
        preference = torch.full((self.n_tasks,), 1.0 / self.n_tasks, dtype=b.dtype, device=b.device)
        return b @ preference
