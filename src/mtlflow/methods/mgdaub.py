"""MGDA-UB: the min-norm problem on the gradients w.r.t. the shared representation (an upper bound).

Sener & Koltun, "Multi-Task Learning as Multi-Objective Optimization", NeurIPS 2018, Sec. 3.3
("Efficient optimization for encoder-decoder architectures"). With shared features
Z = g(x; θ_sh) and task heads on Z, the chain rule gives ∇_θsh L_i = (∂Z/∂θ_sh)ᵀ ∇_Z L_i, hence

    || Σ_i α_i ∇_θsh L_i ||²  ≤  || ∂Z/∂θ_sh ||² · || Σ_i α_i ∇_Z L_i ||²,

and MGDA-UB minimises the upper bound: the min-norm point of the convex hull of the per-task
gradients w.r.t. Z (the whole batch's features, flattened),

    α* = argmin_{α ∈ Δ_K} || Σ_i α_i ∇_Z L_i ||²,

then back-propagates Σ_i α*_i L_i through the encoder once. By the paper's Theorem 1, if ∂Z/∂θ_sh has
full rank, α* either gives a direction that decreases every task or certifies Pareto stationarity.
The trainer computes ∇_Z L_i with K backward passes through the heads only (``requires =
REPRESENTATION``), so a step costs about one LS step plus K head passes instead of K encoder passes.

The solver is MGDA's (exact QP by default, the paper's Frank–Wolfe with ``solver=frank-wolfe``).
``normalization`` rescales each task's gradient before the solver only, as the authors' released
code can (``l2``: by ||∇_Z L_i||; ``loss``: by L_i; ``loss+``: by L_i·||∇_Z L_i||); the default
``none`` is the paper's problem. The weights apply to the raw losses, and the direction is a convex
combination, so the trainer's global rescaling multiplies it by K (as for MGDA).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.core.hparams import HParam, one_of, positive
from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GradInput, GramianWeighting
from mtlflow.methods.solvers import min_norm_weights_frank_wolfe, min_norm_weights_qp

NORMALIZATIONS = ("none", "l2", "loss", "loss+")


def gradient_normalizers(gramian: Tensor, losses: Tensor, kind: str) -> Tensor:
    """Per-task scalars n_i dividing the gradient g_i before the min-norm solver."""
    norms = gramian.diagonal().clamp_min(0).sqrt()
    if kind == "none":
        return torch.ones_like(norms)
    if kind == "l2":
        return norms
    if kind == "loss":
        return losses.to(norms)
    return losses.to(norms) * norms


class MGDAUB(GramianWeighting):
    name = "mgdaub"
    paper = "Sener & Koltun, Multi-Task Learning as Multi-Objective Optimization, NeurIPS 2018 (MGDA-UB)"
    equations = "Sec. 3.3: min_α ||Σ α_i ∇_Z L_i||² over the simplex (upper bound, Theorem 1)"
    requires = GradInput.REPRESENTATION
    natural_scale = "mean"
    hparams = {
        "solver": HParam("qp", "exact QP ('qp') or the paper's Frank-Wolfe ('frank-wolfe')",
                         one_of("qp", "frank-wolfe")),
        "normalization": HParam("none", "gradient normalisation before the solver: none (paper), l2, loss, loss+",
                                one_of(*NORMALIZATIONS)),
        "max_iter": HParam(250, "Frank-Wolfe iterations", positive),
        "tol": HParam(1e-5, "Frank-Wolfe stopping tolerance on the weight change", positive),
    }

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        gramian = torch.from_numpy(gramian_numpy(gramian, self.name))  # NaN/Inf refused naming the method
        scale = gradient_normalizers(gramian, losses.to(torch.float64), self.hp["normalization"])
        if not bool((scale > 0).all()):
            raise SolverError(f"mgdaub: normalization {self.hp['normalization']!r} needs positive losses and "
                              "non-zero gradients; use normalization=none")
        normalised = gramian / torch.outer(scale, scale)
        if self.hp["solver"] == "qp":
            alpha = min_norm_weights_qp(normalised)
        else:
            alpha = min_norm_weights_frank_wolfe(normalised, self.hp["max_iter"], self.hp["tol"])
        return alpha
