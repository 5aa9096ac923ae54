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

Solvers (``solver``):

* ``nnls`` (default): the dual cone is the same for positively rescaled rows, so each QP is solved
  for the rows normalised to unit length (the correlation matrix C = D G D, D = diag(1/‖g_i‖)) and
  mapped back; with C = R Rᵀ (R from the eigendecomposition) and v = l + z, the QP is the
  non-negative least-squares problem min_{z ≥ 0} ‖Rᵀ z + Rᵀ l‖, solved exactly (Lawson–Hanson,
  ``scipy.optimize.nnls``) with no ridge. The KKT conditions of that problem are C v ≥ 0: the update
  conflicts with no task, however imbalanced the gradient norms, and singular Gramians (duplicate or
  linearly dependent tasks) need nothing special. Tasks with a zero gradient constrain nothing and
  get weight 0.
* ``quadprog``: TorchJD's projector -- ``quadprog`` (Goldfarb–Idnani) on the Gramian divided by its
  trace plus ``reg_eps`` · I (default 1e-4, TorchJD's), so the weights match TorchJD's UPGrad. (TorchJD
  also replaces Gramians with trace below ``norm_eps`` = 1e-4 by 0; this implementation does not.)
  The ridge perturbs the non-conflict property by up to ``reg_eps`` · w_i · trace(G) per task, which
  is large next to a task with a small gradient: over 3,000 random three-task Jacobians with the third
  norm scaled by 10^U(-4, 0), min_i cos(g_i, d) reaches -0.96 (norms 0.71, 2.2, 3e-4; the case is in
  tests/unit/methods/test_zoo_numerics.py), against ≥ +5e-7 for ``nnls`` and for ``reg_eps = 0``, which restores
  the property on full-rank Gramians but makes quadprog fail on singular ones (a duplicate task).
  Both solvers take ~0.9 ms for K = 10.

Float64 throughout (:mod:`mtlflow.core.numerics`).

Scale: d is on the scale of the mean gradient; the trainer multiplies it by K (TorchJD does not:
``--hp scale_convention=reference``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.core.hparams import HParam, non_negative, one_of
from mtlflow.core.numerics import gramian_array, one_blas_thread, psd_factor
from mtlflow.methods.base import GramianWeighting


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
        raise SolverError(f"upgrad: the dual-cone QP failed ({exc}); increase --hp reg_eps or use "
                          "--hp solver=nnls") from None


def upgrad_weights(gramian: np.ndarray, reg_eps: float) -> np.ndarray:
    """TorchJD's formulation: Σ_i argmin_{v ≥ e_i/K} vᵀ (G/tr G + reg_eps I) v with quadprog."""
    k = gramian.shape[0]
    trace = float(np.trace(gramian))
    if not trace > 0:  # every gradient is zero: any weights give d = 0
        return np.full(k, 1.0 / k)
    g = gramian / trace + reg_eps * np.eye(k)
    return sum(dual_cone_weights(g, np.eye(k)[i] / k) for i in range(k))


def upgrad_weights_exact(gramian: np.ndarray) -> np.ndarray:
    """Σ_i argmin_{v ≥ e_i/K} vᵀ G v without a ridge: NNLS on the row-normalised problem (module doc)."""
    from scipy.optimize import nnls

    k = gramian.shape[0]
    norms = np.sqrt(np.clip(np.diag(gramian), 0.0, None))
    active = np.flatnonzero(norms > 0)
    weights = np.zeros(k)
    if active.size == 0:   # every gradient is zero: d = 0
        return weights
    n = norms[active]
    r_t = psd_factor(gramian[np.ix_(active, active)] / np.outer(n, n)).T     # C = R Rᵀ
    for position in range(len(active)):
        # lower bound e_i in unit-row variables; the QP is homogeneous, so the bound ‖g_i‖/K scales v
        v, _ = nnls(r_t, -r_t[:, position])     # z, then v = e_i + z
        v[position] += 1.0
        weights[active] += (n[position] / k) * v / n
    if not np.all(np.isfinite(weights)):
        raise SolverError("upgrad: the dual-cone solve returned non-finite weights")
    return weights


class UPGrad(GramianWeighting):
    name = "upgrad"
    paper = "Quinton & Rey, Jacobian Descent for Multi-Objective Optimization, arXiv 2024"
    equations = "UPGrad: d = (1/K) Σ_i π_C(g_i), π via the dual QP min_{v ≥ u} vᵀGv (Prop. 1)"
    natural_scale = "mean"
    reference_scale = "sum"
    hparams = {
        "solver": HParam("nnls", "dual-cone projection: 'nnls' (exact, no ridge: never conflicts with a task, "
                         "survives singular Gramians) or 'quadprog' (TorchJD's ridge-regularised QP)",
                         one_of("nnls", "quadprog")),
        "reg_eps": HParam(1e-4, "solver=quadprog only: ridge added to the trace-normalised Gramian (TorchJD's "
                          "default)", non_negative),
    }

    @one_blas_thread
    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        m = gramian_array(gramian, self.name)
        if self.hp["solver"] == "nnls":
            return torch.from_numpy(upgrad_weights_exact(m))
        return torch.from_numpy(upgrad_weights(m, self.hp["reg_eps"]))
