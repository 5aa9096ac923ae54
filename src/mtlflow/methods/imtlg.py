"""IMTL-G: impartial multi-task learning, gradient part.

Liu, Li, Kuang, Xue, Chen, Yang, Liao & Zhang, "Towards Impartial Multi-task Learning", ICLR 2021
(IMTL-G). The update d = Σ_i α_i g_i with Σ_i α_i = 1 has equal projections onto every unit task
gradient u_i = g_i / ||g_i||: d·u_1 = d·u_i for all i. Its closed form, with
D = [g_1 - g_2, ..., g_1 - g_K]ᵀ and U = [u_1 - u_2, ..., u_1 - u_K]ᵀ, is

    α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹,      α_1 = 1 - Σ_{i≥2} α_i.

Equivalently (d·u_i = (Gα)_i / √G_ii equal for all i), the defining equations are the linear system

    G α = c √diag(G),      Σ_i α_i = 1       (unknowns α and the common projection c),

with G = J Jᵀ the Gramian. While √diag(G) lies in the range of G, α ∝ G⁺ √diag(G) normalised to
Σ α_i = 1 solves it; this is what is computed first, in float64 on the Gramian's eigendecomposition
(eigenvalues at or below K·ε₆₄·λmax dropped: the pseudo-inverse, TorchJD's generalisation to linearly
dependent gradients). The difference form above cancels catastrophically when tasks nearly agree: with
near-duplicate fp32 gradients it returned α ≈ ±2.5e7 and a wrong direction. The pseudo-inverse only
gives the least-squares α, which is a solution only if √diag(G) has no component in the dropped
directions, so every α it gives is checked against the equations: the equal-projection residual
max_i |d·u_i − mean| must be at most :data:`PROJECTION_TOL`·‖d‖. When it is not (g₂ = −2·g₁: the
pseudo-inverse gives α = (−1, 2), d = −5·g₁, projections ∓5‖g₁‖; K > P with generic gradients), or
when Σ G⁺√diag(G) = 0 (two exactly opposite gradients of equal norm), √diag(G) is outside the range
of G, so c = 0 and the solutions are the null vectors of G with Σα = 1, all of which give d = Jᵀα = 0
(projections all 0); the least-norm one, α ∝ P_null 1 (P_null the projector on the dropped
eigenvectors), is returned. With no such null vector, or on a full-rank Gramian whose solve fails the
check (too ill-conditioned), :class:`~mtlflow.core.errors.SolverError` is raised -- nothing is
silently replaced by a non-solution. Tasks with a zero gradient get α = 0 (u is undefined for them).
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
from mtlflow.core.numerics import one_blas_thread
from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting

#: largest max_i |d·u_i − mean| / ‖d‖ accepted from the pseudo-inverse solve (above it: the least-norm
#: null-space solution on a rank-deficient Gramian, a SolverError on a full-rank one)
PROJECTION_TOL = 1e-6
#: |Σ (G⁺√diag G)_i| below this fraction of Σ |·| counts as 0: Σα = 1 then needs d = 0
SUM_TOL = 1e-12


@one_blas_thread
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
        a = v / total
        spread, norm_d = projection_spread(g, n, a)
        if spread <= PROJECTION_TOL * norm_d:
            alpha[active] = a
            return alpha
        if keep.all():
            raise SolverError(f"imtlg: the projections d·u_i of the solve differ by {spread:.3g} (‖d‖ = "
                              f"{norm_d:.3g}); the Gramian is too ill-conditioned")
    # Gα = c·√diag(G) has no solution with c ≠ 0 (√diag(G) is outside the range of G); with c = 0 the
    # solutions are the null vectors of G with Σα = 1, all giving d = Jᵀα = 0; the least-norm one is P_null 1
    null = vectors[:, ~keep] @ vectors[:, ~keep].sum(axis=0)
    if not abs(float(null.sum())) > SUM_TOL:
        raise SolverError("imtlg: no combination of the task gradients with Σα = 1 has equal projections "
                          "on the unit gradients; the Gramian is degenerate")
    alpha[active] = null / float(null.sum())
    return alpha


def projection_spread(gramian: np.ndarray, norms: np.ndarray, alpha: np.ndarray) -> tuple[float, float]:
    """(max_i |d·u_i − mean_j d·u_j|, ‖d‖) for d = Jᵀα, from the Gramian: d·u_i = (Gα)_i / ‖g_i‖."""
    projections = (gramian @ alpha) / norms
    spread = float(np.max(np.abs(projections - projections.mean())))
    return spread, float(np.sqrt(max(float(alpha @ gramian @ alpha), 0.0)))


class IMTLG(GramianWeighting):
    name = "imtlg"
    paper = "Liu et al., Towards Impartial Multi-task Learning, ICLR 2021 (IMTL-G)"
    equations = "α_{2..K} = g_1 Uᵀ (D Uᵀ)⁻¹, α_1 = 1 - Σ α; equal projections d·u_i"
    natural_scale = "mean"
    reference_scale = "sum"

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        return torch.from_numpy(imtlg_weights(gramian_numpy(gramian, self.name))).to(gramian.device)
