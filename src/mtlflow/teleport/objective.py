"""How COST teleports: the adapter's objective L_lora = L_t − γ·L_g (COST paper, Eqs. 5–11).

* Loss invariance, Eq. 7: L_t = (1/K) Σ_i |L_i(θ+Δθ) − L_i*| with L_i* the loss before the teleport,
  held fixed (Eq. 5 relaxed to a penalty).
* Gradient maximisation through sharpness, Eqs. 6, 8, 9: with ñ perturbations ε_j on the sphere
  ‖ε‖ = δ around the current point of the shared parameters,
  L_g = max_j | (1/K) Σ_i R_i [L_i(θ+Δθ+ε_j) − L_i(θ+Δθ)] |.
  The perturbed losses are evaluated with ``torch.func.functional_call`` on the adapted model with
  the shared weights replaced by (weight + ε): the adapter's parameters stay live in that call, so
  the gradient of L_g reaches them through *both* terms (the released code evaluates the perturbed
  losses on a merged deep copy, which cuts that path; ``sharpness_gradient="unperturbed-only"``
  reproduces it).
* Balance weights, Eq. 10: R = K · softmax([Σ_j ‖g_j‖ / ‖g_i‖]_i) -- the task with the smallest
  gradient gets the largest weight. Note that the logits Σ_j‖g_j‖/‖g_i‖ are ≥ K, so R is nearly
  one-hot on the smallest-norm task unless the norms are close; this is the paper's formula.
  ``balance="complement"`` is the released code's R = K(1 − ‖g_i‖/Σ_j‖g_j‖).
* Eq. 11: L_lora = L_t − γ·L_g, γ = 0.1, minimised by Adam on the adapter parameters only.

:func:`optimise_adapter` is generic: a :class:`TeleportProblem` says how to evaluate the K losses of
batch b at the adapted point (optionally perturbed); the trainer callback (PEFT adapters on a real
model) and the toy problem (a dense Δθ on the point itself) both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mtlflow.teleport.options import CostOptions

#: losses(batch_index, perturbation by shared-parameter name or None) -> [K] task losses at θ+Δθ(+ε)
LossFn = Callable[[int, Mapping[str, Tensor] | None], Tensor]


def balance_weights(norms: Tensor, kind: str = "softmax") -> Tensor:
    """R of Eq. 10 (``softmax``) or of the released code (``complement``) from the task gradient norms."""
    norms = norms.to(torch.float64)
    k = norms.numel()
    total = norms.sum()
    if kind == "softmax":
        return k * torch.softmax(total / norms.clamp_min(1e-30), dim=0)
    return k * (1.0 - norms / total.clamp_min(1e-30))


def invariance_loss(losses: Tensor, targets: Tensor) -> Tensor:
    """Eq. 7: mean absolute change of the task losses from their pre-teleport values."""
    return (losses - targets.to(losses)).abs().mean()


def sample_perturbation(shapes: Mapping[str, torch.Size], radius: float, noise: str, generator: torch.Generator,
                        dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
    """ε on the sphere ‖ε‖ = δ over all shared parameters together (``sphere``, Eq. 8), or Gaussian noise
    scaled to norm δ in each tensor separately (``per-tensor``, the released code)."""
    raw = {n: torch.randn(s, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
           for n, s in shapes.items()}
    if noise == "sphere":
        total = torch.sqrt(sum((t.double() ** 2).sum() for t in raw.values())).clamp_min(1e-30)
        return {n: t * (radius / total).to(dtype) for n, t in raw.items()}
    return {n: t * (radius / t.double().norm().clamp_min(1e-30)).to(dtype) for n, t in raw.items()}


def sharpness_loss(base: Tensor, perturbed: Tensor, balance: Tensor, reduction: str, radius: float) -> Tensor:
    """L_g from the unperturbed losses ``base [K]`` and the perturbed ones ``perturbed [ñ, K]``.

    ``max-of-mean`` (Eq. 9): max_j |(1/K) Σ_i R_i (L_ij − L_i)|. ``mean-of-max`` (released code):
    (1/K) Σ_i max_j R_i |L_ij − L_i| / δ.
    """
    diffs = perturbed - base.unsqueeze(0)
    weights = balance.to(diffs)
    if reduction == "max-of-mean":
        return (diffs * weights).mean(dim=1).abs().max()
    return ((diffs.abs() * weights).max(dim=0).values.mean()) / radius


@dataclass
class TeleportProblem:
    """One teleport: how to evaluate the losses, what to perturb, what to train, and the targets."""

    losses: LossFn
    #: name -> shape of every shared parameter the perturbations ε act on
    perturbation_shapes: dict[str, torch.Size]
    adapter_parameters: list[Tensor]
    #: L_i* per batch ``[B, K]`` (``invariance_target="batch"``) or one row ``[1, K]`` (``"mean"``)
    targets: Tensor
    balance: Tensor
    n_batches: int
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


@dataclass
class TeleportTrace:
    """What the adapter optimisation did (for the telemetry; Fig. 5(b): L_t falls, L_g rises)."""

    steps: int = 0
    invariance: list[float] = field(default_factory=list)
    sharpness: list[float] = field(default_factory=list)


def adapter_objective(problem: TeleportProblem, options: CostOptions, batch: int,
                      perturbations: list[Mapping[str, Tensor]]) -> tuple[Tensor, Tensor, Tensor | None]:
    """(w·L_t − γ·L_g of Eq. 11, L_t, L_g) at the adapter's current value: L_t on ``batch``, L_g on the
    trigger batch (0) with the given perturbations ε_j (``None`` when the sharpness term is off)."""
    losses = problem.losses(batch, None)
    total = losses.new_zeros(())
    target = problem.targets[batch if problem.targets.shape[0] > 1 else 0]
    l_t = invariance_loss(losses, target)
    if options.use_invariance:
        total = total + options.invariance_weight * l_t
    l_g = None
    if options.use_sharpness:
        base = losses if batch == 0 else problem.losses(0, None)
        perturbed = []
        for eps in perturbations:
            value = problem.losses(0, eps)
            perturbed.append(value.detach() if options.sharpness_gradient == "unperturbed-only" else value)
        l_g = sharpness_loss(base, torch.stack(perturbed), problem.balance, options.reduction, options.radius)
        total = total - options.gamma * l_g
    return total, l_t, l_g


def optimise_adapter(problem: TeleportProblem, options: CostOptions, n_steps: int, lr: float,
                     generator: torch.Generator) -> TeleportTrace:
    """Minimise w·L_t − γ·L_g (Eq. 11, :func:`adapter_objective`) over the adapter parameters with Adam for
    ``n_steps`` steps, with ñ fresh perturbations per step.

    Step s uses batch s mod B for L_t; the sharpness term always uses batch 0 (the trigger batch).
    ``options`` must be resolved (:meth:`CostOptions.resolved`).
    """
    trace = TeleportTrace()
    optimizer = torch.optim.Adam(problem.adapter_parameters, lr=lr)
    for step in range(n_steps):
        optimizer.zero_grad(set_to_none=True)
        perturbations = [sample_perturbation(problem.perturbation_shapes, options.radius, options.noise, generator,
                                             problem.dtype, problem.device)
                         for _ in range(options.perturbations)] if options.use_sharpness else []
        total, l_t, l_g = adapter_objective(problem, options, step % problem.n_batches, perturbations)
        total.backward()
        optimizer.step()
        trace.invariance.append(float(l_t.detach()))
        trace.sharpness.append(float(l_g.detach()) if l_g is not None else float("nan"))
        trace.steps += 1
    return trace
