"""The method zoo on inputs real training produces (issue 12, "Wrong results" item 9).

Each test checks a value against an independent computation -- a KKT condition or fixed-point residual
evaluated in float64, TorchJD's aggregator in float64, a primal solve with cvxpy/Clarabel in ℝ^P, a
numpy transcription of the official code's rule, or a hand-checked case -- through the methods'
production entry points (``combine`` / ``weights_from_gramian`` / the trainer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from method_helpers import TensorWatch, jacobian

from mtlflow import jobs, methods
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import InvalidParameterError, NonFiniteValueError, SolverError
from mtlflow.methods.solvers import fairgrad_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOW_PRECISION = [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)]


def near_duplicates(seed: int, k: int, p: int, noise: float, dtype: torch.dtype) -> torch.Tensor:
    """K task gradients that agree to ~-log10(noise) digits, rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(1, p, generator=gen, dtype=torch.float64)
    return (base + noise * torch.randn(k, p, generator=gen, dtype=torch.float64)).to(dtype)


def combine(name: str, grads: torch.Tensor, **hparams: Any) -> tuple[torch.Tensor, methods.Method]:
    method = methods.build(name, grads.shape[0], **hparams)
    return method.combine(grads, torch.ones(grads.shape[0], dtype=grads.dtype)), method


def exact_gramian(grads: torch.Tensor) -> np.ndarray:
    """The Gramian of the (rounded) gradients, exactly enough: numpy float64."""
    j = grads.to(torch.float64).numpy()
    return j @ j.T


def mean_projection_onto_dual_cone(j: np.ndarray) -> np.ndarray:
    """(1/K) Σ_i argmin_x ‖x − g_i‖² s.t. J x ≥ 0, solved in ℝ^P with cvxpy/Clarabel (UPGrad's definition)."""
    import cvxpy as cp

    projections = []
    for g in j:
        x = cp.Variable(j.shape[1])
        problem = cp.Problem(cp.Minimize(cp.sum_squares(x - g)), [j @ x >= 0])
        problem.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        assert problem.status == "optimal"
        projections.append(np.asarray(x.value))
    return np.mean(projections, axis=0)


# -- Gramians: float32 products of centred rows, assembled in float64 ------------------------------

def float32_sequential_gramian(grads: torch.Tensor) -> np.ndarray:
    """J Jᵀ in float32 with a fixed order of operations: every product rounded to float32, then summed one
    term after another (np.cumsum is sequential), so its rounding is the same on every IEEE host."""
    j = grads.float().numpy()
    return np.array([[np.cumsum(a * b, dtype=np.float32)[-1] for b in j] for a in j], dtype=np.float64)


def assert_differences_close(g: np.ndarray, exact: np.ndarray, rtol: float = 1e-5) -> None:
    """C G C (C = I - 11ᵀ/K: the Gramian of the rows' differences from their mean, what tells the tasks
    apart) within rtol of its largest entry, or of the float64 rounding of forming C G C from G itself."""
    c = np.eye(len(g)) - 1.0 / len(g)
    floor = 100 * np.finfo(np.float64).eps * np.abs(exact).max()
    np.testing.assert_allclose(c @ g @ c, c @ exact @ c, rtol=0, atol=rtol * np.abs(c @ exact @ c).max() + floor)


@pytest.mark.parametrize("dtype,noise", [(torch.float32, 1e-4), (torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_gramian_of_low_precision_near_duplicates_is_accurate_where_the_tasks_differ(
        dtype: torch.dtype, noise: float, seed: int) -> None:
    from mtlflow.core.numerics import gramian_array, gramian_float64

    j = near_duplicates(seed, 10, 1000, noise, dtype)
    exact = exact_gramian(j)
    c = np.eye(10) - 0.1
    # the failure mode of a plain float32 product: the differences between the tasks drown in its rounding.
    # The premise is built from IEEE float32 arithmetic in a fixed order (each product rounded once, then a
    # sequential sum), not from the host's GEMM, whose blocking and kernels (AVX2, AVX-512, AMX) round
    # differently: on one AVX-512 host the GEMM's error at bf16 noise 1e-2 sat just under the bound (issue 38).
    fp32 = float32_sequential_gramian(j)
    assert np.abs(c @ (fp32 - exact) @ c).max() > 1e-3 * np.abs(c @ exact @ c).max()
    g = gramian_float64(j)
    assert g.dtype == torch.float64 and torch.equal(g, g.T)
    g = g.numpy()
    np.testing.assert_allclose(g, exact, rtol=1e-6)
    assert_differences_close(g, exact)
    # PSD as the float64 Gramian is (to ~1e-16·λmax), the smallest eigenvalue (~1e-9·λmax in float32 at
    # noise 1e-4) to 4 digits; gramian_array repairs no more than rounding
    eigenvalues, reference = np.linalg.eigvalsh(g), np.linalg.eigvalsh(exact)
    assert eigenvalues[0] >= -1e-14 * eigenvalues[-1]
    assert eigenvalues[0] == pytest.approx(reference[0], rel=1e-3 if noise < 1e-2 else 1e-5)
    repaired = gramian_array(g, "test")
    assert np.linalg.eigvalsh(repaired)[0] >= -1e-14 * eigenvalues[-1]
    np.testing.assert_allclose(repaired, g, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gramian_of_a_low_precision_jacobian_does_no_float64_work_on_it(dtype: torch.dtype, monkeypatch) -> None:
    """Issue 29: a float64 copy and product of J [K, P] made every gradient method's solver 4-10x slower.
    Every tensor operation inside the Gramian is watched: none takes or makes a float64 tensor larger than
    one block's row (the float64 m·m), and every float32 matrix product runs at full float32 precision even
    when the caller allowed TF32/bf16 passes."""
    from mtlflow.core import numerics

    k, p, columns = 6, 20_000, 1000
    monkeypatch.setattr(numerics, "GRAMIAN_BLOCK", (k + 1) * columns)
    j = near_duplicates(0, k, p, 1e-3, dtype)
    watch, previous = TensorWatch(), torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with watch:
            g = numerics.gramian_float64(j)
        assert torch.get_float32_matmul_precision() == "medium"    # the caller's setting is restored
    finally:
        torch.set_float32_matmul_precision(previous)
    np.testing.assert_allclose(g.numpy(), exact_gramian(j), rtol=1e-6)
    assert watch.largest_float64 <= columns    # a float64 copy of J would be k·p = 120,000 entries
    assert watch.precisions == {"highest"}


@pytest.mark.parametrize("magnitude", [1e25, 1e-25])
def test_gramian_of_float32_gradients_far_from_one_neither_overflows_nor_underflows(magnitude: float) -> None:
    # entries of 1e25 square to 1e50 (beyond float32's 3e38), of 1e-25 to 1e-50 (below its 1e-45); the rows
    # are scaled by a power of two (exact) before their products, and the Gramian scaled back in float64
    from mtlflow.core.numerics import gramian_float64

    j = (near_duplicates(1, 4, 300, 0.5, torch.float64) * magnitude).float()
    plain = j @ j.T
    assert (not torch.isfinite(plain).all()) if magnitude > 1 else bool((plain == 0).all())
    exact = exact_gramian(j)
    norms = np.sqrt(np.diag(exact))
    assert np.abs(gramian_float64(j).numpy() - exact).max() <= 1e-6 * norms.max() ** 2
    np.testing.assert_allclose(np.diag(gramian_float64(j).numpy()), np.diag(exact), rtol=1e-6)


def test_gramian_keeps_a_zero_row_exactly_zero_and_a_small_row_to_its_own_precision() -> None:
    # centring must not leak the other rows' rounding into a zero gradient (methods treat those apart) nor
    # into one 1e12 times smaller than the rest: those rows are kept as they are, not centred
    from mtlflow.core.numerics import gramian_float64

    j = near_duplicates(3, 5, 400, 1e-3, torch.float64)
    j[1] = 0.0
    j[3] *= 1e-12
    j = j.float()
    g, exact = gramian_float64(j).numpy(), exact_gramian(j)
    assert (g[1] == 0).all() and (g[:, 1] == 0).all()
    norms = np.sqrt(np.diag(exact))
    scaled = np.divide(g - exact, np.outer(norms, norms), out=np.zeros_like(g), where=np.outer(norms, norms) > 0)
    assert np.abs(scaled).max() < 1e-6


def test_gramian_of_float64_gradients_is_their_float64_product() -> None:
    from mtlflow.core.numerics import gramian_float64

    j = near_duplicates(0, 10, 1000, 1e-4, torch.float64)
    np.testing.assert_allclose(gramian_float64(j).numpy(), exact_gramian(j), rtol=1e-14, atol=1e-12)


@pytest.mark.parametrize("dtype,noise", LOW_PRECISION)
@pytest.mark.parametrize("seed", [0, 1])
def test_mgda_on_near_duplicate_tasks_satisfies_kkt(dtype: torch.dtype, noise: float, seed: int) -> None:
    j = near_duplicates(seed, 10, 1000, noise, dtype)
    _, method = combine("mgda", j)
    w, g = method.last_weights.numpy(), exact_gramian(j)
    # min-norm KKT: (G w)_i ≥ wᵀGw for every i, with equality on the support
    value = float(w @ g @ w)
    assert w.min() >= 0 and w.sum() == pytest.approx(1.0, abs=1e-12)
    assert (g @ w).min() >= value * (1 - 1e-7)
    np.testing.assert_allclose((g @ w)[w > 1e-9], value, rtol=1e-6)


def test_mgda_all_zero_jacobian_gives_uniform_weights_and_zero_update() -> None:
    # every point of the simplex has norm 0; the exact solver returns the uniform weights, not a 0/0 solve
    d, method = combine("mgda", torch.zeros(3, 5, dtype=torch.float64))
    assert method.last_weights.tolist() == [1 / 3, 1 / 3, 1 / 3]
    assert d.tolist() == [0.0] * 5


@pytest.mark.parametrize("dtype,noise", LOW_PRECISION)
def test_nashmtl_and_fairgrad_on_near_duplicate_tasks_solve_the_fixed_point(dtype: torch.dtype, noise: float) -> None:
    j = near_duplicates(2, 10, 1000, noise, dtype)
    g = exact_gramian(j)
    _, nash = combine("nashmtl", j)
    alpha = nash.last_weights.numpy()
    assert nash.stationary_steps == 0
    np.testing.assert_allclose(alpha * (g @ alpha), 1.0, atol=1e-6)          # α ⊙ GᵀGα = 1
    _, fair = combine("fairgrad", j, alpha=2.0)
    w = fair.last_weights.numpy()
    np.testing.assert_allclose(g @ w, w ** -0.5, rtol=1e-8)                    # GᵀG w = w^(-1/α)


@pytest.mark.parametrize("dtype,noise", LOW_PRECISION)
def test_upgrad_and_alignedmtl_on_near_duplicate_tasks(dtype: torch.dtype, noise: float) -> None:
    from torchjd.aggregation import AlignedMTLWeighting

    j = near_duplicates(3, 6, 40, noise, dtype)
    j64 = j.to(torch.float64)
    d, _ = combine("upgrad", j)
    np.testing.assert_allclose(d.double().numpy(), mean_projection_onto_dual_cone(j64.numpy()),
                               rtol=float(torch.finfo(dtype).eps) * 4, atol=1e-6)
    _, aligned = combine("alignedmtl", j)
    reference = AlignedMTLWeighting(scale_mode="min")(j64 @ j64.T).numpy()
    np.testing.assert_allclose(aligned.last_weights.numpy(), reference, rtol=1e-6)


@pytest.mark.parametrize("name", ["mgda", "nashmtl", "upgrad", "cagrad", "fairgrad", "imtlg"])
def test_solver_methods_accept_an_fp32_gramian_from_the_gramian_only_engine(name: str) -> None:
    """TorchJD's autogram hands over a Gramian accumulated in the model's dtype: not PSD here."""
    j64 = near_duplicates(4, 10, 1000, 1e-4, torch.float32).double()
    j = near_duplicates(4, 10, 1000, 1e-4, torch.float32)
    method = methods.build(name, 10)
    w = method.weights_from_gramian((j @ j.T).detach(), torch.ones(10)).numpy()
    reference = methods.build(name, 10).weights_from_gramian(j64 @ j64.T, torch.ones(10)).numpy()
    jd = j.double().numpy()
    d, d_ref = w @ jd, reference @ jd
    # the fp32 Gramian's rounding error (~1e-7·λmax) bounds the agreement of the directions
    assert 1 - d @ d_ref / (np.linalg.norm(d) * np.linalg.norm(d_ref)) < 1e-6


# -- IMTL-G ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,noise", [(torch.float32, 1e-4), (torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("k", [3, 10])
def test_imtlg_on_near_duplicate_tasks_matches_torchjd_in_float64(dtype: torch.dtype, noise: float, k: int) -> None:
    from torchjd.aggregation import IMTLG

    for seed in range(4):
        j = near_duplicates(seed, k, 1000, noise, dtype)
        _, method = combine("imtlg", j)
        j64 = j.to(torch.float64)
        reference = IMTLG()(j64).numpy()
        # near-duplicate tasks leave the weights ill-conditioned (cond(G) ~ 1e9); the direction is not
        d = method.last_weights.numpy() @ j64.numpy()
        np.testing.assert_allclose(d, reference, rtol=1e-7, atol=1e-7 * np.linalg.norm(reference))
        assert abs(method.last_weights.sum().item() - 1) < 1e-12
        units = j64.numpy() / np.linalg.norm(j64.numpy(), axis=1, keepdims=True)
        np.testing.assert_allclose(units @ d, np.mean(units @ d), rtol=1e-9)   # equal projections


def test_imtlg_exactly_opposite_gradients_give_zero_update() -> None:
    # g2 = -g1: Σα = 1 and d·u1 = d·u2 = -d·u1 force d = 0, i.e. α = (1/2, 1/2) (hand-checked)
    j = torch.tensor([[1.0, 2.0, -1.0], [-1.0, -2.0, 1.0]], dtype=torch.float64)
    d, method = combine("imtlg", j)
    np.testing.assert_allclose(method.last_weights.numpy(), [0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(d.numpy(), 0.0, atol=1e-12)


def test_imtlg_with_an_inf_entry_raises_one_clear_error(capfd: pytest.CaptureFixture[str]) -> None:
    from mtlflow.core.errors import NonFiniteValueError

    j = torch.tensor([[1.0, float("inf")], [0.5, 1.0]], dtype=torch.float32)
    with pytest.raises(NonFiniteValueError, match="imtlg: the task-gradient Gramian contains NaN or Inf"):
        combine("imtlg", j)
    captured = capfd.readouterr()
    assert "LAPACK" not in captured.out + captured.err and "DLASCL" not in captured.out + captured.err


# -- FairGrad -------------------------------------------------------------------------------------

@pytest.mark.parametrize("grads,expected_weights", [
    ([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]], [0.0, 1.0]),             # a zero gradient: 0 in the hull
    ([[1.0, 2.0, 0.0], [-2.0, -4.0, 0.0]], [2 / 3, 1 / 3]),        # anti-parallel: 2/3·g1 + 1/3·g2 = 0
])
def test_fairgrad_pareto_stationary_inputs_give_the_zero_min_norm_update(grads: list, expected_weights: list) -> None:
    j = torch.tensor(grads, dtype=torch.float64)
    d, method = combine("fairgrad", j)
    np.testing.assert_allclose(method.last_weights.numpy(), expected_weights, atol=1e-8)
    np.testing.assert_allclose(d.numpy(), 0.0, atol=1e-8)
    assert method.stationary_steps == 1 and method.last_residual is None
    with pytest.raises(SolverError, match="residual"):       # the solver itself never returns a non-solution
        fairgrad_weights(j @ j.T, 1.0)


def test_fairgrad_solver_refuses_zero_and_non_finite_gramians_naming_itself() -> None:
    with pytest.raises(SolverError) as error:
        fairgrad_weights(np.zeros((2, 2)), 1.0)
    assert str(error.value) == "fairgrad: every task gradient is zero; the α-fair weights do not exist"
    with pytest.raises(NonFiniteValueError) as error:
        fairgrad_weights(np.array([[1.0, np.nan], [np.nan, 1.0]]), 1.0)
    assert str(error.value).startswith("fairgrad: ")


@pytest.mark.parametrize("returned", [[0.5, 0.0], [np.nan, 1.0]])
def test_fairgrad_solver_refuses_a_least_squares_result_off_the_positive_orthant(
        monkeypatch: pytest.MonkeyPatch, returned: list[float]) -> None:
    """A zero (its power -1/α is infinite) or NaN weight from scipy is reported, never mapped back."""
    from types import SimpleNamespace

    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "least_squares", lambda *args, **kwargs: SimpleNamespace(x=np.array(returned)))
    with pytest.raises(SolverError) as error:
        fairgrad_weights(np.eye(2), 1.0)
    assert str(error.value) == ("fairgrad: the least-squares solve returned non-positive or non-finite weights; "
                                "the task gradients may be degenerate")


@pytest.mark.parametrize("factor", [1e-4, 1e4])
def test_the_stationarity_margin_does_not_depend_on_the_gradients_scale(factor: float) -> None:
    """The margin is computed from the correlation matrix: scaling every gradient by √factor leaves it."""
    from mtlflow.methods.solvers import stationarity_margin

    grads = jacobian(8, 3, 5)
    m = (grads @ grads.T).numpy()
    assert stationarity_margin(m) > 0.01
    assert stationarity_margin(factor * m) == pytest.approx(stationarity_margin(m), rel=1e-9)


def test_fairgrad_counts_every_pareto_stationary_step_and_returns_float64_zeros_for_zero_gradients() -> None:
    method = methods.build("fairgrad", 2)
    stationary = torch.tensor([[1.0, 2.0], [-2.0, -4.0]], dtype=torch.float64)
    for _ in range(2):
        method.combine(stationary, torch.ones(2, dtype=torch.float64))
    assert method.stationary_steps == 2
    weights = method.weights_from_gramian(torch.zeros(2, 2, dtype=torch.float32), torch.ones(2))
    assert weights.dtype == torch.float64 and weights.tolist() == [0.0, 0.0]


def test_fairgrad_all_zero_jacobian_gives_zero_update() -> None:
    d, method = combine("fairgrad", torch.zeros(3, 5, dtype=torch.float64))
    assert d.abs().max() == 0 and method.last_weights.abs().max() == 0


def test_fairgrad_every_accepted_solve_has_a_small_residual() -> None:
    rng = np.random.default_rng(7)
    for trial in range(60):
        k = int(rng.integers(2, 7))
        j = rng.standard_normal((k, 12)) * np.exp(rng.uniform(-3, 3, size=(k, 1)))
        j[1] = -0.5 * j[0] + 10 ** rng.uniform(-6, -1) * rng.standard_normal(12)   # near the front
        alpha = [0.5, 1.0, 2.0][trial % 3]
        _, method = combine("fairgrad", torch.from_numpy(j), alpha=alpha)
        if method.last_residual is None:
            continue
        w, g = method.last_weights.numpy(), j @ j.T
        assert np.max(np.abs(g @ w - w ** (-1 / alpha)) / w ** (-1 / alpha)) <= 1e-4


# -- UPGrad ---------------------------------------------------------------------------------------

def imbalanced_jacobian() -> np.ndarray:
    """Three tasks with gradient norms 0.71, 2.2 and 3e-4: the worst case for the ridge among 3,000
    random draws (P in [3, 20), third norm scaled by 10^U(-4, 0))."""
    rng = np.random.default_rng(0)
    for _ in range(1508):
        p = int(rng.integers(3, 20))
        j = rng.standard_normal((3, p))
        j[2] *= 10 ** rng.uniform(-4, 0)
    return j


def min_cosine(j: np.ndarray, d: np.ndarray) -> float:
    return float(np.min(j @ d / np.linalg.norm(j, axis=1) / np.linalg.norm(d)))


def test_upgrad_never_conflicts_with_a_small_task() -> None:
    j = imbalanced_jacobian()
    assert np.linalg.norm(j, axis=1)[2] < 1e-3 * np.linalg.norm(j, axis=1)[:2].min()
    d, _ = combine("upgrad", torch.from_numpy(j))
    assert min_cosine(j, d.numpy()) >= -1e-9
    np.testing.assert_allclose(d.numpy(), mean_projection_onto_dual_cone(j), rtol=1e-6, atol=1e-9)
    # the trade-off documented in upgrad.py: TorchJD's ridge conflicts with the small task
    ridged, _ = combine("upgrad", torch.from_numpy(j), solver="quadprog")
    assert min_cosine(j, ridged.numpy()) == pytest.approx(-0.964, abs=1e-3)


def test_upgrad_survives_a_duplicate_task() -> None:
    rng = np.random.default_rng(1)
    j = rng.standard_normal((4, 10))
    j[3] = j[0]
    d, _ = combine("upgrad", torch.from_numpy(j))
    np.testing.assert_allclose(d.numpy(), mean_projection_onto_dual_cone(j), rtol=1e-6, atol=1e-9)
    with pytest.raises(SolverError, match="solver=nnls"):
        combine("upgrad", torch.from_numpy(j), solver="quadprog", reg_eps=0.0)


def test_upgrad_gives_a_zero_gradient_task_weight_zero_and_projects_the_others() -> None:
    rng = np.random.default_rng(3)
    j = rng.standard_normal((4, 6))
    j[1] = 0.0                      # a task whose gradient vanishes: it constrains nothing
    j[3] = -1.5 * j[0] + 0.3 * j[2]   # conflicts with the first task
    d, method = combine("upgrad", torch.from_numpy(j))
    assert method.last_weights[1] == 0
    np.testing.assert_allclose(d.numpy(), mean_projection_onto_dual_cone(j), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name,expected", [
    # g1 = (1, 0), g3 = (0, 2) are orthogonal: UPGrad keeps the mean, IMTL-G gives d·u1 = d·u3 (2/3, 1/3)
    ("upgrad", [1 / 3, 0.0, 1 / 3]),
    ("imtlg", [2 / 3, 0.0, 1 / 3]),
])
def test_a_zero_gradient_whose_gramian_diagonal_rounds_negative_gets_weight_zero_silently(
        name: str, expected: list) -> None:
    import warnings

    # a handed-over Gramian (TorchJD's autogram engine) is accepted when its eigenvalues are ≥ -1e-13·λmax,
    # so a zero gradient's diagonal entry may round to a tiny negative number
    gramian = torch.tensor([[1.0, 0.0, 0.0], [0.0, -1e-20, 0.0], [0.0, 0.0, 4.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no "invalid value encountered in sqrt"
        weights = methods.build(name, 3).weights_from_gramian(gramian, torch.ones(3, dtype=torch.float64))
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-12, atol=0)


# -- scale convention -------------------------------------------------------------------------------

def test_loss_weights_summing_to_one_follow_the_mean_scale_rule() -> None:
    losses = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    for name in ("rlw", "famo"):
        method = methods.build(name, 3)
        assert float(method.weights(losses).sum()) == pytest.approx(1.0)
        assert method.natural_scale == "mean"
        assert methods.build(name, 3, scale_convention="reference").natural_scale == "sum"
    dwa = methods.build("dwa", 3)
    assert float(dwa.weights(losses).sum()) == pytest.approx(3.0) and dwa.natural_scale == "sum"
    assert methods.build("mgda", 3, scale_convention="reference").natural_scale == "mean"  # its code: ×K too
    with pytest.raises(InvalidParameterError, match="scale_convention"):
        methods.build("rlw", 3, scale_convention="K")


@pytest.mark.parametrize("name", ["rlw", "famo"])
def test_trainer_applies_the_scale_convention(name: str, tmp_path: Path) -> None:
    data = tmp_path / "toy"
    jobs.prepare("toy", data, start=1, steps_per_epoch=1)
    hparams = {"min_losses": [-2.1, -21.0]} if name == "famo" else {}
    moved = {}
    for convention in ("sum", "reference"):
        jobs.train(data, tmp_path / convention, method=name, epochs=1, lr=1e-3, optimizer="sgd", momentum=0.0,
                   hparams={**hparams, "scale_convention": convention}, progress=False)
        after = torch.load(tmp_path / convention / "model.pt", weights_only=False)["state_dict"]
        moved[convention] = torch.cat([v.reshape(-1).double() for v in after.values()])
    start = torch.tensor([0.0, 0.0], dtype=torch.float64)     # START_POINTS[1]
    # one SGD step: the rule multiplies the reference's Σ w_i ∇L_i by K = 2
    torch.testing.assert_close(moved["sum"] - start, 2 * (moved["reference"] - start), rtol=1e-6, atol=0)


# -- small items ----------------------------------------------------------------------------------

def official_dwa_weights(stream: list[np.ndarray], window: int, temperature: float) -> list[np.ndarray]:
    """The Nash-MTL code's DWA rule, transcribed: FIFO buffer of 2·window losses padded with ones, the
    current loss pushed first, weights recomputed once more than ``window`` steps have run."""
    k = len(stream[0])
    costs, weights, out = np.ones((2 * window, k)), np.ones(k), []
    for step, cost in enumerate(stream):
        costs[:-1], costs[-1] = costs[1:].copy(), cost
        if step > window:
            ratio = costs[window:].mean(0) / costs[:window].mean(0)
            weights = k * np.exp(ratio / temperature) / np.exp(ratio / temperature).sum()
        out.append(weights.copy())
    return out


def test_dwa_iteration_window_matches_the_official_code_once_the_buffer_is_full() -> None:
    window, temperature = 3, 2.0
    rng = np.random.default_rng(3)
    stream = [np.abs(rng.standard_normal(3)) + 0.1 for _ in range(20)]
    dwa = methods.build("dwa", 3, window="iterations", iteration_window=window, temperature=temperature)
    official = official_dwa_weights(stream, window, temperature)
    for step, losses in enumerate(stream):
        dwa.objective(torch.tensor(losses, dtype=torch.float64))
        if step >= 2 * window - 1:      # from here the official buffer holds real losses only
            np.testing.assert_allclose(dwa.last_weights.numpy(), official[step], rtol=1e-12)


def test_nashmtl_max_norm_clips_only_the_shared_parameters(multimnist_small: Path, tmp_path: Path) -> None:
    class Recorder(Callback):
        def __init__(self) -> None:
            self.shared: list[float] = []
            self.heads: list[torch.Tensor] = []

        def before_optimizer_step(self, trainer: Any, state: Any) -> None:
            self.shared.append(float(torch.cat([p.grad.reshape(-1) for p in trainer.shared]).norm()))
            self.heads.append(torch.cat([p.grad.reshape(-1) for ps in trainer.task_params for p in ps]).clone())

    runs = {}
    for max_norm in (0.0, 1e-3):
        recorder = Recorder()
        jobs.train(multimnist_small, tmp_path / str(max_norm), method="nashmtl", epochs=1, batch_size=32,
                   max_steps_per_epoch=1, hparams={"max_norm": max_norm}, callbacks=[recorder], progress=False)
        runs[max_norm] = recorder
    assert runs[0.0].shared[0] > 1e-3
    assert runs[1e-3].shared[0] == pytest.approx(1e-3, rel=1e-5)
    torch.testing.assert_close(runs[1e-3].heads[0], runs[0.0].heads[0], rtol=0, atol=0)   # heads untouched


@pytest.mark.parametrize("name,hparams,fragment", [
    ("dbmtl", {"beta": 1.0}, "beta"),
    ("famo", {"min_losses": [True, False]}, "min_losses"),
])
def test_degenerate_hyper_parameters_are_rejected(name: str, hparams: dict, fragment: str) -> None:
    with pytest.raises(InvalidParameterError, match=fragment):
        methods.build(name, 2, **hparams)


def test_moco_weights_do_not_depend_on_the_gradient_scale() -> None:
    from scipy.optimize import minimize

    gen = torch.Generator().manual_seed(0)
    unit = torch.randn(3, 20, generator=gen, dtype=torch.float64)
    unit = unit / unit.norm(dim=1, keepdim=True)
    g = (unit @ unit.T).numpy()
    constraint = {"type": "eq", "fun": lambda w: w.sum() - 1}
    mgda = minimize(lambda w: w @ g @ w, np.full(3, 1 / 3), jac=lambda w: 2 * g @ w, bounds=[(0, 1)] * 3,
                    constraints=[constraint], method="SLSQP", options={"ftol": 1e-15}).x
    trajectories = {}
    for norm in (0.1, 1.0, 10.0):
        method = methods.build("moco", 3)
        lambdas = []
        for _ in range(2000):
            method.combine(norm * unit, torch.ones(3, dtype=torch.float64))
            lambdas.append(method.last_weights.clone())
        trajectories[norm] = torch.stack(lambdas)
        np.testing.assert_allclose(method.last_weights.numpy(), mgda, atol=1e-4)
    torch.testing.assert_close(trajectories[0.1], trajectories[10.0], rtol=0, atol=1e-12)


def test_method_state_is_a_detached_float64_cpu_copy_whatever_it_was_given() -> None:
    from mtlflow.core.numerics import cpu_float64

    source = torch.tensor([0.5, 1.25], dtype=torch.float32, requires_grad=True)
    copy = cpu_float64(source)
    assert copy.dtype == torch.float64 and copy.device.type == "cpu" and not copy.requires_grad
    assert copy.tolist() == [0.5, 1.25]
    already = torch.tensor([2.0, 3.0], dtype=torch.float64)
    assert cpu_float64(already).data_ptr() != already.data_ptr()   # a copy even when nothing needs converting
    # through a method: a checkpoint written in float32 restores as float64 state that the checkpoint no longer aliases
    dwa = methods.build("dwa", 2)
    saved = {key: (value.float() if isinstance(value, torch.Tensor) else
                   [v.float() for v in value] if isinstance(value, list) else value)
             for key, value in methods.build("dwa", 2).state_dict().items()}
    saved["epoch_sum"] = torch.tensor([1.0, 2.0])
    dwa.load_state_dict(saved)
    saved["epoch_sum"].add_(10.0)
    restored = dwa.state_dict()["epoch_sum"]
    assert restored.dtype == torch.float64 and restored.tolist() == [1.0, 2.0]


def test_a_gramian_near_the_top_of_the_float64_range_stays_finite() -> None:
    """Symmetrising must not overflow: entries of 1.5e308 (finite) are not turned into Inf, then NaN."""
    from mtlflow.core.numerics import gramian_array

    m = np.array([[1.5e308, 1.0e308], [1.0e308, 1.5e308]])
    np.testing.assert_array_equal(gramian_array(m, "test"), m)


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 1e-2), (torch.float32, 1e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("name", ["mgda", "upgrad", "imtlg"])
def test_a_gramian_methods_direction_is_the_weighted_gradient_sum_in_the_gradients_dtype(
        name: str, dtype: torch.dtype, tolerance: float) -> None:
    # the K x K solve runs in float64, but the update the optimizer applies keeps the gradients' dtype
    j = near_duplicates(0, 4, 300, 0.5, dtype)
    d, method = combine(name, j)
    assert d.dtype == dtype and d.shape == (300,)
    exact = method.last_weights.double() @ j.double()
    torch.testing.assert_close(d.double(), exact, rtol=tolerance, atol=tolerance * float(exact.abs().max()))


def test_gramian_accumulated_over_column_blocks_is_the_full_product(monkeypatch) -> None:
    # J is centred and multiplied a block of columns at a time (GRAMIAN_BLOCK entries, each block with its own
    # mean); every block counts, and the near-duplicates' differences stay exact to float32 across blocks
    from mtlflow.core import numerics

    j = near_duplicates(2, 3, 50, 1e-4, torch.float32)
    monkeypatch.setattr(numerics, "GRAMIAN_BLOCK", 4 * 8)  # 8 columns a block: 7 blocks, the last one short
    g, exact = numerics.gramian_float64(j).numpy(), exact_gramian(j)
    np.testing.assert_allclose(g, exact, rtol=1e-6)
    assert_differences_close(g, exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_gramian_tensor_in_the_training_dtype_becomes_a_float64_array(dtype: torch.dtype) -> None:
    # TorchJD's autogram hands the Gramian over in the model's dtype, possibly still attached to the graph
    from mtlflow.core.numerics import gramian_array

    g = torch.tensor([[4.0, 1.0], [1.0, 2.0]], dtype=dtype, requires_grad=True)
    m = gramian_array(g * 1, "mgda")
    assert m.dtype == np.float64
    np.testing.assert_array_equal(m, [[4.0, 1.0], [1.0, 2.0]])


def test_the_min_norm_solver_names_itself_when_the_gramian_is_not_finite() -> None:
    from mtlflow.methods.solvers import min_norm_weights_qp

    with pytest.raises(NonFiniteValueError) as error:
        min_norm_weights_qp(torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]], dtype=torch.float64))
    assert str(error.value) == ("min-norm solver: the task-gradient Gramian contains NaN or Inf; "
                                "check the losses and lower --lr")


@pytest.mark.parametrize("scale", [1.0, 1e-8])
def test_a_gramian_with_a_negative_eigenvalue_becomes_its_nearest_psd_matrix_at_any_scale(scale: float) -> None:
    # G = Q diag(2, -1e-6) Qᵀ (Q a rotation by 30°): its Frobenius-nearest PSD matrix is Q diag(2, 0) Qᵀ; the
    # tolerance is relative to λmax, so the same matrix scaled to 1e-8 is clipped the same way
    from mtlflow.core.numerics import gramian_array

    c, s = math.cos(math.pi / 6), math.sin(math.pi / 6)
    q = np.array([[c, -s], [s, c]])
    g = scale * q @ np.diag([2.0, -1e-6]) @ q.T
    expected = scale * q @ np.diag([2.0, 0.0]) @ q.T
    np.testing.assert_allclose(gramian_array(g, "mgda"), expected, rtol=1e-12, atol=1e-15 * scale)
    # a PSD Gramian handed over as a float32 array comes back as it is, in float64
    psd = np.array([[4.0, 1.0], [1.0, 2.0]], dtype=np.float32)
    m = gramian_array(psd, "mgda")
    assert m.dtype == np.float64 and np.array_equal(m, psd)
