"""Historical trajectory reuse, HTR (COST paper, Sec. 4.3, Eqs. 12–13).

After a teleport, σ = cos(Δθ, g′) (Eq. 12) with Δθ the teleport's displacement of the shared
parameters and g′ the gradient at the pre-teleport point. For the *one* optimizer step that follows,
Adam's moment updates use σβ₁ and σβ₂ (Eq. 13)::

    v_t = σβ₁ v_{t−1} + (1 − σβ₁) g_t        s_t = σβ₂ s_{t−1} + (1 − σβ₂) g_t²

and then σ is 1 again. PyTorch's Adam and AdamW read ``betas`` from each parameter group at every
step, so setting the betas of the groups that hold the shared parameters -- in the optimizer the
trainer actually steps -- for that step and restoring them afterwards is exactly Eq. 13 (the released
code sets them on an optimizer that is then not stepped; ``methods-cost.md`` §1.3 item 9).

Two choices the paper leaves open, both options of :class:`~mtlflow.teleport.options.CostOptions`:

* **σ ≤ 0** (``htr_nonpositive``). Eq. 13 with a negative σ would make σβ a negative "decay" and weigh
  the new gradient by more than 1, which is no longer a moving average. ``"restart"`` (default) does what
  the released code does, a new Adam: the state of the groups holding the shared parameters is dropped,
  so the step is a fresh Adam's first and the bias corrections count again from it. ``"zero-betas"``
  clamps σ to 0 in Eq. 13 instead: that step is the same (v = g, s = g²), but s then holds one batch's g²
  with weight ≈ 1 for the next ~1/(1 − β₂) steps, and a coordinate whose gradient was near 0 at that
  step moves by several × lr per step (``test_htr_with_sigma_clamped_to_zero_...`` computes it by hand).
* **Adam's bias correction after the step** (``htr_bias_correction``). Adam divides its moments by
  1 − β^t, the weight a plain run's moments hold after t steps. Eq. 13 changes that weight: the moments
  hold W′ = σβ(1 − β^(t−1)) + (1 − σβ) after the HTR step. ``"rescale"`` (default) multiplies them by
  (1 − β^t)/W′ after the step, so the later corrections read them as an estimate of the same weight as
  a plain run's; late in training (β^t ≈ 0) the factor is 1 and the moments are Eq. 13's exactly, and
  a teleport at Adam's first step leaves exactly a fresh Adam. ``"none"`` keeps PyTorch's moments and
  count: a teleport early in training (the ci ablation teleports at step 0 or 3 with σ ≈ 0.01) leaves
  moments of weight ≈ 1 that the next corrections inflate by 1/(1 − β₂^t), ≈ 500 at t = 2, so the trunk
  barely moves for hundreds of steps (docs/research/cost.md, "HTR and Adam's bias correction": FairGrad
  + COST's Δm% 44 % with ``"none"``).
  The HTR step itself keeps PyTorch's corrections with the modified betas, 1 − (σβ)^t: they equal W′ at
  t = 1 and are ≈ 1 = W′ late in training.

SGD has no (β₁, β₂); with SGD the teleport records σ and HTR is not applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


def htr_sigma(displacement: Tensor, reference: Tensor) -> tuple[float, float | None]:
    """(σ clamped to [0, 1], the raw cosine) of Eq. 12 between Δθ and g′ (flat vectors).

    A teleport that did not move (Δθ = 0, e.g. L_t alone, whose minimum is the starting point) leaves
    the history valid: σ = 1 and the raw cosine is None (undefined).
    """
    d, g = displacement.detach().double().reshape(-1), reference.detach().double().reshape(-1)
    denom = float(d.norm() * g.norm())
    if denom == 0:
        return 1.0, None
    raw = float(d @ g) / denom
    return min(max(raw, 0.0), 1.0), raw


def groups_holding(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> list[dict]:
    """The parameter groups of ``optimizer`` that contain any of ``params``."""
    ids = {id(p) for p in params}
    return [g for g in optimizer.param_groups if any(id(p) in ids for p in g["params"])]


@dataclass
class HtrStep:
    """The Adam/AdamW groups whose betas :func:`apply_htr` set to σβ for one step, and their own betas."""

    optimizer: torch.optim.Optimizer
    sigma: float
    groups: list[tuple[dict, tuple[float, float]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.groups)


def apply_htr(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], sigma: float) -> HtrStep:
    """Set (σβ₁, σβ₂) on the Adam/AdamW groups holding ``params``, for the next step (Eq. 13).

    Nothing changes (an empty, false :class:`HtrStep`) for optimizers without ``betas`` (SGD).
    """
    step = HtrStep(optimizer, sigma)
    for group in groups_holding(optimizer, params):
        betas = group.get("betas")
        if betas is None:
            continue
        step.groups.append((group, tuple(betas)))
        group["betas"] = (sigma * betas[0], sigma * betas[1])
    return step


def restore_htr(step: HtrStep, bias_correction: str = "rescale") -> None:
    """After the HTR step: put the groups' betas back (σ = 1 again) and, with ``bias_correction="rescale"``,
    scale each moment by (1 − β^t)/W′ so Adam's later bias corrections match the weight it holds."""
    for group, betas in step.groups:
        group["betas"] = betas
        if bias_correction != "rescale":
            continue
        for p in group["params"]:
            state = step.optimizer.state.get(p)
            if not state or "step" not in state:
                continue
            t = float(state["step"])
            for key, beta in (("exp_avg", betas[0]), ("exp_avg_sq", betas[1]), ("max_exp_avg_sq", betas[1])):
                if key in state:
                    held = step.sigma * beta * (1.0 - beta ** (t - 1.0)) + (1.0 - step.sigma * beta)
                    state[key].mul_((1.0 - beta ** t) / held)


def restart_moments(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> bool:
    """Drop the Adam/AdamW state of the groups holding ``params`` (σ ≤ 0 with ``htr_nonpositive="restart"``).

    PyTorch's Adam initialises the state of a parameter that has none at its next step (step count 0,
    zero moments), so that step is a fresh Adam's first and the bias corrections restart from it: the
    released code's new Adam, on the same groups Eq. 13 would act on. SGD groups are left alone (HTR does
    not apply to SGD). Returns whether any Adam group holds ``params``, i.e. whether HTR applied.
    """
    applied = False
    for group in groups_holding(optimizer, params):
        if group.get("betas") is None:
            continue
        applied = True
        for p in group["params"]:
            optimizer.state.pop(p, None)
    return applied
