"""Gradient methods that are not Gramian weightings, each against its paper's defining property: DB-MTL
(max-norm balancing, EMA, loss-scale invariance), GradDrop (sign selection per coordinate, = TorchJD), MoCo
(convergence to the min-norm weights, the authors' variants), ExcessMTL (hand-computed updates, = TorchJD);
then the family's contract (`method_contracts.GradientContract`) for every one of them and IMTL.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from method_contracts import GradientContract
from method_helpers import FULL_RANK, RANK_DEFICIENT, fake_trainer, jacobian, positive_losses, roundtrip, small_model
from torchjd import aggregation as torchjd_aggregation

from mtlflow import methods
from mtlflow.core.errors import InvalidParameterError, NonFiniteValueError
from mtlflow.methods.dbmtl import max_norm_balance
from mtlflow.methods.graddrop import graddrop_direction, sign_purity
from mtlflow.methods.moco import project_to_simplex
from mtlflow.methods.solvers import min_norm_weights_qp

# -- DB-MTL ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_dbmtl_balances_every_task_to_the_largest_norm(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p) * torch.logspace(-2, 2, k, dtype=torch.float64)[:, None]
    direction, alpha = max_norm_balance(grads)
    contributions = alpha[:, None] * grads
    largest = grads.norm(dim=1).max()
    torch.testing.assert_close(contributions.norm(dim=1), torch.full((k,), float(largest), dtype=torch.float64))
    torch.testing.assert_close(direction, contributions.sum(dim=0))


def test_dbmtl_a_zero_ema_row_gets_weight_zero_and_the_others_the_largest_norm() -> None:
    # norms 5, 0, 1: α = (5/5, 0, 5/1), d = 1·(3, 4) + 5·(1, 0)
    direction, alpha = max_norm_balance(torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(alpha, torch.tensor([1.0, 0.0, 5.0], dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(direction, torch.tensor([8.0, 4.0], dtype=torch.float64), rtol=0, atol=0)


def test_dbmtl_ema_of_log_loss_gradients_and_scale_invariance() -> None:
    k, p = 3, 12
    grads, losses = jacobian(0, k, p), positive_losses(0, k)
    beta = 0.9
    db = methods.build("dbmtl", k, beta=beta)
    for t in range(1, 6):
        direction = db.combine(grads, losses)
        torch.testing.assert_close(db.ema_grads, (1 - beta**t) * grads / losses[:, None])
    # constant input: the EMA keeps the direction of ∇ log L, so d equals the max-norm balance of it
    torch.testing.assert_close(direction, max_norm_balance(grads / losses[:, None])[0] * (1 - beta**5))
    # multiplying a task's loss by c multiplies its gradient by c: log makes the update invariant
    scales = torch.tensor([10.0, 0.01, 3.0], dtype=torch.float64)
    a, b = methods.build("dbmtl", k), methods.build("dbmtl", k)
    for seed in range(4):
        g, l = jacobian(seed, k, p), positive_losses(seed, k)
        torch.testing.assert_close(a.combine(g, l), b.combine(g * scales[:, None], l * scales))
    # beta_sigma decays the EMA factor as β / t^σ: at t = 1 the factor is β
    db2 = methods.build("dbmtl", k, beta=0.5, beta_sigma=1.0)
    db2.combine(grads, losses)
    db2.combine(2 * grads, losses)               # factor 0.5 / 2 = 0.25
    torch.testing.assert_close(db2.ema_grads, (0.25 * 0.5 + 0.75 * 2) * grads / losses[:, None])


def test_dbmtl_logs_the_balancing_weights_and_refuses_gradients_of_another_shape() -> None:
    db = methods.build("dbmtl", 2, beta=0.5, beta_sigma=0.0)
    grads, losses = jacobian(5, 2, 4), torch.tensor([2.0, 0.5], dtype=torch.float64)
    direction = db.combine(grads, losses)
    ema = 0.5 * grads / losses[:, None]                         # (1 - β) log-gradient after one step
    norms = ema.norm(dim=1)
    torch.testing.assert_close(db.last_weights, norms.max() / norms)
    torch.testing.assert_close(direction, db.last_weights @ ema)
    with pytest.raises(InvalidParameterError) as error:
        db.combine(jacobian(6, 2, 5), losses)
    assert str(error.value) == ("dbmtl keeps an EMA of per-task gradients of shape (2, 4) but got (2, 5); use "
                                "gradients w.r.t. the shared parameters (grad_wrt=parameters)")


def test_dbmtl_refuses_representation_gradients_in_one_line() -> None:
    trainer = fake_trainer(small_model(2))
    trainer.config.grad_wrt = "representation"
    with pytest.raises(InvalidParameterError) as error:
        methods.build("dbmtl", 2).setup(trainer)
    assert str(error.value) == ("dbmtl keeps an EMA of per-task gradients of the shared parameters; per-sample "
                                "representation gradients change with every batch: use grad_wrt=parameters")
    trainer.config.grad_wrt = "parameters"
    methods.build("dbmtl", 2).setup(trainer)


def test_dbmtl_scales_head_gradients_and_roundtrips() -> None:
    model = small_model(2)
    db = methods.build("dbmtl", 2)
    db.setup(fake_trainer(model))
    for i in range(2):
        for prm in model.task_parameters(i):
            prm.grad = torch.ones_like(prm)
    losses = torch.tensor([0.5, 4.0], dtype=torch.float64)
    grads = jacobian(1, 2, 9)
    db.combine(grads, losses)
    for i in range(2):
        for prm in model.task_parameters(i):
            torch.testing.assert_close(prm.grad, torch.full_like(prm, 1 / float(losses[i])))
    clone = roundtrip(db)
    torch.testing.assert_close(clone.combine(grads, losses), db.combine(grads, losses))


# -- GradDrop -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,k,p", FULL_RANK)
def test_graddrop_keeps_one_sign_per_coordinate(seed: int, k: int, p: int) -> None:
    grads = jacobian(seed, k, p)
    grads[:, 0] = grads[:, 0].abs()           # a coordinate where every task agrees (+)
    grads[:, 1] = -grads[:, 1].abs()          # ... and (-)
    uniform = torch.rand(p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out = graddrop_direction(grads, uniform)
    purity = sign_purity(grads)
    positive = grads.clamp(min=0).sum(dim=0)
    negative = grads.clamp(max=0).sum(dim=0)
    for c in range(p):
        chosen = positive[c] if purity[c] > uniform[c] else negative[c]   # P > U: the + sign
        assert float(out[c]) == pytest.approx(float(chosen), abs=1e-12)
    torch.testing.assert_close(out[:2], grads[:, :2].sum(dim=0))        # full agreement passes whole
    torch.testing.assert_close(graddrop_direction(grads, uniform, leak=1.0), grads.sum(dim=0))
    half = graddrop_direction(grads, uniform, leak=0.5)
    torch.testing.assert_close(half, 0.5 * grads.sum(dim=0) + 0.5 * out)
    # the method passes its leak on: with leak 1 nothing is dropped, whatever its own draws
    torch.testing.assert_close(methods.build("graddrop", k, leak=1.0).combine(grads, positive_losses(seed, k)),
                               grads.sum(dim=0))


def test_graddrop_picks_the_positive_sign_with_probability_p() -> None:
    grads = torch.tensor([[3.0, -1.0, 0.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    purity = sign_purity(grads)
    torch.testing.assert_close(purity, torch.tensor([0.75, 0.0, 0.5], dtype=torch.float64))
    gd = methods.build("graddrop", 2)
    outs = torch.stack([gd.combine(grads, torch.ones(2)) for _ in range(4000)])
    assert float((outs[:, 0] == 3.0).double().mean()) == pytest.approx(0.75, abs=0.03)
    assert set(outs[:, 0].tolist()) == {3.0, -1.0}
    assert torch.all(outs[:, 1] == -2.0) and torch.all(outs[:, 2] == 0.0)


@pytest.mark.parametrize("seed,k,p", FULL_RANK + RANK_DEFICIENT)
@pytest.mark.parametrize("leak", [0.0, 0.3])
def test_graddrop_matches_torchjd_with_the_same_thresholds(seed: int, k: int, p: int, leak: float) -> None:
    grads = jacobian(seed, k, p)
    torch.manual_seed(seed)
    uniform = torch.rand(p, dtype=grads.dtype)          # TorchJD draws U this way
    torch.manual_seed(seed)
    expected = torchjd_aggregation.GradDrop(leak=torch.full((k,), leak, dtype=grads.dtype))(grads)
    torch.testing.assert_close(graddrop_direction(grads, uniform, leak), expected)


def test_graddrop_drops_both_signs_where_the_purity_equals_the_threshold() -> None:
    # P = ½(1 + Σg/Σ|g|): ½ for (1, -1), ¾ for (3, -1); the paper keeps + where P > U, − where P < U, so at
    # P = U (a float32 draw ties with probability ~2⁻²⁴ per coordinate) neither sign passes
    grads = torch.tensor([[1.0, 3.0, 3.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    uniform = torch.tensor([0.5, 0.75, 0.5], dtype=torch.float64)
    torch.testing.assert_close(sign_purity(grads), torch.tensor([0.5, 0.75, 0.75], dtype=torch.float64))
    out = graddrop_direction(grads, uniform)
    assert out.tolist() == [0.0, 0.0, 3.0]     # ties: nothing; P = ¾ > U = ½: the + sign only


def test_graddrop_leak_mixes_in_the_dropped_gradients_in_their_dtype() -> None:
    grads = torch.tensor([[0.7, -1.3], [-0.2, 0.9]], dtype=torch.float64)
    uniform = torch.tensor([0.1, 0.9], dtype=torch.float64)   # P = (0.5 + 0.5·0.5/0.9, 0.5 − 0.5·0.4/2.2)
    # coordinate 0: P > U keeps the + entry; coordinate 1: P < U keeps the − entry; the rest leaks in at 0.3
    expected = torch.tensor([0.7 + 0.3 * -0.2, -1.3 + 0.3 * 0.9], dtype=torch.float64)
    torch.testing.assert_close(graddrop_direction(grads, uniform, leak=0.3), expected, rtol=1e-15, atol=0)


def test_graddrop_makes_no_temporary_of_the_jacobians_size_and_no_gramian(monkeypatch) -> None:
    """Issue 29: GradDrop's fresh [K, P] temporaries (and a Gramian it does not need) made its update a third
    of the training step at K = 40. Every tensor operation is watched: nothing it makes reaches K·P entries
    or is K x K, and the direction is still Σ over the kept sign, computed independently in float64."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    from mtlflow.methods import graddrop

    class Watch(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.shapes += [tuple(x.shape) for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
            return out

    k, p = 5, 4000
    monkeypatch.setattr(graddrop, "BLOCK", k * 500)            # 500 columns a block: 8 blocks
    grads = jacobian(4, k, p).float()
    uniform = torch.rand(p, generator=torch.Generator().manual_seed(4))
    watch = Watch()
    with watch:
        out = graddrop_direction(grads, uniform, leak=0.25)
    assert max(int(np.prod(s)) for s in watch.shapes) < k * p and (k, k) not in watch.shapes
    g = grads.double()
    positive, negative = g.clamp(min=0).sum(dim=0), g.clamp(max=0).sum(dim=0)
    purity = 0.5 * (1 + (positive + negative) / (positive - negative))
    kept = torch.where(purity > uniform, positive, negative)
    expected = kept + 0.25 * (positive + negative - kept)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_graddrop_generator_roundtrip() -> None:
    grads = jacobian(0, 3, 50)
    gd = methods.build("graddrop", 3, 5)
    gd.combine(grads, torch.ones(3))
    clone = roundtrip(gd)
    torch.testing.assert_close(clone.combine(grads, torch.ones(3)), gd.combine(grads, torch.ones(3)))


# -- MoCo ----------------------------------------------------------------------------------------

def test_moco_tracks_constant_gradients_with_decaying_steps() -> None:
    j = jacobian(60, 3, 5)
    method = methods.build("moco", 3, beta=0.5, beta_sigma=0.5)
    remaining = 1.0
    for step in range(1, 6):
        method.combine(j, torch.ones(3, dtype=torch.float64))
        remaining *= 1 - 0.5 / step ** 0.5
        # y = (1 − Π_k (1 − β_k)) h from y = 0
        torch.testing.assert_close(method.tracked, (1 - remaining) * j, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_moco_converges_to_the_min_norm_weights_on_a_fixed_jacobian(rho: float) -> None:
    j = jacobian(61, 3, 10)
    j = j / j.norm(dim=1, keepdim=True)   # unit gradients: γ_k ‖YYᵀ‖ < 2
    method = methods.build("moco", 3, gamma=0.5, gamma_sigma=0.0, rho=rho)
    for _ in range(3000):
        d = method.combine(j, torch.ones(3, dtype=torch.float64))
    expected = min_norm_weights_qp(j @ j.T + rho * torch.eye(3, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(method.last_weights.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(d.numpy(), expected @ j.numpy(), atol=1e-6)


def test_moco_simplex_projection_is_the_euclidean_projection() -> None:
    import quadprog

    gen = torch.Generator().manual_seed(62)
    for _ in range(20):
        v = torch.randn(5, generator=gen, dtype=torch.float64) * 2
        # min ½‖x − v‖² s.t. Σx = 1, x ≥ 0
        constraints = np.concatenate([np.ones((5, 1)), np.eye(5)], axis=1)
        reference = quadprog.solve_qp(np.eye(5), v.numpy(), constraints, np.r_[1.0, np.zeros(5)], meq=1)[0]
        np.testing.assert_allclose(project_to_simplex(v).numpy(), np.clip(reference, 0, None), atol=1e-10)


def test_moco_authors_code_variants_first_step() -> None:
    j = jacobian(63, 2, 4)
    losses = torch.tensor([0.7, 2.0], dtype=torch.float64)
    method = methods.build("moco", 2, lambda_update="softmax", normalize_grads=True, step_scale="none")
    d = method.combine(j, losses)
    h = j / (j.norm(dim=1, keepdim=True) + 1e-8) * losses[:, None]
    y = 0.5 * h                                          # β_1 = 0.5 from y = 0
    start = torch.full((2,), 0.5, dtype=torch.float64)
    lam = torch.softmax(start - 0.1 * (y @ y.T) @ start, dim=0)     # γ_1 = 0.1, ρ = 0
    torch.testing.assert_close(method.last_weights, lam)
    torch.testing.assert_close(d, lam @ y)


def test_moco_normalizes_small_gradients_by_their_norm_plus_1e_8() -> None:
    # the authors' h_i = g_i / (‖g_i‖ + 1e-8) · L_i: a gradient of norm 2e-8 becomes 2/3 of a unit one
    grads = torch.tensor([[2e-8, 0.0], [0.0, 3.0]], dtype=torch.float64)
    losses = torch.tensor([1.5, 2.0], dtype=torch.float64)
    method = methods.build("moco", 2, lambda_update="softmax", normalize_grads=True, step_scale="none")
    method.combine(grads, losses)
    h = torch.tensor([[2 / 3 * 1.5, 0.0], [0.0, 3 / (3 + 1e-8) * 2.0]], dtype=torch.float64)
    torch.testing.assert_close(method.tracked, 0.5 * h, rtol=1e-12, atol=0)   # β_1 = ½ from y = 0


def test_moco_weight_step_with_rho_is_the_float64_formula() -> None:
    j = jacobian(64, 2, 4)
    method = methods.build("moco", 2, rho=0.1)
    d = method.combine(j, torch.ones(2, dtype=torch.float64))
    y = 0.5 * j                                           # β_1 = ½ from y = 0
    gram = y @ y.T + 0.1 * torch.eye(2, dtype=torch.float64)
    gamma = 0.1 / (float(torch.trace(gram)) / 2)          # γ_1 / (trace(YYᵀ + ρI) / K)
    moved = torch.full((2,), 0.5, dtype=torch.float64) - gamma * gram @ torch.full((2,), 0.5, dtype=torch.float64)
    lam = moved + (1 - moved.sum()) / 2                   # the projection onto Δ while both stay positive
    assert bool((lam > 0).all())
    torch.testing.assert_close(method.last_weights, lam, rtol=1e-12, atol=0)
    torch.testing.assert_close(d, lam @ y, rtol=1e-12, atol=0)


def test_moco_keeps_its_weights_on_an_all_zero_jacobian_with_the_trace_step() -> None:
    # trace(YYᵀ) = 0: no gradient information and no scale to divide γ by, λ stays where it is
    method = methods.build("moco", 2, step_scale="trace", rho=0.0)
    d = method.combine(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    assert method.last_weights.tolist() == [0.5, 0.5]
    assert d.tolist() == [0.0, 0.0, 0.0]


def test_moco_refuses_non_finite_gradients_in_one_line() -> None:
    grads = torch.tensor([[1.0, float("nan")], [0.5, 2.0]], dtype=torch.float64)
    with pytest.raises(NonFiniteValueError) as error:
        methods.build("moco", 2).combine(grads, torch.ones(2, dtype=torch.float64))
    assert str(error.value) == "moco: the tracked gradients contain NaN or Inf; check the losses and --lr"


# -- ExcessMTL -----------------------------------------------------------------------------------

def test_excessmtl_hand_computed_first_two_steps() -> None:
    g1 = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, -1.0]], dtype=torch.float64)
    g2 = torch.tensor([[0.1, 0.2, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    method = methods.build("excessmtl", 2, robust_step_size=0.5)
    d1 = method.combine(g1, torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, torch.tensor([0.5, 0.5], dtype=torch.float64))  # baseline only
    torch.testing.assert_close(d1, g1.mean(dim=0))
    s = g1 ** 2
    e1 = (g1 ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1)
    s = s + g2 ** 2
    e2 = (g2 ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1)
    w = torch.softmax(0.5 * e2 / e1, dim=0)
    method.combine(g2, torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, w, rtol=1e-12, atol=1e-12)


def test_excessmtl_shifts_weight_to_the_task_far_from_convergence() -> None:
    method = methods.build("excessmtl", 2, robust_step_size=0.1)
    base = jacobian(70, 2, 20)
    for step in range(40):
        # task 0 keeps a large gradient; task 1 converges (its gradient shrinks geometrically)
        grads = torch.stack([base[0], base[1] * 0.8 ** step])
        method.combine(grads, torch.ones(2, dtype=torch.float64))
    w = method.last_weights
    assert float(w[0]) > 0.6 and float(w.sum()) == pytest.approx(1.0)


def test_excessmtl_matches_torchjd_with_one_warmup_step() -> None:
    from torchjd.aggregation import ExcessMTLWeighting

    # TorchJD with n_warmup_steps = 1 = the official code: the first step only sets the baseline
    reference = ExcessMTLWeighting(robust_step_size=0.05, n_warmup_steps=1)
    method = methods.build("excessmtl", 3, robust_step_size=0.05)
    for step in range(8):
        grads = jacobian(80 + step, 3, 12, scale=1.0 / (step + 1))
        method.combine(grads, torch.ones(3, dtype=torch.float64))
        torch.testing.assert_close(method.last_weights, reference(grads), rtol=1e-6, atol=1e-9)


def _excessmtl_weights_after_two_warmup_steps(grads: list[torch.Tensor]) -> torch.Tensor:
    """Excess-MTL's weights at the third step, by hand: AdaGrad-scaled excess-risk estimates
    Σ_j g_ij² / √(Σ_steps g_ij² + 1e-7), the baseline their mean over the two warm-up steps, softmax of the ratio."""
    s = torch.zeros_like(grads[0])
    estimates = []
    for g in grads:
        s = s + g ** 2
        estimates.append((g ** 2 / torch.sqrt(s + 1e-7)).sum(dim=1))
    baseline = (estimates[0] + estimates[1]) / 2
    return torch.softmax(estimates[2] / baseline, dim=0)


def test_excessmtl_warmup_epochs_average_the_baseline() -> None:
    method = methods.build("excessmtl", 2, warmup_epochs=1, robust_step_size=1.0)
    grads = [jacobian(90 + i, 2, 6) for i in range(3)]
    for g in grads[:2]:
        method.combine(g, torch.ones(2, dtype=torch.float64))
        torch.testing.assert_close(method.last_weights, torch.full((2,), 0.5, dtype=torch.float64))
    method.on_epoch_end(1)
    method.combine(grads[2], torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, _excessmtl_weights_after_two_warmup_steps(grads))


def test_excessmtl_warmup_lasts_warmup_epochs_epochs() -> None:
    method = methods.build("excessmtl", 2, warmup_epochs=2, robust_step_size=1.0)
    grads = [jacobian(95 + i, 2, 6) for i in range(3)]
    for epoch, g in enumerate(grads[:2]):     # one step per epoch: both epochs are warm-up
        method.combine(g, torch.ones(2, dtype=torch.float64))
        torch.testing.assert_close(method.last_weights, torch.full((2,), 0.5, dtype=torch.float64))
        method.on_epoch_end(epoch)
    assert method.state_dict()["epochs_done"] == 2
    method.combine(grads[2], torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(method.last_weights, _excessmtl_weights_after_two_warmup_steps(grads))


@pytest.mark.parametrize("warmup_epochs,zero_task_first", [(0, False), (1, False), (0, True), (1, True)])
def test_excessmtl_baseline_is_the_first_estimate_that_is_positive_for_every_task(warmup_epochs: int,
                                                                                  zero_task_first: bool) -> None:
    """Small gradients (estimates below 1). The baseline is the warm-up's mean estimate (one warm-up step here),
    or without warm-up the first step's; when a task's estimate is 0 there (its gradient was zero) the baseline
    waits for the next step whose estimates are all positive, and that step only sets it."""
    grads = [0.1 * jacobian(110 + i, 2, 6) for i in range(3)]
    if zero_task_first:
        grads[0][1] = 0.0
    squares, estimates = torch.zeros_like(grads[0]), []
    for g in grads:
        squares = squares + g ** 2
        estimates.append((g ** 2 / torch.sqrt(squares + 1e-7)).sum(dim=1))
    assert float(torch.cat(estimates).max()) < 1.0
    method = methods.build("excessmtl", 2, warmup_epochs=warmup_epochs, robust_step_size=0.5)
    uniform = torch.full((2,), 0.5, dtype=torch.float64)
    weights = []
    for step, g in enumerate(grads):
        method.combine(g, torch.ones(2, dtype=torch.float64))
        weights.append(method.last_weights)
        if step == 0:
            method.on_epoch_end(1)
    torch.testing.assert_close(weights[0], uniform)
    if zero_task_first:  # the baseline is the second step's estimate, which updates nothing
        torch.testing.assert_close(weights[1], uniform)
        torch.testing.assert_close(weights[2], torch.softmax(0.5 * estimates[2] / estimates[1], dim=0))
    else:                # the baseline is the first step's estimate
        torch.testing.assert_close(weights[1], torch.softmax(0.5 * estimates[1] / estimates[0], dim=0))


# -- the family contract -----------------------------------------------------------------------------


# -- IMTL -------------------------------------------------------------------------------------------

def test_imtl_refuses_non_finite_gradients_in_one_line_naming_itself() -> None:
    grads = torch.tensor([[1.0, float("nan")], [0.5, 2.0]], dtype=torch.float64)
    with pytest.raises(NonFiniteValueError) as error:
        methods.build("imtl", 2).combine(grads, torch.ones(2, dtype=torch.float64))
    assert str(error.value) == ("imtl: the task-gradient Gramian contains NaN or Inf; check the losses and "
                                "lower --lr")


def test_imtl_scale_gradient_on_float64_losses_is_the_float64_formula() -> None:
    imtl = methods.build("imtl", 2)
    with torch.no_grad():
        imtl.log_scales.copy_(torch.tensor([0.3, -0.2]))
    losses = torch.tensor([1.7, 0.45], dtype=torch.float64)
    s = imtl.log_scales.detach().double()                 # the float32 parameter's exact value
    # ∂/∂s Σ (e^{s} L − s) = e^{s} L − 1, in float64 like the losses (float32 e^{s} is ~6e-8 off)
    torch.testing.assert_close(imtl.scale_gradient(losses), torch.exp(s) * losses - 1.0, rtol=1e-14, atol=0)


class TestDBMTL(GradientContract):
    name = "dbmtl"


class TestExcessMTL(GradientContract):
    name = "excessmtl"


class TestGradDrop(GradientContract):
    name = "graddrop"


class TestIMTL(GradientContract):
    name = "imtl"


class TestMoCo(GradientContract):
    name = "moco"
