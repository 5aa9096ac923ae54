"""IMTL-G's edge cases and refusals (``mtlflow.methods.imtlg.imtlg_weights``), each on a Gramian built to reach it.

* The pseudo-inverse cut-off: an eigenvalue exactly at K·ε₆₄·λmax is dropped, as ``torch.linalg.pinv``'s
  default does in TorchJD's IMTL-G (singular values ≤ rtol·σmax are zeroed); unlike TorchJD, the pseudo-inverse
  answer is then checked and, failing the equal projections, replaced by the least-norm null-space solution.
* The Σα ≈ 0 test is relative: scaling the Gramian by 1e±30 changes neither the weights nor a refusal.
* Σ G⁺√diag(G) = 0 with a null space: the null-space solution (d = 0); without one (full rank): the refusal
  "no combination ... the Gramian is degenerate", on an integer Gramian where the sum is exactly 0.
* The post-solve check on a full-rank but badly conditioned Gramian: the refusal "the projections d·u_i of
  the solve differ by ... too ill-conditioned", with ‖d‖ from the closed form.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from mtlflow import methods
from mtlflow.core.errors import SolverError
from mtlflow.methods.imtlg import PROJECTION_TOL

DEGENERATE = ("imtlg: no combination of the task gradients with Σα = 1 has equal projections on the unit "
              "gradients; the Gramian is degenerate")

# Found by an exhaustive search over integer Gramians [[n1², a, b], [a, n2², c], [b, c, n3²]] (|a|, |b|, |c| ≤ 9,
# n = √diag integer) for 1ᵀ adj(G) n = 0 with G positive definite. By hand: leading minors 1, 3, det G = 6 and
# adj(G) = [[35, -11, -9], [-11, 5, 3], [-9, 3, 3]], so G⁻¹ √diag(G) = G⁻¹ (1, 2, 3) = (-7/3, 4/3, 1): it sums to
# exactly 0 and G has no null space, so no α with Σα = 1 gives equal projections d·u_i.
FULL_RANK_ZERO_SUM = np.array([[1.0, 1.0, 2.0], [1.0, 4.0, -1.0], [2.0, -1.0, 9.0]])


def imtlg(gramian: np.ndarray) -> np.ndarray:
    k = gramian.shape[0]
    weights = methods.build("imtlg", k).weights_from_gramian(torch.from_numpy(gramian), torch.ones(k))
    return weights.numpy()


def test_imtlg_drops_an_eigenvalue_exactly_at_the_cutoff_like_torchjds_pinv_then_checks_the_answer() -> None:
    """G = diag(1, 2ε): the second eigenvalue equals the cut-off K·ε·λmax = 2ε exactly (eigh is exact on a
    diagonal matrix) and counts as zero, as in TorchJD's pinv, so G⁺√diag(G) = (1, 0). That α = (1, 0) is what
    TorchJD returns, but it is no solution: d = g1 has projections (1, 0) on u1, u2. √diag(G) = (1, √(2ε)) has a
    component along the dropped direction e2, so c = 0 and the least-norm null vector with Σα = 1 is exactly
    α = (0, 1) (d = g2, ‖d‖ = √(2ε) ≈ 2.1e-8: zero at the cut-off's precision). Keeping the eigenvalue would give
    the orthogonal-gradient answer α ∝ (1/1, 1/√(2ε)), i.e. α ≈ (2.1e-8, 1), not exactly (0, 1)."""
    from torchjd.aggregation._imtl_g import IMTLGWeighting

    eps = np.finfo(np.float64).eps
    gramian = np.diag([1.0, 2 * eps])
    assert imtlg(gramian).tolist() == [0.0, 1.0]
    # TorchJD: torch.linalg.pinv with its default rtol = max(K, K)·ε zeroes σ ≤ rtol·σmax, and stops there
    assert IMTLGWeighting()(torch.from_numpy(gramian)).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_imtlg_weights_do_not_depend_on_the_gramians_scale(scale: float) -> None:
    """g1 = (1, 0), g2 = (0, 2) (hand-computed: d·u1 = d·u2 gives α = (2/3, 1/3)); G·c is the Gramian of
    √c·g, whose IMTL-G weights are the same, also where G⁺√diag(G) sums to ~1e-15 or ~1e15."""
    np.testing.assert_allclose(imtlg(scale * np.diag([1.0, 4.0])), [2 / 3, 1 / 3], rtol=1e-14)


def test_imtlg_exactly_opposite_unit_gradients_get_the_null_space_weights() -> None:
    """g2 = -g1 = (-1, 0): Σα = 1 and d·u1 = d·u2 = -d·u1 force d = 0, α = (1/2, 1/2). Here G⁺√diag(G) is
    exactly 0 (its one kept eigenvector (1, -1)/√2 is orthogonal to √diag(G) = (1, 1)): a sum of 0 is the
    Σα ≈ 0 case, not a division by it."""
    alpha = imtlg(np.array([[1.0, -1.0], [-1.0, 1.0]]))
    np.testing.assert_allclose(alpha, [0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(alpha @ np.array([[1.0, 0.0], [-1.0, 0.0]]), [0.0, 0.0], atol=1e-15)


@pytest.mark.parametrize("scale", [1.0, 1e-12, 1e12])
def test_imtlg_refuses_a_full_rank_gramian_whose_equal_projection_solution_sums_to_zero(scale: float) -> None:
    with pytest.raises(SolverError) as raised:
        imtlg(scale * FULL_RANK_ZERO_SUM)
    assert str(raised.value) == DEGENERATE


def test_imtlg_refuses_a_solve_whose_projections_are_not_equal_on_an_ill_conditioned_gramian() -> None:
    """Found by a search over G = D C D, D = diag of norms in {1, 1e-2, ..., 1e-7}, C a correlation matrix with
    entries in {0, ±0.5, ±0.9, ±0.99}, for the largest equal-projection residual of the solve: g1, g3 with norms 1
    and b = 1e-6 and correlation ρ = -0.99, g2 a unit vector orthogonal to both. G is positive definite
    (λmin ≈ 2e-14 > 3ε·λmax), but the solve's projections d·u_i differ by ~4e-4·‖d‖ (> 1e-6·‖d‖).

    ‖d‖ by hand: the {1, 3} block gives G⁻¹√diag(G) = (1/(1+ρ), 1/(b(1+ρ))) = (100, 1e8), task 2 gives 1, so
    v = (100, 1, 1e8), Σv = 1e8 + 101, vᵀ√diag(G) = 100 + 1 + 100 = 201 and ‖d‖ = √(vᵀGv)/Σv = √201/(1e8 + 101).
    The residual itself is rounding noise: the message must show it (3 digits) above PROJECTION_TOL·‖d‖."""
    b, rho = 1e-6, -0.99
    gramian = np.array([[1.0, 0.0, -9.9e-7], [0.0, 1.0, 0.0], [-9.9e-7, 0.0, 1e-12]])
    norm_d = np.sqrt(201) / (1e8 + 101)
    assert norm_d == pytest.approx(np.sqrt(2 / (1 + rho) + 1) / ((1 + 1 / b) / (1 + rho) + 1), rel=1e-12)
    with pytest.raises(SolverError) as raised:
        imtlg(gramian)
    message = str(raised.value)
    match = re.fullmatch(r"imtlg: the projections d·u_i of the solve differ by (\S+) \(‖d‖ = 1\.42e-07\); "
                         r"the Gramian is too ill-conditioned", message)
    assert f"{norm_d:.3g}" == "1.42e-07"
    assert match is not None, message
    spread = float(match.group(1))
    assert match.group(1) == f"{spread:.3g}"
    # refused although the residual is far below 1e-6 in absolute terms: the check is relative to ‖d‖
    assert PROJECTION_TOL * norm_d < spread < 0.1 * norm_d and spread < PROJECTION_TOL
