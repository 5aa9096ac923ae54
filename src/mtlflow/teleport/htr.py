"""Historical trajectory reuse, HTR (COST paper, Sec. 4.3, Eqs. 12–13).

After a teleport, σ = cos(Δθ, g′) (Eq. 12) with Δθ the teleport's displacement of the shared
parameters and g′ the gradient at the pre-teleport point. For the *one* optimizer step that follows,
Adam's moment updates use σβ₁ and σβ₂ (Eq. 13)::

    v_t = σβ₁ v_{t−1} + (1 − σβ₁) g_t        s_t = σβ₂ s_{t−1} + (1 − σβ₂) g_t²

and then σ is 1 again. PyTorch's Adam and AdamW read ``betas`` from each parameter group at every
step, so setting the betas of the groups that hold the shared parameters -- in the optimizer the
trainer actually steps -- for that step and restoring them afterwards is exactly Eq. 13 (the released
code sets them on an optimizer that is then not stepped; ``methods-cost.md`` §1.3 item 9).

Two choices the paper leaves open:

* **σ is clamped to [0, 1].** A negative σ would make σβ a negative "decay" and weigh the new gradient
  by more than 1 (1 − σβ > 1), which is no longer a moving average; σ = 0 instead forgets the history
  entirely (v = g, s = g²), which is what the released code approximates for σ ≤ 0 by creating a new
  Adam. With σ = 0, Adam's bias corrections 1 − (σβ)^t are 1, so that step is exactly the first step
  of a fresh Adam.
* **Bias correction.** PyTorch computes the bias corrections of that step with the same modified betas
  (1 − (σβ)^t instead of 1 − β^t); for the step counts of a real run both are ≈ 1 unless σ is close to 1,
  where they coincide. Eq. 13 only defines the moments, which the tests check exactly.

SGD has no (β₁, β₂); with SGD the teleport records σ and HTR is not applied.
"""

from __future__ import annotations

from typing import Sequence

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


def apply_htr(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], sigma: float) -> list[tuple[dict, tuple]]:
    """Set (σβ₁, σβ₂) on the Adam/AdamW groups holding ``params``; returns what :func:`restore_htr` needs.

    Returns an empty list (nothing changed) for optimizers without ``betas`` (SGD).
    """
    saved = []
    for group in groups_holding(optimizer, params):
        betas = group.get("betas")
        if betas is None:
            continue
        saved.append((group, tuple(betas)))
        group["betas"] = (sigma * betas[0], sigma * betas[1])
    return saved


def restore_htr(saved: list[tuple[dict, tuple]]) -> None:
    """Put the original betas back (σ = 1 again)."""
    for group, betas in saved:
        group["betas"] = betas
