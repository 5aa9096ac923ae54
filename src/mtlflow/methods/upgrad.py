"""UPGrad: unconflicting projection of gradients (Jacobian descent).

Quinton & Rey, "Jacobian Descent for Multi-Objective Optimization", 2024 (arXiv:2406.16232; the
UPGrad aggregator, implemented by its authors in TorchJD). Each task gradient is projected onto the
dual cone of the rows of the Jacobian J = [g_1; …; g_K], C = {x : Jx ≥ 0} (the directions that
conflict with no task), and the projections are averaged:

    d = (1/K) Σ_i π_C(g_i).

With G = JJᵀ, the projection of Jᵀu onto C is Jᵀv with v the solution of the K-dimensional QP
(Proposition 1 of the paper, as cited by TorchJD)

    v = argmin_{v ≥ u}  vᵀ G v,

so the task weights of d are Σ_i v_i with v_i the solution for u = e_i / K. Properties: Jd ≥ 0 (no
task is hurt), and d is linear under positive rescaling of the tasks (A(diag(c) J) is linear in c).

Solver: ``quadprog`` (Goldfarb–Idnani, exact active set) on the Gramian divided by its trace, plus
``reg_eps`` · I so that the matrix is positive definite even when the gradients are linearly
dependent -- the normalisation and ``reg_eps`` = 1e-4 are TorchJD's defaults, so the weights match
TorchJD's UPGrad. (TorchJD also replaces Gramians with trace below ``norm_eps`` = 1e-4 by 0, which
turns UPGrad into the mean gradient for small gradients; this implementation does not.) The ridge
perturbs the non-conflict property by at most ``reg_eps`` · w_i · trace(G) per task.

Scale: d is on the scale of the mean gradient; the trainer multiplies it by K.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.errors import SolverError
from mtlflow.methods.base import GramianWeighting, HParam, non_negative


def dual_cone_weights(gramian: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """argmin_{v ≥ lower} vᵀ G v for a positive-definite G with ``quadprog``."""
    try:
        import quadprog
    except ImportError:
        raise SolverError("upgrad needs quadprog: pip install 'torchjd[quadprog-projector]' (or quadprog)") from None
    k = gramian.shape[0]
    try:
        # quadprog: min ½ xᵀGx − aᵀx  s.t.  Cᵀx ≥ b
        return quadprog.solve_qp(gramian, np.zeros(k), np.eye(k), lower)[0]
    except ValueError as exc:
        raise SolverError(f"upgrad: the dual-cone QP failed ({exc}); increase --hp reg_eps") from None


def upgrad_weights(gramian: np.ndarray, reg_eps: float) -> np.ndarray:
    """Task weights of UPGrad with the mean preference: Σ_i argmin_{v ≥ e_i/K} vᵀ G̃ v."""
    k = gramian.shape[0]
    trace = float(np.trace(gramian))
    if not trace > 0:  # every gradient is zero: any weights give d = 0
        return np.full(k, 1.0 / k)
    g = gramian / trace + reg_eps * np.eye(k)
    return sum(dual_cone_weights(g, np.eye(k)[i] / k) for i in range(k))


class UPGrad(GramianWeighting):
    name = "upgrad"
    paper = "Quinton & Rey, Jacobian Descent for Multi-Objective Optimization, arXiv 2024"
    equations = "UPGrad: d = (1/K) Σ_i π_C(g_i), π via the dual QP min_{v ≥ u} vᵀGv (Prop. 1)"
    natural_scale = "mean"
    hparams = {
        "reg_eps": HParam(1e-4, "ridge added to the trace-normalised Gramian (TorchJD's default)",
                          non_negative, ">= 0"),
    }

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        m = gramian.detach().to("cpu", torch.float64).numpy()
        if not np.all(np.isfinite(m)):
            raise SolverError("upgrad: the task-gradient Gramian contains NaN or Inf; check the losses and --lr")
        return torch.from_numpy(upgrad_weights(0.5 * (m + m.T), self.hp["reg_eps"]))
