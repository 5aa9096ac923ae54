"""IMTL-G: impartial multi-task learning, gradient part.

Liu, Li, Kuang, Xue, Chen, Yang, Liao & Zhang, "Towards Impartial Multi-task Learning", ICLR 2021
(IMTL-G). The update d = Σ_i α_i g_i with Σ_i α_i = 1 has equal projections onto every unit task
gradient u_i = g_i / ||g_i||: d·u_1 = d·u_i for all i. Its closed form, with
D = [g_1 - g_2, ..., g_1 - g_K]ᵀ and U = [u_1 - u_2, ..., u_1 - u_K]ᵀ, is

    α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹,      α_1 = 1 - Σ_{i≥2} α_i.

Every entry of g_1 Uᵀ and D Uᵀ is an inner product, so the weights are computed from the Gramian
(g_a·u_b = G_ab / √G_bb). When D Uᵀ is singular (linearly dependent gradients, K > rank) the
least-squares solution is used (LibMTL inverts D Uᵀ directly; the Nash-MTL/FAMO code adds 1e-8·I
when it is singular); tasks with a zero gradient get α = 0 (u is undefined for them). Equivalent form used by
TorchJD's IMTLG: α ∝ G⁻¹ √diag(G), checked in the tests on full-rank Jacobians.
Σ α_i = 1 puts d on the scale of the mean gradient, so the trainer rescales it by K
(``natural_scale = "mean"``; LibMTL and the Nash-MTL/FAMO code use Σ α_i L_i, i.e. no ×K).
Gradients are w.r.t. the shared parameters (the paper also allows the shared representation).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting


def imtlg_weights(gramian: np.ndarray) -> np.ndarray:
    """α of IMTL-G from the Gramian (float64, sums to 1 unless every gradient is zero)."""
    k = gramian.shape[0]
    norms = np.sqrt(np.clip(np.diag(gramian), 0.0, None))
    active = np.flatnonzero(norms > 0)
    alpha = np.zeros(k)
    if active.size == 0:
        return alpha
    if active.size == 1:
        alpha[active] = 1.0
        return alpha
    g = gramian[np.ix_(active, active)]
    n = norms[active]
    dot_unit = g / n[None, :]                  # dot_unit[a, b] = g_a · u_b
    first, rest = 0, np.arange(1, active.size)
    # (g_1 Uᵀ)_b = g_1·u_1 - g_1·u_b ;  (D Uᵀ)_ab = (g_1 - g_a)·(u_1 - u_b)
    rhs = dot_unit[first, first] - dot_unit[first, rest]
    system = (dot_unit[first, first] - dot_unit[first, rest][None, :]
              - dot_unit[rest, first][:, None] + dot_unit[np.ix_(rest, rest)])
    # α_rest (D Uᵀ) = g_1 Uᵀ  <=>  (D Uᵀ)ᵀ α_restᵀ = (g_1 Uᵀ)ᵀ
    try:
        alpha_rest = np.linalg.solve(system.T, rhs)
        if not np.all(np.isfinite(alpha_rest)):
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        alpha_rest = np.linalg.lstsq(system.T, rhs, rcond=None)[0]
    alpha[active[rest]] = alpha_rest
    alpha[active[first]] = 1.0 - alpha_rest.sum()
    return alpha


class IMTLG(GramianWeighting):
    name = "imtlg"
    paper = "Liu et al., Towards Impartial Multi-task Learning, ICLR 2021 (IMTL-G)"
    equations = "α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 - Σ α; equal projections d·u_i"
    natural_scale = "mean"

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        return torch.from_numpy(imtlg_weights(gramian_numpy(gramian))).to(gramian.device)
