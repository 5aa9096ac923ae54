"""COST building blocks on constructed inputs: trigger rules (Eqs. 3, 4, Def. 1), R (Eq. 10), L_t (Eq. 7),
L_g (Eq. 9) and its gradient path to the adapter, HTR on Adam's moments (Eq. 13), option validation."""

from __future__ import annotations

import math

import pytest
import torch
from cost_helpers import double_lenet_trainer
from torch import nn

from mtlflow.core.errors import InvalidParameterError
from mtlflow.teleport.htr import apply_htr, htr_sigma, restart_moments, restore_htr
from mtlflow.teleport.objective import balance_weights, invariance_loss, sample_perturbation, sharpness_loss
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import (
    RULES,
    describe,
    dominated_conflict,
    gradient_stats,
    many_task_conflict,
    released_conflict,
    weak_conflict,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stats_of(*rows: list[float]):
    return gradient_stats(torch.tensor(rows, dtype=torch.float64), pairwise=True)


# -- triggers ----------------------------------------------------------------------------------------------

def test_dominated_conflict_fires_only_when_the_smallest_gradient_opposes_the_mean():
    # g2 is the smaller gradient and points against g0 = (0.25, 0.05)
    fires = stats_of([1.0, 0.0], [-0.5, 0.1])
    assert fires.cos_to_mean[1] < 0 and dominated_conflict(fires)
    # the two gradients conflict (cos < 0) but the smaller one still agrees with the mean
    weak_only = stats_of([1.0, 0.0], [-0.1, 1.0])
    assert weak_only.pairwise_cos[0, 1] < 0 and (weak_only.cos_to_mean > 0).all()
    assert not dominated_conflict(weak_only)
    assert not dominated_conflict(stats_of([1.0, 0.0], [0.2, 1.0]))


def test_dominated_conflict_looks_at_the_smallest_norm_task_only():
    # K = 3: task 3 opposes the mean, but the smallest-norm task 1 does not
    stats = stats_of([1.0, 0.0], [10.0, 0.0], [-4.0, 1.0])
    assert stats.cos_to_mean[2] < 0 and int(torch.argmin(stats.norms)) == 0
    assert not dominated_conflict(stats)
    assert released_conflict(stats)           # the released code fires on any task
    assert not many_task_conflict(stats)      # 1 < ceil(3/2) = 2


def test_weak_conflict_fires_on_any_negative_pair_and_not_otherwise():
    assert weak_conflict(stats_of([1.0, 0.0], [-0.1, 1.0]))
    assert weak_conflict(stats_of([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, -0.2, 1.0]))
    assert not weak_conflict(stats_of([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.2, 1.0]))
    with pytest.raises(InvalidParameterError, match="pairwise"):
        weak_conflict(gradient_stats(torch.tensor([[1.0, 0.0], [-1.0, 0.1]])))


def test_many_task_rule_needs_ceil_half_of_the_tasks_against_the_mean():
    base = [[10.0, 0.0], [10.0, 0.5], [-1.0, 0.2], [-1.0, -0.2]]     # 2 of 4 oppose g0
    stats = stats_of(*base)
    assert stats.conflicting == 2 and many_task_conflict(stats)
    one = stats_of([10.0, 0.0], [10.0, 0.5], [-1.0, 0.2], [1.0, -0.2])
    assert one.conflicting == 1 and not many_task_conflict(one)
    # K = 5: ceil(5/2) = 3 needed
    five = stats_of([10.0, 0.0], [10.0, 0.5], [10.0, -0.5], [-1.0, 0.2], [-1.0, -0.2])
    assert five.conflicting == 2 and not many_task_conflict(five)


def test_released_rule_uses_less_or_equal_and_a_zero_gradient_triggers_only_it():
    stats = stats_of([1.0, 0.0], [0.0, 0.0])
    assert float(stats.cos_to_mean[1]) == 0.0
    assert released_conflict(stats) and not dominated_conflict(stats) and not weak_conflict(stats)
    assert RULES["always"](stats)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_statistics_are_float64_whatever_the_gradients_dtype(dtype):
    grads = torch.tensor([[3.0, 4.0], [-1.0, 0.5]]).to(dtype)
    stats = gradient_stats(grads, pairwise=True)
    assert {stats.norms.dtype, stats.cos_to_mean.dtype, stats.pairwise_cos.dtype} == {torch.float64}
    # the norms are taken in the gradients' dtype (one pass over P) and stored in float64
    torch.testing.assert_close(stats.norms, grads.double().norm(dim=1), rtol=1e-6 if dtype == torch.float32 else 1e-2,
                               atol=0.0)


@pytest.mark.parametrize("shape", [(1, 3), (3,)])
def test_gradient_statistics_refuse_fewer_than_two_rows_in_one_line(shape):
    with pytest.raises(InvalidParameterError) as error:
        gradient_stats(torch.ones(shape))
    assert str(error.value) == f"COST needs per-task gradients of at least 2 tasks, got shape {shape}"


def test_trigger_reasons_name_the_tasks():
    # g_left = (1, 0), g_right = (-0.5, 0.1): mean (0.25, 0.05); cos(g_right, mean) = -0.12 / (0.5099 · 0.2550)
    stats = stats_of([1.0, 0.0], [-0.5, 0.1])
    names = ["left", "right"]
    assert describe("dominated", stats, names) == ("dominated conflict (Eq. 3): smallest-norm task right has cos "
                                                   "-0.923 < 0 with the mean gradient")
    assert describe("weak", stats, names) == "weak conflict (Def. 1): cos(g_left, g_right) = -0.981 < 0"
    assert describe("many-task", stats, names) == ("many-task conflict (Eq. 4): 1 of 2 tasks conflict with the mean "
                                                   "gradient (>= 1)")
    assert describe("released", stats, names) == "released-code rule: task right has cos -0.923 <= 0 with the mean"
    assert describe("always", stats, names) == "always (timing)"


# -- objective ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["softmax", "complement"])
def test_balance_weights_are_computed_in_float64_from_float32_norms(kind):
    norms = torch.tensor([0.3, 1.7, 4.1])
    weights = balance_weights(norms, kind)
    assert weights.dtype == torch.float64
    torch.testing.assert_close(weights, balance_weights(norms.double(), kind), rtol=0.0, atol=0.0)
    total = sum(float(n) for n in norms)
    expected = [3 * (1 - float(n) / total) for n in norms] if kind == "complement" else \
        [3 * math.exp(total / float(n)) / sum(math.exp(total / float(m)) for m in norms) for n in norms]
    assert weights.tolist() == pytest.approx(expected, rel=1e-13)


def test_balance_weights_follow_eq_10_and_the_released_formula():
    norms = torch.tensor([1.0, 3.0], dtype=torch.float64)
    logits = torch.tensor([4.0, 4.0 / 3.0], dtype=torch.float64)   # Σ‖g‖ / ‖g_i‖
    expected = 2 * torch.exp(logits) / torch.exp(logits).sum()
    assert torch.allclose(balance_weights(norms, "softmax"), expected)
    assert balance_weights(norms, "softmax")[0] > balance_weights(norms, "softmax")[1]  # small gradient, large R
    assert torch.allclose(balance_weights(norms, "complement"), torch.tensor([1.5, 0.5], dtype=torch.float64))
    assert math.isclose(float(balance_weights(torch.rand(7) + 0.1).sum()), 7.0, rel_tol=1e-9)


def test_invariance_and_sharpness_losses_on_hand_computed_values():
    losses, targets = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])
    assert math.isclose(float(invariance_loss(losses, targets)), (0.5 + 1.0) / 2)
    base = torch.tensor([1.0, 2.0])
    perturbed = torch.tensor([[1.1, 1.8], [0.7, 2.5]])          # diffs (0.1, -0.2), (-0.3, 0.5)
    r = torch.tensor([1.5, 0.5])
    # Eq. 9: max_j |mean_i R_i d_ij| = max(|0.15 - 0.1| / 2, |-0.45 + 0.25| / 2) = 0.1
    assert math.isclose(float(sharpness_loss(base, perturbed, r, "max-of-mean", 1.0)), 0.1, rel_tol=1e-6)
    # released: mean_i max_j R_i |d_ij| / δ = (max(0.15, 0.45) + max(0.1, 0.25)) / 2 / 0.5 = 0.7
    assert math.isclose(float(sharpness_loss(base, perturbed, r, "mean-of-max", 0.5)), 0.7, rel_tol=1e-6)
    # the balance weights come from float64 gradient statistics; L_t and L_g keep the losses' float32
    assert invariance_loss(losses, targets.double()).dtype == torch.float32
    for reduction in ("max-of-mean", "mean-of-max"):
        assert sharpness_loss(base, perturbed, r.double(), reduction, 0.5).dtype == torch.float32


def test_perturbations_lie_on_the_sphere_or_have_the_norm_per_tensor():
    shapes = {"a": torch.Size([3, 4]), "b": torch.Size([5])}
    g = torch.Generator().manual_seed(0)
    eps = sample_perturbation(shapes, 0.3, "sphere", g, torch.float64, torch.device("cpu"))
    assert math.isclose(float(torch.sqrt(sum((t ** 2).sum() for t in eps.values()))), 0.3, rel_tol=1e-9)
    eps = sample_perturbation(shapes, 0.3, "per-tensor", g, torch.float64, torch.device("cpu"))
    assert all(math.isclose(float(t.norm()), 0.3, rel_tol=1e-9) for t in eps.values())


@pytest.mark.parametrize("noise", ["sphere", "per-tensor"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_perturbations_are_the_generators_float64_normal_draw_scaled_to_the_radius(noise, dtype):
    # every dtype draws the same float64 standard normals (a float32 run perturbs in the direction of a float64
    # one); one-element tensors whose draws are below 1 in size are scaled up to the radius, not left short
    shapes = {"a": torch.Size([1]), "b": torch.Size([1])}
    draws = torch.randn(2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert float(draws.norm()) < 1.0
    eps = sample_perturbation(shapes, 0.3, noise, torch.Generator().manual_seed(3), dtype, torch.device("cpu"))
    scale = 0.3 / draws.norm() if noise == "sphere" else 0.3 / draws.abs()
    expected = (draws * scale).to(dtype)
    assert all(t.dtype == dtype for t in eps.values())
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(torch.cat([eps["a"], eps["b"]]), expected, rtol=rtol, atol=0.0)


def _tiny_model() -> nn.Module:
    from mtlflow.models.base import MultiTaskModel

    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh())
    return MultiTaskModel(trunk, [nn.Linear(5, 1), nn.Linear(5, 1)], ["a", "b"]).double()


def _double_lenet_trainer(data_dir, tmp_path, options):
    """A COST trainer on MultiMNIST whose LeNet (with BatchNorm) runs in float64, for finite differences."""
    return double_lenet_trainer(data_dir, tmp_path / "run", "fairgrad", options)


@pytest.mark.parametrize("path", ["through-perturbations", "unperturbed-only"])
def test_sharpness_gradient_reaches_the_adapter_and_matches_finite_differences(path, multimnist_small, tmp_path):
    """CostTeleport's own teleport problem (its loss closure on the PEFT-adapted copy of the trainer's model)
    and Eq. 11's objective (:func:`adapter_objective`, what the adapter's Adam minimises): the gradient
    w.r.t. LoRA's B equals central finite differences of the same objective with fixed ε -- only when the
    perturbed losses carry the adapter's gradient (the paper's L_g), not on the released code's path."""
    from mtlflow.teleport import adapters
    from mtlflow.teleport.callback import _Batches
    from mtlflow.teleport.objective import adapter_objective

    trainer = _double_lenet_trainer(multimnist_small, tmp_path, {"sharpness_gradient": path, "radius": 0.5,
                                                                  "invariance_weight": 1.0, "gamma": 0.1})
    cost = trainer.callbacks[0]
    opts = cost.resolved
    batch = next(iter(trainer._loader(1)))
    adapted = adapters.inject(trainer.model, trainer.shared, opts.adapter, rank=2)
    adapted.model.train()
    g = torch.Generator().manual_seed(1)
    stats = gradient_stats(torch.randn(2, 7, generator=g, dtype=torch.float64))
    problem = cost._problem(trainer, adapted, _Batches(trainer, batch, 1, seed=0), stats)
    lora_b = [p for n, p in adapted.model.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for p in lora_b:
            p.normal_(0, 0.3, generator=g)  # away from B = 0, where L_t's |.| has its kink
    eps = [sample_perturbation(problem.perturbation_shapes, 0.5, "sphere", g, torch.float64, torch.device("cpu"))
           for _ in range(3)]

    def objective() -> torch.Tensor:
        return adapter_objective(problem, opts, 0, eps)[0]

    target = lora_b[-1]
    (grad,) = torch.autograd.grad(objective(), target)
    direction = torch.randn(target.shape, generator=g, dtype=torch.float64)
    analytic = float((grad * direction).sum())
    h = 1e-6
    with torch.no_grad():
        target.add_(h * direction)
        up = float(objective())
        target.sub_(2 * h * direction)
        down = float(objective())
        target.add_(h * direction)
    numeric = (up - down) / (2 * h)
    assert abs(numeric) > 1e-6
    if path == "through-perturbations":
        assert math.isclose(numeric, analytic, rel_tol=1e-5, abs_tol=1e-9)
    else:  # the released code's path: only the unperturbed term carries a gradient, so it is not L_g's
        assert not math.isclose(numeric, analytic, rel_tol=1e-3)


# -- HTR -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer_cls", [torch.optim.Adam, torch.optim.AdamW])
def test_htr_changes_adams_moments_exactly_as_eq_13(optimizer_cls):
    p = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    other = nn.Parameter(torch.tensor([0.5], dtype=torch.float64))
    opt = optimizer_cls([{"params": [p]}, {"params": [other], "lr": 0.01}], lr=0.1, betas=(0.9, 0.999))
    p.grad, other.grad = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    opt.step()
    # after one step: v = 0.1 g1 = (0.05, -0.1), s = 0.001 g1² = (0.00025, 0.001)
    assert torch.allclose(opt.state[p]["exp_avg"], torch.tensor([0.05, -0.1], dtype=torch.float64))
    assert torch.allclose(opt.state[p]["exp_avg_sq"], torch.tensor([0.00025, 0.001], dtype=torch.float64))
    saved = apply_htr(opt, [p], sigma=0.5)
    assert opt.param_groups[0]["betas"] == (0.45, 0.4995) and opt.param_groups[1]["betas"] == (0.9, 0.999)
    p.grad, other.grad = torch.tensor([2.0, 1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    opt.step()
    # Eq. 13 by hand: v = 0.45 (0.05, -0.1) + 0.55 (2, 1); s = 0.4995 (0.00025, 0.001) + 0.5005 (4, 1)
    assert torch.allclose(opt.state[p]["exp_avg"], torch.tensor([1.1225, 0.505], dtype=torch.float64), atol=1e-15)
    assert torch.allclose(opt.state[p]["exp_avg_sq"], torch.tensor([2.002124875, 0.5009995], dtype=torch.float64),
                          atol=1e-15)
    # the other group kept β = (0.9, 0.999): v = 0.9·0.1 + 0.1·1
    assert torch.allclose(opt.state[other]["exp_avg"], torch.tensor([0.19], dtype=torch.float64))
    restore_htr(saved)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)


def _noisy_gradients(n_steps: int, size: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g, dtype=torch.float64) for _ in range(n_steps)]


@pytest.mark.parametrize("optimizer_cls", [torch.optim.Adam, torch.optim.AdamW])
def test_htr_restart_makes_the_next_steps_a_fresh_adams_for_the_shared_parameters_group_only(optimizer_cls):
    # 30 steps of history, a restart, 20 more: the shared tensor's group moves exactly as under an Adam created
    # at the restart (same gradients), another group exactly as if nothing happened
    shared, other = (nn.Parameter(torch.zeros(5, dtype=torch.float64)) for _ in range(2))
    fresh_shared, untouched_other = (nn.Parameter(torch.zeros(5, dtype=torch.float64)) for _ in range(2))
    opt = optimizer_cls([{"params": [shared]}, {"params": [other], "lr": 0.01}], lr=0.1)
    untouched = optimizer_cls([{"params": [untouched_other], "lr": 0.01}], lr=0.1)
    before, after = _noisy_gradients(30, 5, 0), _noisy_gradients(20, 5, 1)
    for grad in before:
        shared.grad, other.grad, untouched_other.grad = grad, grad, grad
        opt.step()
        untouched.step()
    assert restart_moments(opt, [shared]) is True
    assert shared not in opt.state and other in opt.state
    with torch.no_grad():
        fresh_shared.copy_(shared)
    fresh = optimizer_cls([fresh_shared], lr=0.1)
    for grad in after:
        shared.grad, other.grad, fresh_shared.grad, untouched_other.grad = grad, grad, grad, grad
        opt.step()
        fresh.step()
        untouched.step()
        assert torch.equal(shared, fresh_shared) and torch.equal(other, untouched_other)
    assert int(opt.state[shared]["step"]) == 20
    # SGD keeps its momentum and HTR does not apply
    p = nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones(2)
    sgd.step()
    assert restart_moments(sgd, [p]) is False and "momentum_buffer" in sgd.state[p]


def test_htr_with_sigma_clamped_to_zero_lets_a_coordinate_step_several_times_lr_where_restart_does_not():
    """The hazard ``htr_nonpositive="restart"`` avoids, by hand (PyTorch's count kept): after 1,000 steps a coordinate whose gradient is
    exactly 0 at the σ = 0 step and c afterwards gets m_k = (1 − β₁^k)c and s_k = (1 − β₂^k)c² with bias
    corrections of step 1,000 + k, so it moves by about lr·(1 − β₁^k)/√(1 − β₂^k) (here 2.5 lr at k = 1, over
    5 lr at k = 10); a restarted Adam moves it by at most lr."""
    lr, (b1, b2), c = 1e-3, (0.9, 0.999), 0.7
    history = _noisy_gradients(1000, 1, 2)

    def steps_after(nonpositive: str) -> list[float]:
        p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2))
        for grad in history:
            p.grad = grad
            opt.step()
        if nonpositive == "restart":
            restart_moments(opt, [p])
        else:
            saved = apply_htr(opt, [p], 0.0)
        p.grad = torch.zeros(1, dtype=torch.float64)   # the teleport step's gradient for this coordinate
        opt.step()
        if nonpositive != "restart":
            restore_htr(saved, bias_correction="none")
        moves = []
        for _ in range(10):
            start = float(p.detach())
            p.grad = torch.full((1,), c, dtype=torch.float64)
            opt.step()
            moves.append(abs(float(p.detach()) - start) / lr)
        return moves

    clamped = steps_after("zero-betas")
    expected = [(1 - b1 ** k) / (1 - b1 ** (1001 + k)) / math.sqrt((1 - b2 ** k) / (1 - b2 ** (1001 + k)))
                for k in range(1, 11)]
    assert clamped == pytest.approx(expected, rel=1e-6)
    assert min(clamped) > 2.5 and max(clamped) > 5.0
    restarted = steps_after("restart")
    # a fresh Adam's first step on g = 0 is 0 (m̂ = 0); from then on m̂/√ŝ: (1 − β₁^k)/(1 − β₁^(k+1)) over
    # √((1 − β₂^k)/(1 − β₂^(k+1))) with the zero gradient counted as step 1
    fresh = [((1 - b1 ** k) / (1 - b1 ** (k + 1))) / math.sqrt((1 - b2 ** k) / (1 - b2 ** (k + 1)))
             for k in range(1, 11)]
    assert restarted == pytest.approx(fresh, rel=1e-6)
    assert max(restarted) <= 1.0


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("sigma", [0.0044, 0.5, 1.0])
def test_htr_at_adams_first_step_leaves_exactly_a_fresh_adam(sigma, amsgrad):
    # with no history to reuse, Eq. 13's step is a fresh Adam's first; after the rescale the next 30 steps
    # are a fresh Adam's too, whatever σ (with PyTorch's count kept, a small σ slows them ~20x); AMSGrad's
    # running maximum of the second moment is rescaled with it
    def run(htr: str | None) -> torch.Tensor:
        p = nn.Parameter(torch.zeros(4, dtype=torch.float64))
        opt = torch.optim.Adam([p], lr=0.01, amsgrad=amsgrad)
        for k, grad in enumerate(_noisy_gradients(31, 4, 3)):
            step = apply_htr(opt, [p], sigma) if htr and k == 0 else None
            p.grad = grad
            opt.step()
            if step is not None:
                restore_htr(step, bias_correction=htr)
        return p.detach().clone()

    fresh = run(None)
    assert torch.allclose(run("rescale"), fresh, rtol=1e-12, atol=1e-15)
    if sigma < 0.01:
        moved_none, moved_fresh = run("none").norm(), fresh.norm()
        assert moved_none < moved_fresh / 5


@pytest.mark.parametrize("bias_correction", ["rescale", "none"])
def test_htr_restores_every_group_and_rescales_past_tensors_that_did_not_step(bias_correction):
    # two Adam groups hold the shared tensors; the first tensor of the first group got no gradient, so Adam
    # kept no state for it: every group gets its betas back and the tensors that stepped are rescaled
    unused, used, other = (nn.Parameter(torch.zeros(2, dtype=torch.float64)) for _ in range(3))
    opt = torch.optim.Adam([{"params": [unused, used]}, {"params": [other], "lr": 0.01}], lr=0.1)
    step = apply_htr(opt, [unused, used, other], 0.5)
    assert [g["betas"] for g in opt.param_groups] == [(0.45, 0.4995)] * 2
    used.grad, other.grad = torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    opt.step()
    restore_htr(step, bias_correction)
    assert [g["betas"] for g in opt.param_groups] == [(0.9, 0.999)] * 2 and unused not in opt.state
    rescaled = bias_correction == "rescale"
    for p in (used, other):  # at t = 1 the rescale makes the moments a fresh Adam's: (1 − β)·g
        expected = 0.1 if rescaled else 0.55
        assert torch.allclose(opt.state[p]["exp_avg"], torch.full((2,), expected, dtype=torch.float64))


def test_htr_rescale_gives_the_moments_the_weight_adams_bias_correction_assumes():
    # after t = 40 plain steps and the HTR step (t = 41), by hand: Eq. 13's moments times (1 − β^t)/W′ with
    # W′ = σβ(1 − β^(t−1)) + 1 − σβ; the next step's bias-corrected moment is then the weighted mean of that
    # estimate (weight 1 − β^t) and the new gradient (weight 1 − β)
    sigma, (b1, b2) = 0.3, (0.9, 0.999)
    p = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = torch.optim.Adam([p], lr=0.01, betas=(b1, b2))
    for grad in _noisy_gradients(40, 3, 4):
        p.grad = grad
        opt.step()
    v0, s0 = opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()
    g, g_next = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64), torch.tensor([1.0, 0.5, -0.1],
                                                                                  dtype=torch.float64)
    step = apply_htr(opt, [p], sigma)
    p.grad = g
    opt.step()
    restore_htr(step)
    t = 41
    for key, beta, old, new in (("exp_avg", b1, v0, g), ("exp_avg_sq", b2, s0, g * g)):
        eq13 = sigma * beta * old + (1 - sigma * beta) * new
        held = sigma * beta * (1 - beta ** (t - 1)) + 1 - sigma * beta
        assert torch.allclose(opt.state[p]["exp_avg_sq" if key == "exp_avg_sq" else "exp_avg"],
                              eq13 * (1 - beta ** t) / held, rtol=1e-13)
    p.grad = g_next
    opt.step()
    estimate = (sigma * b2 * s0 + (1 - sigma * b2) * g * g) / (sigma * b2 * (1 - b2 ** 40) + 1 - sigma * b2)
    corrected = opt.state[p]["exp_avg_sq"] / (1 - b2 ** 42)
    expected = (b2 * (1 - b2 ** 41) * estimate + (1 - b2) * g_next * g_next) / (1 - b2 ** 42)
    assert torch.allclose(corrected, expected, rtol=1e-12)


def test_htr_sigma_is_the_cosine_clamped_at_zero_and_sgd_is_left_alone():
    assert htr_sigma(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0]))[0] == pytest.approx(1 / math.sqrt(2))
    sigma, raw = htr_sigma(torch.tensor([1.0, 0.0]), torch.tensor([-3.0, 0.0]))
    assert (sigma, raw) == (0.0, pytest.approx(-1.0))
    # parallel vectors whose cosine rounds above 1 in float64: σ, a factor on Adam's moments, is still 1
    sigma, raw = htr_sigma(torch.ones(3), torch.ones(3))
    assert raw > 1.0 and sigma == 1.0
    p = nn.Parameter(torch.zeros(2))
    assert not apply_htr(torch.optim.SGD([p], lr=0.1, momentum=0.9), [p], 0.5)


# -- options -------------------------------------------------------------------------------------------------

def test_options_resolve_per_variant_and_reject_bad_values_in_one_line():
    paper = CostOptions.from_mapping({}).resolved()
    assert (paper.trigger, paper.rank, paper.gamma, paper.balance) == ("dominated", 5, 0.1, "softmax")
    released = CostOptions.from_mapping({"variant": "released"}).resolved()
    assert (released.invariance_weight, released.gamma, released.balance, released.passes, released.batches) == \
        (10.0, 0.5, "complement", 2, 0)
    assert CostOptions.from_mapping({"variant": "released", "gamma": 0.1}).resolved().gamma == 0.1
    for bad, match in [({"bogus": 1}, "unknown COST option"), ({"trigger": "sometimes"}, "trigger must be one of"),
                       ({"rank": 0}, "rank must be an integer"), ({"radius": -1.0}, "radius must be a positive"),
                       ({"use_invariance": False, "use_sharpness": False}, "cannot both be false"),
                       ({"passes": 2, "steps": 3}, "exclude each other"), ({"variant": "v2"}, "variant must be")]:
        with pytest.raises(InvalidParameterError, match=match) as info:
            CostOptions.from_mapping(bad)
        assert "\n" not in str(info.value)


def test_oft_is_allowed_on_linear_trunks_and_merges_exactly():
    from mtlflow.teleport import adapters

    model = _tiny_model().float()
    adapted = adapters.inject(model, model.shared_parameters(), "oft", rank=2)
    with torch.no_grad():
        for p in adapted.adapter_parameters:
            p.normal_(0, 0.1)
    x = torch.randn(8, 4)
    with torch.no_grad():
        expected = adapted.model(x)
        assert not torch.allclose(expected[0], model(x)[0], atol=1e-4)
        merged = adapters.merge_and_unload(adapted)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(expected, merged(x), strict=True))
    assert not [n for n, _ in merged.named_modules() if "oft_" in n]


def test_htr_reads_a_shared_parameter_without_a_gradient_as_zeros() -> None:
    """The last update HTR keeps is the shared parameters' flat gradient; one that got no gradient this step
    (frozen, or unused by every loss) counts as zeros, in place."""
    from mtlflow.teleport.callback import _flat_grads

    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    used.grad = torch.tensor([1.0, -2.0])
    assert torch.equal(_flat_grads([used, unused]), torch.tensor([1.0, -2.0, 0.0, 0.0, 0.0]))
