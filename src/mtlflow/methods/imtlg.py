"""IMTL-G: impartial multi-task learning, gradient part.

Liu, Li, Kuang, Xue, Chen, Yang, Liao & Zhang, "Towards Impartial Multi-task Learning", ICLR 2021
(IMTL-G). The update d = Σ_i α_i g_i with Σ_i α_i = 1 has equal projections onto every unit task
gradient u_i = g_i / ||g_i||: d·u_1 = d·u_i for all i. Its closed form, with
D = [g_1 - g_2, ..., g_1 - g_K]ᵀ and U = [u_1 - u_2, ..., u_1 - u_K]ᵀ, is

    α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹,      α_1 = 1 - Σ_{i≥2} α_i.

Equivalently (d·u_i = (Gα)_i / √G_ii equal for all i), α ∝ G⁻¹ √diag(G) with G = J Jᵀ the
Gramian, normalised to Σ α_i = 1; this form is what is computed, in float64 on the Gramian's
eigendecomposition (eigenvalues at or below K·ε₆₄·λmax dropped: the pseudo-inverse, TorchJD's
generalisation to linearly dependent gradients). The difference form above cancels catastrophically
when tasks nearly agree: with near-duplicate fp32 gradients it returned α ≈ ±2.5e7 and a wrong
direction. When Σ (G⁺ √diag G)_i = 0 (e.g. two exactly opposite gradients of equal norm) the only
solutions with Σα = 1 are null vectors of G, which give d = 0 (projections all 0); that α is
returned. Every full-rank solve is checked: an equal-projection residual above
:data:`PROJECTION_TOL`·‖d‖ raises :class:`~mtlflow.core.errors.SolverError` -- nothing is silently
replaced. Tasks with a zero gradient get α = 0 (u is undefined for them).
Σ α_i = 1 puts d on the scale of the mean gradient, so the trainer rescales it by K
(``natural_scale = "mean"``; LibMTL and the Nash-MTL/FAMO code use Σ α_i L_i, i.e. no ×K:
``--hp scale_convention=reference``).
Gradients are w.r.t. the shared parameters (the paper also allows the shared representation).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting

#: largest max_i |d·u_i − mean| / ‖d‖ accepted from a solve on linearly independent gradients
PROJECTION_TOL = 1e-6
#: |Σ (G⁺√diag G)_i| below this fraction of Σ |·| counts as 0: Σα = 1 then needs d = 0
SUM_TOL = 1e-12


def imtlg_weights(gramian: np.ndarray) -> np.ndarray:
    """α of IMTL-G from a symmetric PSD float64 Gramian (sums to 1 unless every gradient is zero)."""
    k = gramian.shape[0]
    norms = np.sqrt(np.clip(np.diag(gramian), 0.0, None))
    active = np.flatnonzero(norms > 0)
    alpha = np.zeros(k)
    if active.size == 0:
        return alpha
    g, n = gramian[np.ix_(active, active)], norms[active]
    eigenvalues, vectors = np.linalg.eigh(g)
    keep = eigenvalues > active.size * np.finfo(np.float64).eps * eigenvalues[-1]
    v = vectors[:, keep] @ ((vectors[:, keep].T @ n) / eigenvalues[keep])      # G⁺ √diag(G)
    total = float(v.sum())
    if abs(total) > SUM_TOL * float(np.abs(v).sum()):
        alpha[active] = v / total
    else:
        # Gα = c·√diag(G) has no solution with Σα = 1 and c ≠ 0; with c = 0 the solutions are the
        # null vectors of G with Σα = 1, all of which give d = Jᵀα = 0 (equal projections 0)
        null = vectors[:, ~keep] @ vectors[:, ~keep].sum(axis=0)
        if not abs(float(null.sum())) > SUM_TOL:
            raise SolverError("imtlg: no combination of the task gradients with Σα = 1 has equal projections "
                              "on the unit gradients; the Gramian is degenerate")
        alpha[active] = null / float(null.sum())
        return alpha
    if keep.all():
        a = alpha[active]
        projections = (g @ a) / n       # d·u_i, equal for every task by construction
        spread = float(np.max(np.abs(projections - projections.mean())))
        if not spread <= PROJECTION_TOL * np.sqrt(max(float(a @ g @ a), 0.0)):
            raise SolverError(f"imtlg: the projections d·u_i of the solve differ by {spread:.3g} (‖d‖ = "
                              f"{np.sqrt(max(float(a @ g @ a), 0.0)):.3g}); the Gramian is too ill-conditioned")
    return alpha


class IMTLG(GramianWeighting):
    name = "imtlg"
    paper = "Liu et al., Towards Impartial Multi-task Learning, ICLR 2021 (IMTL-G)"
    equations = "α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 - Σ α; equal projections d·u_i"
    natural_scale = "mean"
    reference_scale = "sum"

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        return torch.from_numpy(imtlg_weights(gramian_numpy(gramian, self.name))).to(gramian.device)
