"""Numerics of the small K x K problems that Gramian-based methods solve, shared by the methods and the
engine (the trainer's BLAS threads, the distributed Gramian).

One rule for every solver method: the K x K problem is assembled and solved in float64, whatever the
training dtype.

* :func:`gramian_float64` -- G = J Jᵀ of a Jacobian in any floating dtype as a float64 K x K matrix, with no
  P-sized float64 work (a float64 copy and GEMM of J made every gradient method's solver 4-10x slower, issue 29).
  Two paths. *Plain*: the float32 products of column blocks of :data:`GRAMIAN_BLOCK` entries (bf16 upcast
  exactly), summed in float64 -- one GEMM's work, the floor of any Gramian. Its rounding is
  ~eps·‖g_i‖‖g_j‖, which is harmless unless the tasks are near-duplicates: when task gradients agree to 4-5
  digits the plain float32 Gramian's eigenvalues reach -6e-8·λmax, which no ridge far below the solvers'
  tolerance absorbs (MGDA's QP then fails), and the directions that tell the tasks apart (eigenvalues
  ~1e-9·λmax) drown in its rounding. So the plain product is kept only when every row lies at least half its
  norm from the mean row (‖g_i − m‖² ≥ :data:`PLAIN_GRAMIAN_SPREAD`·‖g_i‖², read from the product itself in
  float64), it is finite, and every nonzero ‖g_i‖² is at least :data:`PLAIN_GRAMIAN_SMALLEST` (no product lost
  to underflow matters) -- then it is within a factor 4 of the centred path's accuracy. Deciding costs one
  host synchronisation (the K x K check), which the solvers' copy of G to the CPU pays anyway. *Centred*
  (otherwise): with m the mean row, the rows near it (‖g_i - m‖ ≤ ‖g_i‖, a_i = 1) are replaced by
  e_i = g_i - m, the others kept (e_i = g_i, a_i = 0), and G = E Eᵀ + a uᵀ + u aᵀ + (m·m) a aᵀ with u = E m.
  The products E Eᵀ and E m run in float32 (bf16 upcast exactly) over blocks of :data:`GRAMIAN_BLOCK`
  entries, m·m (one vector) in float64, and the K x K pieces are summed and assembled in float64. The
  rounding of E Eᵀ is ~eps·‖e_i‖‖e_j‖ -- relative to how much the tasks differ, not to what they share --
  and that of u moves G only along a, where it is ~λmax: on near-duplicate tasks the result is as accurate
  and as PSD as the float64 Gramian (the method tests hold against float64 references). Each block is
  scaled by the power of two (exact) that brings its largest |entry| near 1, so no float32 product or sum
  overflows or underflows, whatever the gradients' magnitude; only a row whose entries are all below 2^-60
  times the block's largest entry loses precision (its products underflow in float32; the float64 Gramian
  kept it). On either path an exactly zero row gives an exactly zero row of G. With ``row_scales`` s (IMTL's
  e^{s_i}) it is the Gramian of the rows s_i g_i: D·(J Jᵀ)·D in float64 on the plain path, whose check then
  reads the scaled rows' spread; the scaled rows' centred product otherwise.
* :func:`one_blas_thread` (:func:`blas_on_one_thread` as a context) -- the decorator under which the K x K solves (and :func:`gramian_array`,
  :func:`psd_factor`) run numpy's and scipy's BLAS on one thread: a 40 x 40 eigendecomposition spread over
  OpenBLAS's threads waited ~16 ms for a descheduled thread on a busy machine instead of taking 0.1 ms.
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
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import NonFiniteValueError

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

Params = ParamSpec("Params")
Result = TypeVar("Result")

#: entries of J that :func:`gramian_float64` scales and centres at once (its float32 work buffer, which
#: stays in cache for the block's few passes)
GRAMIAN_BLOCK = 1 << 19
#: the plain float32 product J Jᵀ is used when every row is this far from the mean row: ‖g_i − m‖² ≥ it·‖g_i‖²
PLAIN_GRAMIAN_SPREAD = 0.25
#: ... and every nonzero ‖g_i‖² at least this (its float32 products stay clear of underflow)
PLAIN_GRAMIAN_SMALLEST = 2.0 ** -90
#: eigenvalues of a Gramian below -PSD_TOLERANCE·λmax are rounding error of a low-precision Gramian
PSD_TOLERANCE = 1e-13


def cpu_float64(tensor: Tensor) -> Tensor:
    """A detached float64 copy of ``tensor`` on the CPU, never sharing memory with it (a restored state does
    not alias the checkpoint it came from)."""
    return tensor.detach().to("cpu", torch.float64, copy=True)


def gramian_float64(grads: Tensor, row_scales: Tensor | None = None) -> Tensor:
    """G = J Jᵀ ``[K, K]`` in float64 on ``grads``' device, for ``grads [K, P]`` of any floating dtype, with no
    P-sized float64 work: the plain float32 product when it is as accurate as the centred one, else products
    of centred rows (see the module docstring). With ``row_scales`` [K] (positive): the Gramian of the rows
    s_i g_i, D J Jᵀ D with D = diag(s) applied in float64 to the plain product, or the centred product of the
    scaled rows (IMTL's, whose tasks may be near-duplicates only once scaled). Symmetric; the PSD repair of
    its rounding is :func:`gramian_array`'s."""
    j = grads.detach()
    if j.dtype == torch.float64:
        gramian = j @ j.T
        return _symmetrised(gramian if row_scales is None else _scaled(gramian, row_scales))
    with _float32_matmul_at_full_precision():
        plain = _plain_gramian(j)
        gramian = plain if row_scales is None else _scaled(plain, row_scales)
        if _plain_product_suffices(j, plain, gramian):
            return _symmetrised(gramian)
        return _centred_gramian(j, row_scales)


def _scaled(gramian: Tensor, row_scales: Tensor) -> Tensor:
    """D G D for D = diag(row_scales), in float64."""
    scales = row_scales.detach().to(gramian)
    return scales[:, None] * gramian * scales[None, :]


def _plain_gramian(j: Tensor) -> Tensor:
    """Σ over column blocks of the blocks' float32 products J_b J_bᵀ, summed in float64 (the rounding of one
    block's product, not of a P-long float32 sum). A float32 Jacobian is multiplied where it lies; a bf16/fp16
    one is upcast (exactly) a block at a time into one float32 buffer."""
    k, p = j.shape
    columns = max(1, min(p, GRAMIAN_BLOCK // max(k, 1)))
    buffer = None if j.dtype == torch.float32 else torch.empty(k, columns, dtype=torch.float32, device=j.device)
    gramian = torch.zeros(k, k, dtype=torch.float64, device=j.device)
    for start in range(0, p, columns):
        rows = j[:, start:start + columns]
        if buffer is not None:
            rows = buffer[:, :rows.shape[1]].copy_(rows)
        gramian += (rows @ rows.T).double()
    return gramian


def _plain_product_suffices(j: Tensor, plain: Tensor, gramian: Tensor) -> bool:
    """Whether ``gramian`` (``plain``, the plain product of ``j``, or its scaled D·plain·D) is as good as the
    centred product, decided on the K x K matrices in float64 (the one host synchronisation; a zero on the
    diagonal of ``plain`` also reads those rows of J):

    * finite (no float32 product or sum overflowed, no scale overflowed);
    * every ‖g_i‖² either ≥ :data:`PLAIN_GRAMIAN_SMALLEST` (then the products that float32 rounds into
      subnormals, at most P·2^-150 in all, stay below the product's own rounding, eps·‖g_i‖‖g_j‖, for any
      P ≤ 2^31) or 0 with the row exactly zero (a row whose every square underflowed is not);
    * every row (of the scaled rows, with ``row_scales``) at least half its norm from the mean row:
      ‖g_i − m‖² ≥ :data:`PLAIN_GRAMIAN_SPREAD`·‖g_i‖².
      The rounding of the plain product is ~eps·‖g_i‖‖g_j‖, that of the centred one ~eps·‖g_i − m‖‖g_j − m‖
      for the rows it centres: within the factor 1/PLAIN_GRAMIAN_SPREAD = 4 of each other unless the tasks
      are near-duplicates of their mean, which is exactly when the plain product loses what tells them
      apart. ‖g_i − m‖² = G_ii − 2 (G1)_i/K + 1ᵀG1/K² is read from ``gramian``: its own rounding, ~eps·‖g_i‖²,
      is far below the threshold.
    """
    k = j.shape[0]
    squares, norms = plain.diagonal(), gramian.diagonal()
    row_means = gramian.sum(dim=1) / k
    spread = norms - 2.0 * row_means + row_means.sum() / k
    zero = squares == 0
    checks = torch.stack([torch.isfinite(gramian).all(), ((squares >= PLAIN_GRAMIAN_SMALLEST) | zero).all(),
                          (spread >= PLAIN_GRAMIAN_SPREAD * norms).all(), zero.any()])
    finite, normal, spread_out, any_zero = checks.tolist()
    if not (finite and normal and spread_out):
        return False
    return not any_zero or not bool(torch.count_nonzero(j[zero]))


def _centred_gramian(j: Tensor, row_scales: Tensor | None) -> Tensor:
    """G from float32 products of centred, power-of-two-scaled column blocks, assembled in float64 (see the
    module docstring); the rows scaled by ``row_scales`` first when given. Called under
    :func:`_float32_matmul_at_full_precision`."""
    k, p = j.shape
    columns = max(1, min(p, GRAMIAN_BLOCK // (k + 1)))
    buffer = torch.empty(k + 1, columns, dtype=torch.float32, device=j.device)
    mean_weights = torch.full((k,), 1.0 / max(k, 1), dtype=torch.float32, device=j.device)
    scales = None if row_scales is None else row_scales.detach().to(buffer)[:, None]
    gramian = torch.zeros(k, k, dtype=torch.float64, device=j.device)
    # block by block (the scale, m, a and E are the block's; G sums the blocks' Gramians): rows 0..K-1 of
    # the buffer hold e_i = 2^-s g_i - a_i m, row K holds m; one product gives E Eᵀ, E m and m·m
    for start in range(0, p, columns):
        rows = j[:, start:start + columns]
        block, e, mean = buffer[:, :rows.shape[1]], buffer[:k, :rows.shape[1]], buffer[k, :rows.shape[1]]
        if scales is not None:
            torch.mul(rows, scales, out=e)
        else:
            e.copy_(rows)                               # bf16/fp16 -> float32 is exact
        exponent = _scale_exponent(e)
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


def one_blas_thread(solve: Callable[Params, Result]) -> Callable[Params, Result]:
    """Decorator: ``solve`` (a K x K problem in numpy/scipy) runs with numpy's and scipy's BLAS on one thread.
    Their BLAS (OpenBLAS) otherwise starts a thread per core for every eigendecomposition of a 40 x 40
    matrix; on a machine whose other cores are busy (the training's own threads, other jobs) each call then
    waits for a descheduled thread: ``np.linalg.eigh`` of a 40 x 40 Gramian took 16 ms instead of 0.1 ms
    with one busy core, which made the K x K solve most of a Gramian method's solver time (issue 29)."""
    @functools.wraps(solve)
    def on_one_thread(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        with blas_on_one_thread():
            return solve(*args, **kwargs)
    return on_one_thread


def blas_on_one_thread() -> contextlib.AbstractContextManager:
    """The context of :func:`one_blas_thread`: numpy's and scipy's BLAS on one thread inside ``with`` (torch's
    own BLAS and OpenMP threads are not theirs and keep the training's setting); the trainer runs every
    method's solver under it, whatever K x K solves the method does."""
    return _blas_controller().limit(limits=1, user_api="blas")


@functools.cache
def _blas_controller() -> ThreadpoolController:
    # scipy ships its own OpenBLAS, loaded with scipy.linalg: load it before the controller lists the libraries
    import scipy.linalg  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@one_blas_thread
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


@one_blas_thread
def psd_factor(m: np.ndarray) -> np.ndarray:
    """R ``[K, K]`` with R Rᵀ = m for a symmetric PSD ``m`` (R = V √Λ, negative rounding clipped)."""
    eigenvalues, vectors = np.linalg.eigh(m)
    return vectors * np.sqrt(np.clip(eigenvalues, 0.0, None))
