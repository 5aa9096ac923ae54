"""Numerics of the small K x K problems that Gramian-based methods solve (not a method module).

One rule for every solver method: the K x K problem is formed and solved in float64, whatever the
training dtype.

* :func:`gramian_float64` -- G = J Jᵀ of a Jacobian in any floating dtype, accumulated in float64.
  The Gramian of fp32 (or bf16) gradients formed in fp32 is not positive semi-definite to working
  precision: when task gradients agree to 4-5 digits its eigenvalues reach -6e-8·λmax, which no
  ridge far below the solvers' tolerance absorbs (MGDA's QP then fails). The float64 Gramian of the
  same rounded gradients is PSD to ~1e-16·λmax. J is converted column block by column block, so the
  float64 copy never exceeds :data:`FLOAT64_BLOCK` entries.
* :func:`gramian_array` -- a Gramian handed over as a tensor (e.g. by TorchJD's autogram engine,
  which accumulates it in the model's dtype) as a symmetric float64 numpy array; NaN/Inf raise
  :class:`~mtlflow.core.errors.NonFiniteValueError`, and a Gramian with eigenvalues below
  -:data:`PSD_TOLERANCE`·λmax (one formed in low precision) is replaced by its nearest PSD matrix
  (negative eigenvalues set to 0; the Frobenius-nearest PSD matrix), which changes it by no more than
  its own rounding error.
* :func:`psd_factor` -- R with R Rᵀ = G (K x K), for least-squares forms of the Gramian problems.
* :func:`cpu_float64` -- where methods keep their per-task state and hand K x K problems to numpy: a
  detached float64 copy on the CPU, whatever the training dtype and device (a checkpoint that the
  trainer loads onto the GPU included).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import NonFiniteValueError

#: largest number of float64 entries of J converted at once by :func:`gramian_float64`
FLOAT64_BLOCK = 1 << 22
#: eigenvalues of a Gramian below -PSD_TOLERANCE·λmax are rounding error of a low-precision Gramian
PSD_TOLERANCE = 1e-13


def cpu_float64(tensor: Tensor) -> Tensor:
    """A detached float64 copy of ``tensor`` on the CPU, never sharing memory with it (a restored state does
    not alias the checkpoint it came from)."""
    return tensor.detach().to("cpu", torch.float64, copy=True)


def gramian_float64(grads: Tensor) -> Tensor:
    """G = J Jᵀ ``[K, K]`` in float64 on ``grads``' device, for ``grads [K, P]`` of any floating dtype."""
    k, p = grads.shape
    gramian = torch.zeros(k, k, dtype=torch.float64, device=grads.device)
    columns = max(1, FLOAT64_BLOCK // max(k, 1))
    for start in range(0, p, columns):
        block = grads[:, start:start + columns].detach().to(torch.float64)
        gramian += block @ block.T
    return gramian


def gramian_array(gramian: Tensor | np.ndarray, method: str) -> np.ndarray:
    """The Gramian as a symmetric positive semi-definite float64 array (see the module docstring)."""
    m = (cpu_float64(gramian).numpy() if isinstance(gramian, Tensor)
         else np.asarray(gramian, dtype=np.float64))
    if not np.all(np.isfinite(m)):
        raise NonFiniteValueError(f"{method}: the task-gradient Gramian contains NaN or Inf; "
                                  "check the losses and lower --lr")
    m = 0.5 * m + 0.5 * m.T   # halves first: m + m.T overflows for entries above half the float64 range
    eigenvalues, vectors = np.linalg.eigh(m)
    if eigenvalues[0] >= -PSD_TOLERANCE * max(float(eigenvalues[-1]), 0.0):
        return m
    clipped = (vectors * np.clip(eigenvalues, 0.0, None)) @ vectors.T
    return 0.5 * clipped + 0.5 * clipped.T


def psd_factor(m: np.ndarray) -> np.ndarray:
    """R ``[K, K]`` with R Rᵀ = m for a symmetric PSD ``m`` (R = V √Λ, negative rounding clipped)."""
    eigenvalues, vectors = np.linalg.eigh(m)
    return vectors * np.sqrt(np.clip(eigenvalues, 0.0, None))
