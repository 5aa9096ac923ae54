"""Numerics of the small K x K problems that Gramian-based methods solve (not a method module).

One rule for every solver method: the K x K problem is assembled and solved in float64, whatever the
training dtype.

* :func:`gramian_float64` -- G = J Jᵀ of a Jacobian in any floating dtype as a float64 K x K matrix, with no
  P-sized float64 work (a float64 copy and GEMM of J made every gradient method's solver 4-10x slower, issue 29).
  The Gramian of fp32 (or bf16) gradients formed plainly in fp32 is not positive semi-definite to working
  precision: when task gradients agree to 4-5 digits its eigenvalues reach -6e-8·λmax, which no ridge far
  below the solvers' tolerance absorbs (MGDA's QP then fails), and the directions that tell the tasks apart
  (eigenvalues ~1e-9·λmax) drown in its rounding. So the products are taken of *centred* rows: with m the
  mean row, the rows near it (‖g_i - m‖ ≤ ‖g_i‖, a_i = 1) are replaced by e_i = g_i - m, the others kept
  (e_i = g_i, a_i = 0), and G = E Eᵀ + a uᵀ + u aᵀ + (m·m) a aᵀ with u = E m. The products E Eᵀ and E m
  run in float32 (bf16 upcast exactly) over blocks of :data:`GRAMIAN_BLOCK` entries, m·m (one vector) in
  float64, and the K x K pieces are summed and assembled in float64. The rounding of E Eᵀ is
  ~eps·‖e_i‖‖e_j‖ -- relative to how much the tasks differ, not to what they share -- and that of u moves G
  only along a, where it is ~λmax: on near-duplicate tasks the result is as accurate and as PSD as the
  float64 Gramian (the method tests hold against float64 references). An
  exactly zero row gives an exactly zero row of G. Each block is scaled by the power of two (exact) that
  brings its largest |entry| near 1, so no float32 product or sum overflows or underflows, whatever the
  gradients' magnitude; only a row whose entries are all below 2^-60 times the block's largest entry loses
  precision (its products underflow in float32; the float64 Gramian kept it). All on the Jacobian's
  device, with no host synchronisation.
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

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import NonFiniteValueError

#: entries of J that :func:`gramian_float64` scales and centres at once (its float32 work buffer, which
#: stays in cache for the block's few passes)
GRAMIAN_BLOCK = 1 << 19
#: eigenvalues of a Gramian below -PSD_TOLERANCE·λmax are rounding error of a low-precision Gramian
PSD_TOLERANCE = 1e-13


def cpu_float64(tensor: Tensor) -> Tensor:
    """A detached float64 copy of ``tensor`` on the CPU, never sharing memory with it (a restored state does
    not alias the checkpoint it came from)."""
    return tensor.detach().to("cpu", torch.float64, copy=True)


def gramian_float64(grads: Tensor) -> Tensor:
    """G = J Jᵀ ``[K, K]`` in float64 on ``grads``' device, for ``grads [K, P]`` of any floating dtype, with no
    P-sized float64 work: products of centred rows in float32, summed and assembled in float64 (see the module
    docstring). Symmetric; the PSD repair of its rounding is :func:`gramian_array`'s."""
    j = grads.detach()
    if j.dtype == torch.float64:
        return _symmetrised(j @ j.T)
    k, p = j.shape
    columns = max(1, min(p, GRAMIAN_BLOCK // (k + 1)))
    buffer = torch.empty(k + 1, columns, dtype=torch.float32, device=j.device)
    mean_weights = torch.full((k,), 1.0 / max(k, 1), dtype=torch.float32, device=j.device)
    gramian = torch.zeros(k, k, dtype=torch.float64, device=j.device)
    with _float32_matmul_at_full_precision():
        # block by block (the scale, m, a and E are the block's; G sums the blocks' Gramians): rows 0..K-1 of
        # the buffer hold e_i = 2^-s g_i - a_i m, row K holds m; one product gives E Eᵀ, E m and m·m
        for start in range(0, p, columns):
            rows = j[:, start:start + columns]
            block, e, mean = buffer[:, :rows.shape[1]], buffer[:k, :rows.shape[1]], buffer[k, :rows.shape[1]]
            exponent = _scale_exponent(e.copy_(rows))      # bf16/fp16 -> float32 is exact
            e.mul_(torch.exp2(-exponent.to(e.dtype)))       # a power of two: exact
            torch.mv(e.T, mean_weights, out=mean)
            near = (2.0 * torch.mv(e, mean) >= mean @ mean).to(e.dtype)   # ‖g_i - m‖ ≤ ‖g_i‖
            e.addr_(near, mean, alpha=-1.0)
            products = (block @ block.T).double()
            a, mixed = near.double(), products[:k, k]
            # m·m is most of every entry of near-duplicate rows: its float32 rounding (~eps·‖m‖²) would
            # shift them all alike, so it is summed in float64 (one vector, not the [K, P] Jacobian)
            common = torch.dot(mean.double(), mean.double())
            gramian += torch.exp2(2.0 * exponent.double()) * (
                products[:k, :k] + a[:, None] * mixed[None, :] + mixed[:, None] * a[None, :]
                + common * a[:, None] * a[None, :])
    return _symmetrised(gramian)


def _symmetrised(m: Tensor) -> Tensor:
    return 0.5 * m + 0.5 * m.T   # halves first: m + m.T overflows for entries above half the float64 range


def _scale_exponent(rows: Tensor) -> Tensor:
    """s (a 0-dim int tensor on ``rows``' device, no host sync) with the largest |entry| of rows·2^-s in
    [1/2, 1): float32 products of the scaled entries and their sums over the columns stay finite. 0 for a
    zero or non-finite block (a non-finite Gramian is refused by its consumers). |s| ≤ 126, so 2^-s is a
    normal float32 number (the largest scaled entry then lies in [2^-23, 4) for the few blocks whose largest
    entry is subnormal or above 2^126)."""
    low, high = torch.aminmax(rows)
    largest = torch.maximum(high, -low)
    exponent = torch.frexp(largest).exponent.clamp(-126, 126)
    return torch.where(torch.isfinite(largest) & (largest > 0), exponent, 0)


@contextlib.contextmanager
def _float32_matmul_at_full_precision() -> Iterator[None]:
    """float32 matmuls in full float32 (not the TF32 or bf16 passes that a ``set_float32_matmul_precision``
    of the user's may allow): the Gramian's accuracy is float32's."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


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
