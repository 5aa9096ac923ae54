"""COST on the toy problem (COST paper, Fig. 6: LS vs LS + COST trajectories).

The toy "trunk" is the point x ∈ R² itself, with no Conv2d/Linear layer for PEFT, so the teleport's
adapter here is a dense displacement Δ ∈ R² (a full-rank "adapter" of the two coordinates), trained
on the same objective as on networks (:func:`mtlflow.teleport.objective.optimise_adapter`:
L_t − γ·L_g with Eq. 10's R), with perturbations ε on the sphere of radius δ in R². The five starts are
one ``[5, 2]`` parameter with one Adam (lr 1e-3, the toy runner's step: Adam is element-wise, so these
are five independent runs), and HTR (Eqs. 12–13) redoes the teleported start's next Adam update with
(σβ₁, σβ₂) -- only that start's moments change, exactly as on a network. An "epoch" is ``steps_per_epoch`` steps (1,000: the toy benchmark's),
which is what the delayed start and the per-epoch cap count. The paper gives no settings for Fig. 6;
:data:`TOY_DEFAULTS` are mtlflow's (the point moves in [-10, 10]², so δ and the adapter's learning rate
are on that scale).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from mtlflow import methods as method_registry
from mtlflow.teleport.htr import htr_sigma
from mtlflow.teleport.objective import TeleportProblem, balance_weights, optimise_adapter
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import RULES, describe, gradient_stats, needs_pairwise
from mtlflow.toy import START_POINTS, toy_losses

#: toy-scale defaults of the options that depend on the model (overridable with ``--teleport-option``)
TOY_DEFAULTS: dict[str, Any] = {"steps": 50, "lr": 0.05, "radius": 0.5, "perturbations": 4}
STEPS_PER_EPOCH = 1000


def toy_options(options: Mapping[str, Any] | None) -> CostOptions:
    return CostOptions.from_mapping({**TOY_DEFAULTS, **dict(options or {})}).resolved()


def _teleport_point(x: Tensor, grads: Tensor, losses: Tensor, scale: float, opts: CostOptions,
                    generator: torch.Generator) -> tuple[Tensor, dict[str, Any]]:
    """Teleport the point ``x [2]`` (per-task ``grads [2, 2]``, ``losses [2]``); returns (Δ, telemetry)."""
    delta = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    base = x.detach().clone()

    def loss_fn(index: int, eps: Mapping[str, Tensor] | None) -> Tensor:
        point = base + delta + (eps["x"] if eps is not None else 0.0)
        return toy_losses(point, scale)

    stats = gradient_stats(grads)
    problem = TeleportProblem(losses=loss_fn, perturbation_shapes={"x": torch.Size([2])}, adapter_parameters=[delta],
                              targets=losses.detach().reshape(1, 2).to(torch.float64),
                              balance=balance_weights(stats.norms, opts.balance), n_batches=1, dtype=torch.float64)
    trace = optimise_adapter(problem, opts, opts.steps, opts.lr, generator)
    moved = delta.detach()
    after = toy_losses(base + moved, scale).detach()
    return moved, {"losses_before": losses.tolist(), "losses_after": after.tolist(),
                   "displacement": moved.tolist(), "adapter_steps": trace.steps}


def _adam_step_with_betas(optimizer: torch.optim.Optimizer, x: Tensor, row: int, saved: dict[str, Tensor],
                          sigma: float) -> None:
    """Redo Adam's last update of row ``row`` of ``x`` with (σβ₁, σβ₂) (Eq. 13) from the moments and
    value saved before the step. All starts share one Adam (rows are independent: Adam is element-wise),
    so HTR for one start is this one-row update: v = σβ₁v' + (1 − σβ₁)g, s = σβ₂s' + (1 − σβ₂)g²,
    x = x' − lr·(v/(1 − (σβ₁)^t)) / (√(s/(1 − (σβ₂)^t)) + eps), Adam's update without weight decay."""
    group = optimizer.param_groups[0]
    (b1, b2), lr, eps = group["betas"], group["lr"], group["eps"]
    b1, b2 = sigma * b1, sigma * b2
    state = optimizer.state[x]
    t = float(state["step"])
    g = x.grad[row]
    v = b1 * saved["exp_avg"] + (1 - b1) * g
    s2 = b2 * saved["exp_avg_sq"] + (1 - b2) * g * g
    with torch.no_grad():
        state["exp_avg"][row] = v
        state["exp_avg_sq"][row] = s2
        x[row] = saved["x"] - lr * (v / (1 - b1 ** t)) / ((s2 / (1 - b2 ** t)).sqrt() + eps)


def run_method_with_cost(name: str, steps: int, scale: float = 0.1, lr: float = 1e-3,
                         hparams: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
                         seed: int = 0, starts: Sequence[tuple[float, float]] = START_POINTS,
                         trace_points: int = 500):
    """``name`` + COST from every start point; returns (a :class:`mtlflow.toy_runner.ToyResult` named
    ``"<name>+cost"`` whose ``note`` counts the teleports, the list of teleports).

    The starts are one ``[S, 2]`` parameter stepped by the toy runner's own step (as ``mtlflow toy``);
    a teleport moves one row, and HTR redoes that row's next Adam update with (σβ₁, σβ₂).
    """
    from mtlflow.benchmarks.toy import Toy
    from mtlflow.toy_runner import METHOD_LR, ToyResult, _step, record_outcome, toy_values_and_gradients

    opts = toy_options(options)
    rule = RULES[opts.trigger]
    cls = method_registry.get(name)
    result = ToyResult(f"{name}+cost", cls.family, "ok")
    if cls.custom_step:
        result.status, result.note = "skipped", "owns its training step (custom_step)"
        return result, []
    hp = {**Toy(scale=scale).method_defaults(name), **dict(hparams or {})}
    scale_k = 2.0 if cls.natural_scale == "mean" else 1.0
    x = torch.nn.Parameter(torch.tensor(starts, dtype=torch.float64))
    instances = [method_registry.build(name, 2, **hp) for _ in starts]
    groups: list[dict[str, Any]] = [{"params": [x]}]
    method_params = [p for m in instances for p in m.parameters()]
    if method_params:
        groups.append({"params": method_params, "lr": METHOD_LR})
    optimizer = torch.optim.Adam(groups, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    every = max(1, steps // trace_points)
    trace, trace_steps = [x.detach().clone()], [0]
    teleports: list[dict[str, Any]] = []
    per_epoch = [0] * len(starts)
    started = time.perf_counter()
    for step in range(steps):
        epoch = step // STEPS_PER_EPOCH + 1
        if step % STEPS_PER_EPOCH == 0:
            per_epoch = [0] * len(starts)
        htr: list[tuple[int, dict[str, Tensor], float]] = []
        armed = [s for s in range(len(starts)) if epoch > opts.delay_epochs and per_epoch[s] < opts.max_per_epoch]
        if armed and step % opts.check_every == 0:
            values, jac = toy_values_and_gradients(x.detach().numpy(), scale)
            for s in armed:
                grads = torch.from_numpy(jac[s])
                stats = gradient_stats(grads, pairwise=needs_pairwise(opts.trigger))
                if not rule(stats):
                    continue
                before = x.detach()[s].clone()
                moved, event = _teleport_point(before, grads, torch.from_numpy(values[s]), scale, opts, generator)
                with torch.no_grad():
                    x[s].add_(moved)
                sigma, raw = htr_sigma(moved, grads.mean(dim=0))
                state = optimizer.state.get(x)
                if opts.htr and state:  # no history before the first step: nothing to modulate
                    htr.append((s, {"x": x.detach()[s].clone(), "exp_avg": state["exp_avg"][s].clone(),
                                    "exp_avg_sq": state["exp_avg_sq"][s].clone()}, sigma))
                per_epoch[s] += 1
                teleports.append({"start": s, "step": step, "from": before.tolist(), "to": x.detach()[s].tolist(),
                                  "reason": describe(opts.trigger, stats, ["f1", "f2"]), "sigma": sigma,
                                  "sigma_raw": raw, "htr_applied": bool(opts.htr and state), **event})
        _step(instances, x, optimizer, step, scale, scale_k)
        for s, saved, sigma in htr:
            _adam_step_with_betas(optimizer, x, s, saved, sigma)
        if (step + 1) % every == 0 or step + 1 == steps:
            trace.append(x.detach().clone())
            trace_steps.append(step + 1)
    result.seconds = time.perf_counter() - started
    record_outcome(result, x, scale, trace, trace_steps)
    result.note = f"{len(teleports)} teleports"
    return result, teleports


def plot_cost_pair(base, cost, teleports: list[dict[str, Any]], path, scale: float) -> None:
    """Fig. 6: the base method's trajectories beside base + COST's, teleports drawn as dashed jumps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtlflow import atomic
    from mtlflow.toy import PARETO_X1_RANGE, PARETO_X2

    grid = torch.linspace(-10, 10, 200, dtype=torch.float64)
    g1, g2 = torch.meshgrid(grid, grid, indexing="xy")
    total = toy_losses(torch.stack([g1, g2], dim=-1), scale).sum(-1)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.0))
    colors = plt.get_cmap("tab10")
    for ax, r in zip(axes, (base, cost)):
        ax.contour(g1.numpy(), g2.numpy(), total.numpy(), levels=20, cmap="Greys", linewidths=0.5)
        ax.plot(list(PARETO_X1_RANGE), [PARETO_X2, PARETO_X2], color="tab:green", linewidth=3, alpha=0.6)
        path_xy = torch.tensor(r.trajectory)
        for s in range(path_xy.shape[1]):
            ax.plot(path_xy[:, s, 0], path_xy[:, s, 1], color=colors(s), linewidth=1.2)
            ax.plot(path_xy[0, s, 0], path_xy[0, s, 1], "o", color=colors(s), markersize=4)
            ax.plot(path_xy[-1, s, 0], path_xy[-1, s, 1], "*", color="black", markersize=7)
        if r is cost:
            for t in teleports:
                (a1, a2), (b1, b2) = t["from"], t["to"]
                ax.plot([a1, b1], [a2, b2], "--", color=colors(t["start"]), linewidth=1.0)
                ax.plot(b1, b2, "x", color="red", markersize=4)
        reached = sum(d <= 0.1 for d in r.distances)
        title = f"{r.method}: {reached}/{len(r.distances)} reach the front"
        if r is cost:
            title += f", {len(teleports)} teleports"
        ax.set_title(title, fontsize=9)
        ax.set_xlim(-10, 10)
        ax.set_ylim(-10, 10)
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def add_cost_results(results: list, steps: int, scale: float, lr: float, seed: int,
                     hparams: Mapping[str, Mapping[str, Any]], options: Mapping[str, Any] | None, out_dir,
                     report=None) -> tuple[list, dict[str, list[dict[str, Any]]]]:
    """``mtlflow toy --teleport cost``: after every method that ran, the same method + COST; writes
    ``cost-<method>.png`` (Fig. 6: the method beside method + COST) into ``out_dir``. Returns the results
    with the COST rows inserted after their base rows, and the teleports of each COST row."""
    from pathlib import Path

    toy_options(options)  # validated before the long runs
    merged, teleports = [], {}
    for base in results:
        merged.append(base)
        if base.status != "ok":
            continue
        cost, events = run_method_with_cost(base.method, steps, scale, lr, hparams.get(base.method), options, seed)
        merged.append(report(cost) if report is not None else cost)
        teleports[cost.method] = events
        plot_cost_pair(base, cost, events, Path(out_dir) / f"cost-{base.method}.png", scale)
    return merged, teleports
