"""MGDA: the multiple-gradient descent algorithm for MTL.

Sener & Koltun, "Multi-Task Learning as Multi-Objective Optimization", NeurIPS 2018.
The direction is the min-norm point of the convex hull of the task gradients (Eq. 3):

    w* = argmin_{w ∈ Δ_K} || Σ_i w_i g_i ||²,   d = Σ_i w*_i g_i,

which is zero exactly at Pareto-stationary points and otherwise decreases every task.
``solver="qp"`` (default) solves Eq. 3 exactly; ``solver="frank-wolfe"`` is the paper's Alg. 2
(closed-form pair of Alg. 1, then Frank–Wolfe with exact line search). The direction is a convex
combination, so the trainer's global rescaling multiplies it by K, matching the official loss
Σ_i K w_i L_i.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, one_of, positive
from mtlflow.core.numerics import one_blas_thread
from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting
from mtlflow.methods.solvers import min_norm_weights_frank_wolfe, min_norm_weights_qp


class MGDA(GramianWeighting):
    name = "mgda"
    paper = "Sener & Koltun, Multi-Task Learning as Multi-Objective Optimization, NeurIPS 2018"
    equations = "Eq. 3 (min-norm problem); Alg. 1-2 (Frank-Wolfe solver)"
    natural_scale = "mean"
    hparams = {
        "solver": HParam("qp", "exact QP ('qp') or the paper's Frank-Wolfe ('frank-wolfe')",
                         one_of("qp", "frank-wolfe")),
        "max_iter": HParam(250, "Frank-Wolfe iterations", positive),
        "tol": HParam(1e-5, "Frank-Wolfe stopping tolerance on the weight change", positive),
    }

    @one_blas_thread
    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        checked = torch.from_numpy(gramian_numpy(gramian, self.name))  # NaN/Inf refused naming the method
        if self.hp["solver"] == "qp":
            return min_norm_weights_qp(checked)
        return min_norm_weights_frank_wolfe(checked, self.hp["max_iter"], self.hp["tol"])
