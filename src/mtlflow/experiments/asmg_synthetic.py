"""ASMG's synthetic experiment (Ye, PhD thesis UTS 2024, Section 4.6.1, Figs. 4.1-4.3) as one command.

``mtlflow asmg-synthetic`` runs ASMG (and optionally the ASMG-EW ablation) on the problems of
:mod:`mtlflow.benchmarks.asmg_synthetic` for every sample size N and seed, from μ_0 ~ U[0, 1]^d with
Σ_0 = I, β = 0.1 and γ_t = 1/(t+1) (the thesis' settings), and writes

* ``convergence.png`` -- ℰ = dist(μ_t, P) (mean over seeds, log scale) against the iteration, one panel
  per problem, one line per N (dashed: ASMG-EW), the 1e-4 target as a dotted line;
* ``results.md`` / ``results.json`` -- per problem, N and method: the final and best ℰ (mean over
  seeds), the first iteration and the number of function evaluations (iterations × (N + 1) vector
  queries) at which every seed reached the target, and the wall time.

The thesis states no iteration budget; a run stops at ``iterations`` or once ℰ ≤ ``stop_at``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtlflow.benchmarks.asmg_synthetic import PROBLEMS, start_point
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.methods._blackbox import ASMGConfig, minimize

METHODS = {"asmg": "adaptive", "asmg-ew": "equal"}


def run_one(problem: str, n_samples: int, seed: int, dim: int, iterations: int, beta: float, update: str,
            weighting: str, record_every: int, stop_at: float) -> dict[str, Any]:
    """One ASMG run; ℰ recorded every ``record_every`` iterations (and at the last one)."""
    spec = PROBLEMS[problem]
    curve: list[tuple[int, float]] = [(0, float(spec.distance(start_point(dim, seed))))]

    def record(t: int, optimizer, step) -> bool:
        error = float(spec.distance(optimizer.mean))
        if (t + 1) % record_every == 0 or error <= stop_at:
            curve.append((t + 1, error))
        return error <= stop_at

    started = time.perf_counter()
    config = ASMGConfig(beta=beta, n_samples=n_samples, sigma0=1.0, update=update, weighting=weighting)
    optimizer = minimize(spec.objectives, start_point(dim, seed), iterations, config, seed=seed, callback=record)
    final = float(spec.distance(optimizer.mean))
    if curve[-1][0] != optimizer.t:
        curve.append((optimizer.t, final))
    return {"problem": problem, "n_samples": n_samples, "seed": seed, "iterations": optimizer.t, "final": final,
            "curve": curve, "clipped": optimizer.clipped, "seconds": time.perf_counter() - started}


def _reached(curve: Sequence[Sequence[float]], target: float) -> int | None:
    return next((int(t) for t, e in curve if e <= target), None)


def summarise(runs: Sequence[dict[str, Any]], target: float) -> dict[str, Any]:
    """Mean over seeds of one (problem, N, method) cell."""
    reached = [_reached(r["curve"], target) for r in runs]
    n = runs[0]["n_samples"]
    all_reached = None if any(t is None for t in reached) else max(reached)
    return {"problem": runs[0]["problem"], "method": runs[0]["method"], "n_samples": n,
            "final_mean": statistics.fmean(r["final"] for r in runs),
            "best_mean": statistics.fmean(min(e for _, e in r["curve"]) for r in runs),
            "seeds_reaching_target": sum(t is not None for t in reached), "seeds": len(runs),
            "iterations_to_target": all_reached,
            "evaluations_to_target": None if all_reached is None else all_reached * (n + 1),
            "iterations": max(r["iterations"] for r in runs), "clipped": sum(r["clipped"] for r in runs),
            "seconds": statistics.fmean(r["seconds"] for r in runs)}


def mean_curve(runs: Sequence[dict[str, Any]], floor: float = 1e-12) -> tuple[list[int], list[float]]:
    """ℰ averaged over seeds on the common recorded iterations; a run that stopped early keeps its last ℰ."""
    steps = sorted({t for r in runs for t, _ in r["curve"]})
    means = []
    for step in steps:
        values = []
        for r in runs:
            before = [e for t, e in r["curve"] if t <= step]
            values.append(before[-1] if before else r["curve"][0][1])
        means.append(max(statistics.fmean(values), floor))
    return steps, means


def plot(cells: dict[tuple[str, str, int], list[dict[str, Any]]], problems: Sequence[str], target: float,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(problems), figsize=(5 * len(problems), 4), squeeze=False)
    colors = {}
    for (problem, method, n), runs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        ax = axes[0][problems.index(problem)]
        steps, means = mean_curve(runs)
        color = colors.setdefault(n, f"C{len(colors)}")
        ax.plot(steps, means, color=color, linestyle="-" if method == "asmg" else "--",
                label=f"{method.upper()} N={n}")
    for ax, problem in zip(axes[0], problems, strict=True):
        ax.axhline(target, color="gray", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_title(f"{problem} ({PROBLEMS[problem].equation})")
        ax.set_xlabel("iteration")
        ax.set_ylabel("ℰ = dist(μ, P)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def markdown(summary: dict[str, Any]) -> str:
    s = summary["setting"]
    lines = [f"ASMG on the synthetic problems (d = {s['dim']}, β = {s['beta']}, update = {s['update']}, "
             f"{len(s['seeds'])} seeds, target ℰ ≤ {s['target']:g}); evaluations = iterations × (N + 1).", "",
             "| problem | method | N | final ℰ (mean) | best ℰ (mean) | seeds at target | iterations to target | "
             "evaluations to target | iterations run | s/run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary["cells"]:
        to_it = "-" if c["iterations_to_target"] is None else str(c["iterations_to_target"])
        to_ev = "-" if c["evaluations_to_target"] is None else str(c["evaluations_to_target"])
        lines.append(f"| {c['problem']} | {c['method']} | {c['n_samples']} | {c['final_mean']:.2e} | "
                     f"{c['best_mean']:.2e} | {c['seeds_reaching_target']}/{c['seeds']} | {to_it} | {to_ev} | "
                     f"{c['iterations']} | {c['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def run_synthetic(out_dir: str | Path, problems: Sequence[str] = tuple(PROBLEMS),
                  sample_sizes: Sequence[int] = (10, 50, 100), seeds: Sequence[int] = (0, 1, 2),
                  methods: Sequence[str] = ("asmg",), dim: int = 100, iterations: int = 8000, beta: float = 0.1,
                  update: str = "normalized", target: float = 1e-4, stop_at: float = 1e-6, record_every: int = 25,
                  progress: bool = True) -> dict[str, Any]:
    """Run the grid and write ``convergence.png``, ``results.md`` and ``results.json`` into ``out_dir``."""
    unknown = sorted(set(problems) - set(PROBLEMS))
    if unknown:
        raise InvalidParameterError(f"unknown problem(s) {', '.join(unknown)}; valid: {', '.join(PROBLEMS)}")
    bad_methods = sorted(set(methods) - set(METHODS))
    if bad_methods:
        raise InvalidParameterError(f"unknown method(s) {', '.join(bad_methods)}; valid: {', '.join(METHODS)}")
    if not sample_sizes or any(n < 2 for n in sample_sizes):
        raise InvalidParameterError("--n must list sample sizes >= 2, e.g. 10,50,100")
    if iterations < 1 or dim < 2 or not seeds:
        raise InvalidParameterError("--iterations must be >= 1, --dim >= 2 and --seeds non-empty")
    out_dir = Path(out_dir)
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for problem in problems:
        for n in sample_sizes:
            for method in methods:
                for seed in seeds:
                    run = run_one(problem, n, seed, dim, iterations, beta, update, METHODS[method], record_every,
                                  stop_at)
                    run["method"] = method
                    cells.setdefault((problem, method, n), []).append(run)
                    if progress:
                        print(f"asmg-synthetic: {problem} {method} N={n} seed={seed}: ℰ = {run['final']:.2e} after "
                              f"{run['iterations']} iterations ({run['seconds']:.1f} s)", flush=True)
    summary = {"setting": {"dim": dim, "beta": beta, "update": update, "sigma0": 1.0, "gamma": "1/(t+1)",
                           "start": "U[0,1]^d", "seeds": list(seeds), "iterations": iterations, "target": target,
                           "stop_at": stop_at, "torch_threads": torch.get_num_threads()},
               "cells": [summarise(runs, target) for runs in cells.values()],
               "runs": [r for runs in cells.values() for r in runs]}
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(cells, list(problems), target, out_dir / "convergence.png")
    atomic.write_json(out_dir / "results.json", summary)
    atomic.write_text(out_dir / "results.md", markdown(summary))
    return summary
