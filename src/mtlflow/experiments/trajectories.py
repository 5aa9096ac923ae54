"""``mtlflow toy``: every registered method on CAGrad's toy problem from the 5 standard start points.

The five start points of the Nash-MTL/FAMO toy experiments are optimised together as one ``[5, 2]``
parameter X (Adam, lr 1e-3, as the reference scripts). Start s only influences row s of X and Adam
is element-wise, so this is exactly five independent runs, at the cost of one. Each start has its own
instance of the method (its own state: FAMO's logits, a warm start, a random generator ...):

* loss weighting: Σ_s objective_s(L(x_s)) is back-propagated; the method's own parameters (UW,
  GradNorm) are updated by the same Adam with ``method_lr`` 0.025, as the trainer does;
* gradient methods: per start, the per-task gradients ``[2, 2]`` (one autograd call per task for all
  starts) go through the method's ``combine`` (or ``weights_from_gramian``, reused between solves when
  the method declares ``update_weights_every``); MGDA-UB's representation is the point itself;
* the trainer's conventions apply unchanged: global rescaling ×K for ``natural_scale = "mean"``, the
  hooks ``setup`` (with a trainer-like view whose model is the batched toy model), ``before_backward``
  and ``after_optimizer_step`` (``recompute_losses`` re-evaluates L at the updated point, as FAMO needs);
  hyper-parameter defaults of the toy benchmark (FAMO's ``min_losses``) via :func:`mtlflow.jobs.resolved_hparams`.

Methods that own the training step (``custom_step``) are skipped with a note. The output directory
gets ``toy.json`` (everything, including the trajectories), ``toy.md`` (tables) and ``toy.png``
(trajectories over the contours of L1 + L2). Step count: 35,000 by default (Nash-MTL's
``n_epochs``; FAMO's script uses 50,000: ``--steps 50000``).
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mtlflow import methods as method_registry
from mtlflow.benchmarks.toy import (
    LOWER,
    PARETO_X1_RANGE,
    PARETO_X2,
    START_POINTS,
    Toy,
    ToyObjective,
    distance_to_pareto_set,
    toy_losses,
)
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError, MtlflowError
from mtlflow.engine.step import clip_gradients, update_scale
from mtlflow.jobs import resolved_hparams
from mtlflow.methods.base import GradientMethod, GramianWeighting, LossWeighting, Method, StepContext
from mtlflow.methods.solvers import two_task_min_norm
from mtlflow.models.base import MultiTaskModel
from mtlflow.teleport import validate as teleport_validate
from mtlflow.teleport.htr import htr_sigma
from mtlflow.teleport.objective import TeleportProblem, balance_weights, optimise_adapter
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import RULES, describe, gradient_stats, needs_pairwise

DEFAULT_STEPS = 35_000
DEFAULT_LR = 1e-3
METHOD_LR = 0.025
#: a start "reaches the Pareto front" when its final point is this close to the Pareto set
REACHED_TOLERANCE = 0.1
MAX_TRACE_POINTS = 500


@dataclass
class ToyResult:
    """One method from every start point."""

    method: str
    family: str
    status: str  # "ok", "skipped" or "failed"
    note: str = ""
    seconds: float = 0.0
    final_points: list[list[float]] = field(default_factory=list)
    final_losses: list[list[float]] = field(default_factory=list)
    distances: list[float] = field(default_factory=list)
    stationarity: list[float] = field(default_factory=list)
    trace_steps: list[int] = field(default_factory=list)
    #: [T][S][2] points along the way (every ``steps / 500`` steps)
    trajectory: list[list[list[float]]] = field(default_factory=list)

    @property
    def reached(self) -> int:
        return sum(d <= REACHED_TOLERANCE for d in self.distances)


class _BatchedPoints(nn.Module):
    """The toy "trunk": all start points as one ``[S, 2]`` parameter."""

    def __init__(self, starts: Tensor):
        super().__init__()
        self.x = nn.Parameter(starts.clone())

    def forward(self, _: Any = None) -> Tensor:
        return self.x


def toy_values_and_gradients(x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Losses ``[S, 2]`` and per-task gradients ``[S, 2 (tasks), 2 (x1, x2)]`` at the points ``x [S, 2]``.

    The closed-form derivatives of :func:`mtlflow.benchmarks.toy.toy_losses` (same conventions: the log's clamp
    at LOWER has zero slope, the gates max(tanh(·), 0) have the slope of tanh at 0), in numpy: tens of
    microseconds for all starts instead of milliseconds for a torch autograd graph.
    """
    x1, x2 = x[:, 0], x[:, 1]
    t2, th = np.tanh(x2), np.tanh(0.5 * x2)
    a1 = -0.5 * x1 - 3.5 + t2          # 0.5(-x1 - 7) - tanh(-x2)
    a2 = -0.5 * x1 + 3.5 - t2          # 0.5(-x1 + 3) + tanh(-x2) + 2
    abs1, abs2 = np.abs(a1), np.abs(a2)
    f1a = np.log(np.maximum(abs1, LOWER)) + 6
    f2a = np.log(np.maximum(abs2, LOWER)) + 6
    # d log|a| = da / a where |a| > LOWER, else 0 (the clamp)
    inv1 = np.where(abs1 > LOWER, 1.0 / np.where(a1 == 0, 1.0, a1), 0.0)
    inv2 = np.where(abs2 > LOWER, 1.0 / np.where(a2 == 0, 1.0, a2), 0.0)
    sech2 = 1.0 - t2 * t2
    f1b = ((7 - x1) ** 2 + 0.1 * (x2 + 8) ** 2) / 10 - 20
    f2b = ((x1 + 7) ** 2 + 0.1 * (x2 + 8) ** 2) / 10 - 20
    upper = th >= 0  # c1 = max(tanh(x2/2), 0) is active; c2 = max(-tanh(x2/2), 0) is active where th <= 0
    lower_half = th <= 0
    c1, c2 = np.where(upper, th, 0.0), np.where(lower_half, -th, 0.0)
    slope = 0.5 * (1.0 - th * th)
    dc1, dc2 = np.where(upper, slope, 0.0), np.where(lower_half, -slope, 0.0)
    out = np.empty((x.shape[0], 2))
    grads = np.empty((x.shape[0], 2, 2))
    out[:, 0] = scale * (c1 * f1a + c2 * f1b)
    out[:, 1] = c1 * f2a + c2 * f2b
    grads[:, 0, 0] = scale * (-0.5 * c1 * inv1 + c2 * (x1 - 7) / 5)
    grads[:, 0, 1] = scale * (c1 * sech2 * inv1 + dc1 * f1a + c2 * 0.02 * (x2 + 8) + dc2 * f1b)
    grads[:, 1, 0] = -0.5 * c1 * inv2 + c2 * (x1 + 7) / 5
    grads[:, 1, 1] = -c1 * sech2 * inv2 + dc1 * f2a + c2 * 0.02 * (x2 + 8) + dc2 * f2b
    return out, grads


def toy_gradients(x: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """:func:`toy_values_and_gradients` on a float64 tensor ``[S, 2]``, as tensors."""
    losses, grads = toy_values_and_gradients(x.detach().to("cpu", torch.float64).numpy(), scale)
    return torch.from_numpy(losses), torch.from_numpy(grads)


def pareto_stationarity(grads: Tensor) -> Tensor:
    """‖min-norm convex combination of the two task gradients‖ per start (``grads [S, 2, 2]``)."""
    out = []
    for g in grads.to(torch.float64):
        gamma = two_task_min_norm(float(g[0] @ g[0]), float(g[0] @ g[1]), float(g[1] @ g[1]))
        out.append(float((gamma * g[0] + (1 - gamma) * g[1]).norm()))
    return torch.tensor(out, dtype=torch.float64)


def run_method(name: str, steps: int = DEFAULT_STEPS, scale: float = 0.1, lr: float = DEFAULT_LR,
               hparams: dict[str, Any] | None = None, seed: int = 0,
               starts: Sequence[tuple[float, float]] = START_POINTS) -> ToyResult:
    """Optimise the toy problem with method ``name`` from every start point at once."""
    cls = method_registry.get(name)
    result = ToyResult(name, cls.family, "ok")
    if cls.custom_step:
        result.status, result.note = "skipped", "owns its training step (custom_step); run it with `mtlflow train`"
        return result
    hp = resolved_hparams(Toy(scale=scale), name, hparams)
    n_starts = len(starts)
    instances = [method_registry.build(name, 2, seed, **hp) for _ in range(n_starts)]
    model = MultiTaskModel(_BatchedPoints(torch.tensor(starts, dtype=torch.float64)),
                           [ToyObjective(0, scale), ToyObjective(1, scale)], ["f1", "f2"])
    x = model.trunk.x
    view = SimpleNamespace(model=model, config=RunConfig(method=name, hparams=hp, seed=seed, lr=lr),
                           shared=[x], task_params=[[], []], tasks=["f1", "f2"])
    try:
        for m in instances:
            m.setup(view)
    except (AttributeError, TypeError) as exc:
        result.status, result.note = "skipped", f"setup needs the full trainer ({type(exc).__name__}: {exc})"
        return result
    optimizer = _adam(x, instances, lr)
    scale_k = update_scale(instances[0].natural_scale, n_tasks=2)  # the instance's: --hp scale_convention
    every = max(1, steps // MAX_TRACE_POINTS)
    trace, trace_steps = [x.detach().clone()], [0]
    started = time.perf_counter()
    try:
        for step in range(steps):
            _step(instances, x, optimizer, step, scale, scale_k)
            if (step + 1) % every == 0 or step + 1 == steps:
                trace.append(x.detach().clone())
                trace_steps.append(step + 1)
    except MtlflowError as exc:
        result.status, result.note = "failed", f"step {step}: {exc}"
    result.seconds = time.perf_counter() - started
    record_outcome(result, x, scale, trace, trace_steps)
    return result


def _adam(x: Tensor, instances: Sequence[Method], lr: float) -> torch.optim.Optimizer:
    """One Adam for the points ``x`` (``lr``) and the methods' own parameters (:data:`METHOD_LR`), as the trainer's."""
    groups: list[dict[str, Any]] = [{"params": [x]}]
    method_params = [p for m in instances for p in m.parameters()]
    if method_params:
        groups.append({"params": method_params, "lr": METHOD_LR})
    return torch.optim.Adam(groups, lr=lr)


def record_outcome(result: ToyResult, x: Tensor, scale: float, trace: Sequence[Tensor],
                   trace_steps: Sequence[int]) -> None:
    """Fill ``result`` with the final points, their losses, distances to the Pareto set and
    Pareto-stationarity, and the recorded trajectory."""
    final = x.detach()
    losses, grads = toy_gradients(final, scale)
    result.final_points = final.tolist()
    result.final_losses = losses.tolist()
    result.distances = distance_to_pareto_set(final).tolist()
    result.stationarity = pareto_stationarity(grads).tolist()
    result.trace_steps = list(trace_steps)
    result.trajectory = torch.stack(list(trace)).tolist()


def _step(instances: Sequence[Method], x: Tensor, optimizer: torch.optim.Optimizer, step: int, scale: float,
          scale_k: float) -> None:
    optimizer.zero_grad(set_to_none=True)
    values, jacobians = toy_values_and_gradients(x.detach().numpy(), scale)  # row s depends on x_s only
    if not (np.isfinite(values).all() and np.isfinite(jacobians).all()):
        raise InvalidParameterError(f"non-finite toy losses {values.tolist()} at {x.detach().tolist()}")
    detached, grads = torch.from_numpy(values), torch.from_numpy(jacobians)
    contexts = [StepContext(step=step, epoch=1, losses=detached[s],
                            recompute_losses=lambda s=s: toy_gradients(x[s:s + 1], scale)[0][0])
                for s in range(len(instances))]
    first = instances[0]
    if isinstance(first, LossWeighting):
        # L(x0) + ∇L(x0)·(x - x0): the exact values and first derivatives at x0 in a 3-op graph, so
        # objectives (and GradNorm's gradient norms) are differentiated through x as in the trainer
        losses = detached + ((x - x.detach()).unsqueeze(1) * grads).sum(-1)
        for m, ctx in zip(instances, contexts, strict=True):
            m.before_backward(ctx)
        total = sum(m.objective(losses[s]) for s, m in enumerate(instances))
        (total * scale_k).backward()
    elif isinstance(first, GradientMethod):
        directions = []
        for s, m in enumerate(instances):
            m.before_backward(contexts[s])
            directions.append(_direction(m, grads[s], detached[s], step))
        x.grad = torch.stack(directions).to(x) * scale_k
        if not torch.isfinite(x.grad).all():
            raise InvalidParameterError(f"{first.name} produced a non-finite update")
    else:
        raise InvalidParameterError(f"{first.name} is neither loss weighting nor a gradient method")
    clip_gradients([x], [x], None, first)  # the trainer's rule; the toy run sets no global clipping
    optimizer.step()
    for m, ctx in zip(instances, contexts, strict=True):
        m.after_optimizer_step(ctx)


def _direction(method: GradientMethod, grads: Tensor, losses: Tensor, step: int) -> Tensor:
    """The method's direction for one start, reusing Gramian weights between solves like the trainer."""
    if isinstance(method, GramianWeighting):
        every = method.update_weights_every()
        if every > 1 and step % every != 0 and method.last_weights is not None:
            return method.last_weights.to(grads) @ grads
    return method.combine(grads, losses)


# -- outputs ---------------------------------------------------------------------------------------

def resolve_methods(spec: str) -> list[str]:
    """``all`` or a comma-separated list of registered method names."""
    available = method_registry.available()
    if spec.strip() == "all":
        return available
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise InvalidParameterError("--methods is empty; give 'all' or a comma-separated list of methods")
    for n in names:
        method_registry.get(n)  # unknown names -> UnknownNameError with the valid ones
    return names


def _single_threaded() -> None:
    torch.set_num_threads(1)


def run_toy(method_names: Sequence[str], out_dir: str | Path, steps: int = DEFAULT_STEPS, scale: float = 0.1,
            lr: float = DEFAULT_LR, seed: int = 0, hparams: dict[str, dict[str, Any]] | None = None,
            progress: bool = True, jobs: int = 1, teleport: str | None = None,
            teleport_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every method (``jobs`` methods at a time in worker processes), then write ``toy.json``,
    ``toy.md`` and ``toy.png`` into ``out_dir``. ``teleport="cost"`` adds each method + COST after it
    and ``cost-<method>.png`` (the COST paper's Fig. 6), see :func:`add_cost_results`."""
    if steps < 1:
        raise InvalidParameterError(f"--steps must be >= 1, got {steps}")
    if not (scale > 0 and math.isfinite(scale)):
        raise InvalidParameterError(f"--scale must be a positive number, got {scale}")
    if not (lr > 0 and math.isfinite(lr)):
        raise InvalidParameterError(f"--lr must be a positive number, got {lr}")
    if jobs < 1:
        raise InvalidParameterError(f"--jobs must be >= 1, got {jobs}")
    hparams = hparams or {}
    for name, hp in hparams.items():  # validate before the long runs
        method_registry.build(name, 2, **hp)
    if teleport:
        teleport_validate(teleport, teleport_options)
        toy_options(teleport_options)

    def report(result: ToyResult) -> ToyResult:
        if progress:
            reached = f"{result.reached}/{len(START_POINTS)} reach the front" if result.status == "ok" else result.note
            print(f"toy: {result.method:<12} {result.status:<8} {result.seconds:7.1f} s  {reached}", flush=True)
        return result

    kwargs = [dict(name=n, steps=steps, scale=scale, lr=lr, hparams=hparams.get(n), seed=seed) for n in method_names]
    if jobs == 1:
        results = [report(run_method(**kw)) for kw in kwargs]
    else:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_single_threaded) as pool:
            futures = [pool.submit(run_method, **kw) for kw in kwargs]
            results = [report(f.result()) for f in futures]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teleports: dict[str, Any] = {}
    if teleport:
        results, teleports = add_cost_results(results, steps, scale, lr, seed, hparams, teleport_options, out, report)
    summary = {
        "schema": 1,
        "problem": "CAGrad toy (Liu et al. 2021) with Nash-MTL/FAMO imbalance scale",
        "scale": scale, "steps": steps, "optimizer": "adam", "lr": lr, "method_lr": METHOD_LR, "seed": seed,
        "start_points": [list(p) for p in START_POINTS],
        "pareto_set": {"x2": PARETO_X2, "x1_range": list(PARETO_X1_RANGE)},
        "reached_tolerance": REACHED_TOLERANCE,
        "methods": [r.__dict__ | {"reached": r.reached} for r in results],
    }
    if teleport:
        summary["teleports"] = teleports
    atomic.write_json(out / "toy.json", summary)
    atomic.write_text(out / "toy.md", markdown_tables(results, steps, scale, lr))
    plot_trajectories(results, out / "toy.png", scale)
    return summary


def markdown_tables(results: Sequence[ToyResult], steps: int, scale: float, lr: float) -> str:
    lines = [f"# Toy problem: {steps} Adam steps (lr {lr}), scale {scale}, 5 start points", "",
             f"Reached = final distance to the Pareto set (x2 = {PARETO_X2}, x1 in [-7, 7]) <= {REACHED_TOLERANCE}. "
             "Stationarity = norm of the min-norm convex combination of the two task gradients.", "",
             "| method | family | status | reached | max distance | max stationarity | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.status == "skipped" or not r.distances:
            lines.append(f"| {r.method} | {r.family} | {r.status}: {r.note} | - | - | - | - |")
            continue
        status = r.status if r.status == "ok" else f"{r.status}: {r.note}"
        lines.append(f"| {r.method} | {r.family} | {status} | {r.reached}/{len(r.distances)} | "
                     f"{max(r.distances):.4f} | {max(r.stationarity):.2e} | {r.seconds:.1f} |")
    lines += ["", "## Per start point", "",
              "| method | start | final x | L1 | L2 | distance | stationarity |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for s, start in enumerate(START_POINTS[:len(r.distances)]):
            x1, x2 = r.final_points[s]
            l1, l2 = r.final_losses[s]
            lines.append(f"| {r.method} | ({start[0]:g}, {start[1]:g}) | ({x1:.4f}, {x2:.4f}) | {l1:.4f} | {l2:.4f} | "
                         f"{r.distances[s]:.4f} | {r.stationarity[s]:.2e} |")
    return "\n".join(lines) + "\n"


def plot_trajectories(results: Sequence[ToyResult], path: Path, scale: float) -> None:
    """One panel per method: trajectories from every start over the contours of L1 + L2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.trajectory]
    n = max(len(shown), 1)
    cols = min(5, n)
    rows = math.ceil(n / cols)
    contours = _loss_contours(scale)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, r in zip(axes.flat, shown, strict=False):  # the grid may have more cells than results
        starts = _draw_trajectories(ax, r, contours, colors, end_marker_size=6)
        ax.set_title(f"{r.method} ({r.reached}/{starts})" if r.status == "ok" else f"{r.method} ({r.status})",
                     fontsize=9)
        ax.tick_params(labelsize=6)
    _save_figure(fig, path)


def _loss_contours(scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x1, x2, L1 + L2) on the 200 x 200 grid of [-10, 10]² that the figures draw the contours of."""
    grid = torch.linspace(-10, 10, 200, dtype=torch.float64)
    g1, g2 = torch.meshgrid(grid, grid, indexing="xy")
    total = toy_losses(torch.stack([g1, g2], dim=-1), scale).sum(-1)
    return g1.numpy(), g2.numpy(), total.numpy()


def _draw_trajectories(ax: Any, result: ToyResult, contours: tuple[np.ndarray, np.ndarray, np.ndarray], colors: Any,
                       end_marker_size: float) -> int:
    """One panel: the loss contours, the Pareto set, and ``result``'s trajectory from every start (a dot at
    the start, a star at the end) on [-10, 10]²; returns the number of starts."""
    ax.contour(*contours, levels=20, cmap="Greys", linewidths=0.5)
    ax.plot(list(PARETO_X1_RANGE), [PARETO_X2, PARETO_X2], color="tab:green", linewidth=3, alpha=0.6)
    path_xy = torch.tensor(result.trajectory)  # [T, S, 2]
    for s in range(path_xy.shape[1]):
        ax.plot(path_xy[:, s, 0], path_xy[:, s, 1], color=colors(s), linewidth=1.2)
        ax.plot(path_xy[0, s, 0], path_xy[0, s, 1], "o", color=colors(s), markersize=4)
        ax.plot(path_xy[-1, s, 0], path_xy[-1, s, 1], "*", color="black", markersize=end_marker_size)
    ax.set_xlim(-10, 10)
    ax.set_ylim(-10, 10)
    return path_xy.shape[1]


def _save_figure(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


# -- COST on the toy problem (``mtlflow toy --teleport cost``) -------------------------------------

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
    """``name`` + COST from every start point; returns (a :class:`mtlflow.experiments.trajectories.ToyResult` named
    ``"<name>+cost"`` whose ``note`` counts the teleports, the list of teleports).

    The starts are one ``[S, 2]`` parameter stepped by the toy runner's own step (as ``mtlflow toy``);
    a teleport moves one row, and HTR redoes that row's next Adam update with (σβ₁, σβ₂).
    """
    opts = toy_options(options)
    rule = RULES[opts.trigger]
    cls = method_registry.get(name)
    result = ToyResult(f"{name}+cost", cls.family, "ok")
    if cls.custom_step:
        result.status, result.note = "skipped", "owns its training step (custom_step)"
        return result, []
    hp = resolved_hparams(Toy(scale=scale), name, hparams)
    x = torch.nn.Parameter(torch.tensor(starts, dtype=torch.float64))
    instances = [method_registry.build(name, 2, **hp) for _ in starts]
    scale_k = update_scale(instances[0].natural_scale, n_tasks=2)  # the instance's: --hp scale_convention
    optimizer = _adam(x, instances, lr)
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


def plot_cost_pair(base: ToyResult, cost: ToyResult, teleports: list[dict[str, Any]], path: Path,
                   scale: float) -> None:
    """Fig. 6: the base method's trajectories beside base + COST's, teleports drawn as dashed jumps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contours = _loss_contours(scale)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.0))
    colors = plt.get_cmap("tab10")
    for ax, r in zip(axes, (base, cost), strict=True):
        _draw_trajectories(ax, r, contours, colors, end_marker_size=7)
        title = f"{r.method}: {r.reached}/{len(r.distances)} reach the front"
        if r is cost:
            for t in teleports:
                (a1, a2), (b1, b2) = t["from"], t["to"]
                ax.plot([a1, b1], [a2, b2], "--", color=colors(t["start"]), linewidth=1.0)
                ax.plot(b1, b2, "x", color="red", markersize=4)
            title += f", {len(teleports)} teleports"
        ax.set_title(title, fontsize=9)
    _save_figure(fig, path)


def add_cost_results(results: list, steps: int, scale: float, lr: float, seed: int,
                     hparams: Mapping[str, Mapping[str, Any]], options: Mapping[str, Any] | None, out_dir,
                     report=None) -> tuple[list, dict[str, list[dict[str, Any]]]]:
    """``mtlflow toy --teleport cost``: after every method that ran, the same method + COST; writes
    ``cost-<method>.png`` (Fig. 6: the method beside method + COST) into ``out_dir``. Returns the results
    with the COST rows inserted after their base rows, and the teleports of each COST row."""
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
