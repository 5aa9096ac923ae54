"""The Gramian's two paths and the K x K solvers' BLAS threads (issue 29, item 2: solver ≤ 10 % of the step).

``gramian_float64`` takes the plain float32 product J Jᵀ (blocks summed in float64) when every row lies at least
half its norm from the mean row and its products stay normal float32 numbers, else the centred, scaled product
(``test_zoo_numerics.py`` holds that one against float64 references on near-duplicates). These tests check the
choice against the rule computed independently in numpy float64, the plain path's accuracy where it is taken,
and the fall-backs (near-duplicates only once scaled, underflowing squares, overflow). The K x K solves run
with one BLAS thread: checked with threadpoolctl's own report from inside every solver's eigendecompositions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_helpers import TensorWatch

from mtlflow import methods
from mtlflow.core import numerics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spread_rows(seed: int, k: int, p: int, shared: float, dtype: torch.dtype) -> torch.Tensor:
    """K rows g_i = shared·b + n_i (b, n_i standard normal, float64, rounded to ``dtype``): ‖g_i − m‖²/‖g_i‖²
    ≈ (1 − 1/K)/(1 + shared²), from near 1 (shared = 0) down to near-duplicates (shared ≫ 1)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(1, p, generator=gen, dtype=torch.float64)
    return (shared * base + torch.randn(k, p, generator=gen, dtype=torch.float64)).to(dtype)


def exact_gramian(grads: torch.Tensor, scales: np.ndarray | None = None) -> np.ndarray:
    j = grads.to(torch.float64).numpy()
    if scales is not None:
        j = scales[:, None] * j
    return j @ j.T


def smallest_spread(grads: torch.Tensor) -> float:
    """min_i ‖g_i − m‖²/‖g_i‖², in numpy float64 from the rows themselves (not from a Gramian)."""
    j = grads.to(torch.float64).numpy()
    return float((((j - j.mean(axis=0)) ** 2).sum(axis=1) / (j ** 2).sum(axis=1)).min())


class PathSpy:
    """Counts the calls of the centred path (the fall-back) while running the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        centred = numerics._centred_gramian

        def counted(*args, **kwargs):
            self.calls += 1
            return centred(*args, **kwargs)

        monkeypatch.setattr(numerics, "_centred_gramian", counted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared,plain", [(0.0, True), (1.0, True), (1.5, True), (2.5, False), (30.0, False)])
def test_the_plain_product_is_taken_exactly_when_every_row_is_half_its_norm_from_the_mean(
        dtype: torch.dtype, shared: float, plain: bool, monkeypatch) -> None:
    j = spread_rows(int(shared * 10), 8, 3000, shared, dtype)
    assert (smallest_spread(j) >= numerics.PLAIN_GRAMIAN_SPREAD) == plain   # the rule, independently
    spy = PathSpy(monkeypatch)
    g = numerics.gramian_float64(j)
    assert spy.calls == (0 if plain else 1)
    assert g.dtype == torch.float64 and torch.equal(g, g.T)
    exact = exact_gramian(j)
    norms = np.sqrt(np.diag(exact))
    # rounding of float32 sums of 3000 products (~√P·eps) in units of ‖g_i‖‖g_j‖ (bf16 is upcast exactly)
    assert np.abs((g.numpy() - exact) / np.outer(norms, norms)).max() < 1e-5
    # what tells the tasks apart, C G C (C = I − 11ᵀ/K), to 1e-5 of its largest entry: the plain path is
    # taken only where its rounding, ~eps·‖g‖², is no more than ~4 eps of the rows' distances to the mean
    c = np.eye(8) - 1.0 / 8
    np.testing.assert_allclose(c @ g.numpy() @ c, c @ exact @ c, rtol=0, atol=1e-5 * np.abs(c @ exact @ c).max())


def test_the_plain_path_does_no_float64_work_on_the_jacobian_and_multiplies_at_full_float32_precision(
        monkeypatch) -> None:
    k = 6
    monkeypatch.setattr(numerics, "GRAMIAN_BLOCK", k * 1000)   # 1000 columns a block: 20 blocks
    j = spread_rows(0, k, 20_000, 0.5, torch.float32)
    spy, watch, previous = PathSpy(monkeypatch), TensorWatch(), torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with watch:
            g = numerics.gramian_float64(j)
    finally:
        torch.set_float32_matmul_precision(previous)
    assert spy.calls == 0
    assert watch.largest_float64 <= k * k and watch.precisions == {"highest"}
    np.testing.assert_allclose(g.numpy(), exact_gramian(j), rtol=1e-6, atol=1e-6 * float(g.diagonal().max()))


def test_a_zero_row_stays_on_the_plain_path_and_exactly_zero_but_a_row_whose_squares_underflow_does_not(
        monkeypatch) -> None:
    spy = PathSpy(monkeypatch)
    j = spread_rows(4, 5, 2000, 0.5, torch.float32)
    j[2] = 0.0
    g = numerics.gramian_float64(j).numpy()
    assert spy.calls == 0 and (g[2] == 0).all() and (g[:, 2] == 0).all()
    # entries of 1e-30: their float32 squares (1e-60) are 0, so the plain product sees a zero row
    j[2] = spread_rows(5, 1, 2000, 0.0, torch.float64)[0].float() * 1e-30
    assert float(j[2] @ j[2]) == 0.0
    g, exact = numerics.gramian_float64(j).numpy(), exact_gramian(j)
    assert spy.calls == 1
    assert g[2, 2] == pytest.approx(exact[2, 2], rel=1e-6)
    # squares that are float32 subnormals (entries 1e-21: ‖g‖² ≈ 2e-39 < 2^-90) also fall back
    j[2] = j[2] * 1e9
    g, exact = numerics.gramian_float64(j).numpy(), exact_gramian(j)
    assert spy.calls == 2 and g[2, 2] == pytest.approx(exact[2, 2], rel=1e-6)


def test_spread_out_rows_whose_plain_product_overflows_fall_back_to_the_scaled_product(monkeypatch) -> None:
    spy = PathSpy(monkeypatch)
    j = (spread_rows(6, 4, 500, 0.5, torch.float64) * 1e22).float()
    assert not torch.isfinite(j @ j.T).all()
    g, exact = numerics.gramian_float64(j).numpy(), exact_gramian(j)
    assert spy.calls == 1
    np.testing.assert_allclose(g, exact, rtol=1e-6, atol=1e-6 * exact.diagonal().max())


def test_scaled_rows_are_judged_by_their_own_spread(monkeypatch) -> None:
    """IMTL's Gramian of s_i g_i: rows that are far apart (g_3 = 128·g_1 + …) but near-duplicates once scaled
    (s = 1, 1, 1/128) take the centred path of the scaled rows; spread-out scaled rows take D·(J Jᵀ)·D."""
    spy = PathSpy(monkeypatch)
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(1, 4000, generator=gen, dtype=torch.float64)
    factors = torch.tensor([1.0, 1.0, 128.0], dtype=torch.float64)[:, None]
    j = (factors * (base + 1e-4 * torch.randn(3, 4000, generator=gen, dtype=torch.float64))).float()
    assert smallest_spread(j) >= numerics.PLAIN_GRAMIAN_SPREAD            # the raw rows pass the rule ...
    scales = np.array([1.0, 1.0, 1.0 / 128.0])                             # (powers of two: exact in float32)
    assert smallest_spread(torch.from_numpy(scales[:, None]) * j.double()) < 1e-6   # ... the scaled ones not
    g = numerics.gramian_float64(j, torch.tensor(scales, dtype=torch.float32)).numpy()
    assert spy.calls == 1
    exact = exact_gramian(j, scales)
    c = np.eye(3) - 1.0 / 3
    np.testing.assert_allclose(c @ g @ c, c @ exact @ c, rtol=0, atol=1e-4 * np.abs(c @ exact @ c).max())

    j = spread_rows(8, 4, 3000, 0.5, torch.float32)
    scales = np.array([0.5, 1.0, 2.0, 3.0])
    g = numerics.gramian_float64(j, torch.tensor(scales, dtype=torch.float32)).numpy()
    assert spy.calls == 1
    exact = exact_gramian(j, scales)
    np.testing.assert_allclose(g, exact, rtol=1e-6, atol=1e-6 * exact.diagonal().max())


def blas_threads() -> dict[str, int]:
    """The BLAS libraries loaded in the process (numpy's and scipy's OpenBLAS, ...) and their thread counts."""
    from threadpoolctl import threadpool_info

    return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}


def test_one_blas_thread_limits_numpy_and_scipy_blas_inside_and_restores_them_after() -> None:
    import scipy.linalg  # noqa: F401 -- scipy's own OpenBLAS
    from threadpoolctl import threadpool_limits

    @numerics.one_blas_thread
    def inside() -> dict[str, int]:
        return blas_threads()

    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        # numpy's and scipy's OpenBLAS at least (a single-threaded build, e.g. scs's, stays at 1)
        adjustable = [library for library, threads in before.items() if threads == 2]
        assert len(adjustable) >= 2
        threads = inside()
        assert all(threads[library] == 1 for library in adjustable)
        assert blas_threads() == before


@pytest.mark.parametrize("name", ["mgda", "upgrad", "fairgrad", "nashmtl", "imtlg", "gradvac", "imtl"])
def test_every_gramian_solver_runs_its_eigendecompositions_on_one_blas_thread(name: str, monkeypatch) -> None:
    """OpenBLAS starts a thread per core for each 40 x 40 eigendecomposition; with the other core busy each call
    waited ~16 ms for it (0.1 ms on one thread), most of the solver's time at K = 40 (issue 29)."""
    import scipy.linalg  # noqa: F401 -- scipy's own OpenBLAS
    from threadpoolctl import threadpool_limits

    seen: list[dict[str, int]] = []
    eigh = np.linalg.eigh

    def watched(*args, **kwargs):
        seen.append(blas_threads())
        return eigh(*args, **kwargs)

    monkeypatch.setattr(np.linalg, "eigh", watched)
    j = spread_rows(9, 5, 200, 0.5, torch.float32)
    method = methods.build(name, 5)
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        method.combine(j, torch.linspace(1.0, 2.0, 5))
        after = blas_threads()
    assert seen and all(threads[library] == 1 for threads in seen for library in before)
    assert {library: after[library] for library in before} == before
