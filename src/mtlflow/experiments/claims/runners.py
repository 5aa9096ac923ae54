"""The runners of the claims: each a :class:`~mtlflow.experiments.claims.model.SeedwiseRunner` over an existing
experiment or job (:mod:`mtlflow.experiments.trajectories`, :mod:`~mtlflow.experiments.asmg_synthetic`,
:mod:`~mtlflow.experiments.bench`, :mod:`~mtlflow.experiments.cost_mechanism`, :func:`mtlflow.jobs.train`,
:func:`mtlflow.jobs.evaluate`, :func:`mtlflow.jobs.palora.overhead_table`): nothing here trains by itself. Each
imports its experiment when it runs: they load torch (2 s), which listing, judging and tabulating the claims do
not need."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments.claims.model import RunContext, SeedwiseRunner


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's CPU threads set to ``threads`` for the block (None: unchanged); small problems run faster on one."""
    import torch  # noqa: PLC0415 (lazy: loads torch)

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _toy_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.trajectories import run_method_with_cost  # noqa: PLC0415 (lazy: loads torch)

    method = config.get("method", "ls")
    with _torch_threads(config.get("threads")):
        result, teleports = run_method_with_cost(method, int(config["steps"]), seed=seed,
                                                 options=config.get("teleport_options"))
    ctx.say(f"{method}+cost seed {seed}: {result.reached}/{len(result.distances)} ({len(teleports)} teleports)")
    return {"value": float(result.reached), "detail": {"seed": seed, "reached": result.reached,
                                                       "teleports": len(teleports), "distances": result.distances,
                                                       "seconds": result.seconds}}


def _toy_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.trajectories import run_method  # noqa: PLC0415 (lazy: loads torch)

    method = config.get("method", "ls")
    with _torch_threads(config.get("threads")):
        base = run_method(method, steps=int(config["steps"]))
    ctx.say(f"{method}: {base.reached}/{len(base.distances)} starts reach the Pareto set ({base.seconds:.1f} s)")
    return {"values": [p["value"] for p in parts],
            "details": {"base_reached": base.reached, "base_distances": base.distances,
                        "per_seed": [p["detail"] for p in parts]}}


#: COST Fig. 6: starts (of 5) from which LS + COST reaches the Pareto set, one value per seed (COST's teleports
#: are seeded; LS alone is deterministic and run once, when the seeds are combined, as the baseline)
run_toy_escape = SeedwiseRunner(_toy_seed, _toy_combine)


def _asmg_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's share of (problem, N) cells whose ℰ reaches the target, and the cells."""
    from mtlflow.benchmarks.asmg_synthetic import PROBLEMS  # noqa: PLC0415 (lazy: loads torch)
    from mtlflow.experiments.asmg_synthetic import METHODS, _reached, run_one  # noqa: PLC0415 (lazy: loads torch)

    problems = list(config.get("problems", PROBLEMS))
    target = float(config["target"])
    reached, cells = 0, []
    with _torch_threads(config.get("threads")):
        for problem in problems:
            for n in config["sample_sizes"]:
                run = run_one(problem, int(n), seed, int(config["dim"]), int(config["iterations"]),
                              float(config.get("beta", 0.1)), config.get("update", "normalized"),
                              METHODS[config.get("method", "asmg")], 25, float(config.get("stop_at", 1e-6)))
                at = _reached(run["curve"], target)
                reached += at is not None
                cells.append({"seed": seed, "problem": problem, "n_samples": n, "final": run["final"],
                              "iterations_to_target": at, "seconds": run["seconds"]})
                ctx.say(f"asmg {problem} N={n} seed {seed}: ℰ = {run['final']:.2e}")
    return {"value": reached / (len(problems) * len(config["sample_sizes"])), "cells": cells}


def _asmg_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    return {"values": [p["value"] for p in parts], "details": {"cells": [c for p in parts for c in p["cells"]]}}


#: Thesis Sec. 4.6.1: per seed, the share of (problem, N) cells whose ℰ reaches the target
run_asmg_table = SeedwiseRunner(_asmg_seed, _asmg_combine)

def _repeats(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], ctx: RunContext) -> dict[str, Any]:
    """The timing runners' combination: one value and one row per repeat (seed)."""
    return {"values": [p["value"] for p in parts], "details": {"repeats": [p["repeat"] for p in parts]}}


def _step_ratio_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    import torch  # noqa: PLC0415 (lazy: loads torch)

    from mtlflow.experiments.bench import run_bench  # noqa: PLC0415 (lazy: loads torch)

    method = config["method"]
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        summary = run_bench(tmp, [method], [int(config["tasks"])], steps=int(config["steps"]),
                            warmup=int(config["warmup"]), batch_size=int(config["batch_size"]),
                            width=int(config["width"]), image_size=int(config["image_size"]),
                            device=ctx.device, engine_rows=[], threads=config.get("threads"), progress=False)
    row = next(r for r in summary["methods"] if r["method"] == method)
    ls = next(r for r in summary["methods"] if r["method"] == "ls")
    if row["ratio_to_ls"] is None:
        raise InvalidParameterError(f"{method} could not be timed: {row['status']}")
    ctx.say(f"{method} repeat {seed}: {row['ratio_to_ls']:.3f} x LS")
    return {"value": float(row["ratio_to_ls"]),
            "repeat": {"seed": seed, "step_seconds": row["step_seconds_median"],
                       "ls_step_seconds": ls["step_seconds_median"], "ratio_to_ls": row["ratio_to_ls"]}}


#: median step time of ``method`` over LS's (`mtlflow bench`), one repeat per seed
run_step_ratio = SeedwiseRunner(_step_ratio_seed, _repeats)


def _cost_overhead_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    import torch  # noqa: PLC0415 (lazy: loads torch)

    from mtlflow.experiments.bench import run_bench  # noqa: PLC0415 (lazy: loads torch)

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        summary = run_bench(tmp, [config["method"]], [int(config["tasks"])], steps=1, warmup=0,
                            batch_size=int(config["batch_size"]), width=int(config["width"]),
                            image_size=int(config["image_size"]), device=ctx.device, engine_rows=[],
                            threads=config.get("threads"), progress=False, teleport="cost",
                            teleport_options=dict(config.get("teleport_options", {})),
                            cost_epoch_steps=int(config["epoch_steps"]), cost_epochs=int(config["epochs"]))
    row = next(r for r in summary["cost_overhead"] if r["method"] == config["method"])
    if "error" in row:
        raise InvalidParameterError(f"COST's overhead could not be measured: {row['error']}")
    ctx.say(f"cost overhead repeat {seed}: {100 * row['overhead']:+.1f} %")
    return {"value": float(row["overhead"]),
            "repeat": {k: row[k] for k in ("base_epoch_seconds", "cost_epoch_seconds", "overhead",
                                           "accounted_overhead", "teleports_per_epoch", "teleport_seconds")}}


#: COST's overhead per epoch over its base method (`mtlflow bench --teleport cost`), one repeat per seed
run_cost_overhead = SeedwiseRunner(_cost_overhead_seed, _repeats)


def _cost_mechanism_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.cost_mechanism import claim_seed  # noqa: PLC0415 (lazy: loads torch)

    return claim_seed(config, seed, ctx)


def _cost_mechanism_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                            ctx: RunContext) -> dict[str, Any]:
    from mtlflow.experiments.cost_mechanism import claim_combine  # noqa: PLC0415 (lazy: loads torch)

    return claim_combine(config, parts, ctx)


#: COST's teleport at its trigger steps, forked against no teleport (:mod:`mtlflow.experiments.cost_mechanism`)
run_cost_mechanism = SeedwiseRunner(_cost_mechanism_seed, _cost_mechanism_combine)


def _palora_overhead_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    from mtlflow import benchmarks  # noqa: PLC0415 (lazy: loads torch)
    from mtlflow.jobs.palora import overhead_table  # noqa: PLC0415 (lazy: loads torch)

    bench = benchmarks.build(config["benchmark"], **dict(config.get("data_options", {})))
    report = overhead_table(bench, None, int(config["rank"]), config["layers"], config["factorization"])
    ctx.say(f"palora overhead on {config['benchmark']}: {report['overhead_percent']:.3f} %")
    return {"value": float(report["overhead_percent"]),
            "details": {k: report[k] for k in ("adapter_parameters", "model_parameters", "rank", "factorization")}}


def _palora_overhead_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                             ctx: RunContext) -> dict[str, Any]:
    return {"values": [p["value"] for p in parts], "details": parts[0]["details"]}


#: PaLoRA's adapter parameters as a percentage of the plain model's (a count: no training, one seed)
run_palora_overhead = SeedwiseRunner(_palora_overhead_seed, _palora_overhead_combine)


def _train(ctx: RunContext, config: Mapping[str, Any], spec: Mapping[str, Any], seed: int,
           **extra: Any) -> tuple[Path, dict[str, Any]]:
    """One run of ``spec`` (``label``, ``method``, optional ``hparams`` and any other training option, e.g.
    ``teleport``, ``architecture``) through :func:`mtlflow.jobs.train` under ``work_dir/runs``; a finished run
    is reused, an interrupted one resumed."""
    from mtlflow import jobs  # noqa: PLC0415 (lazy: loads torch)

    run = ctx.work_dir / "runs" / f"{spec['label']}-s{seed}"
    done = (run / "run.json").is_file() and atomic.read_json(run / "run.json").get("status") == "completed"
    if not done:
        ctx.say(f"training {run.name}")
        options = {k: v for k, v in spec.items() if k not in ("label", "method", "hparams")}
        jobs.train(None, run, method=spec["method"], seed=seed, hparams=spec.get("hparams"), resume=run.exists(),
                   progress=False, benchmark=config["benchmark"],
                   data_options={**dict(config.get("data_options", {})), **dict(ctx.data_options)},
                   device=ctx.device, **dict(config.get("train", {})), **options, **extra)
    return run, jobs.read_run(run)


def _score(record: Mapping[str, Any], metric: str, refs: Mapping[str, Any] | None) -> float:
    from mtlflow.metrics.scoring import delta_m  # noqa: PLC0415 (lazy: loads torch)

    final = record["metrics"]["final"]["test"]
    if metric == "delta_m":
        return float(delta_m(final, refs, record["metrics"]["metric_specs"]))
    primary = record["metrics"]["primary_metrics"]
    return 100.0 * statistics.fmean(final[t][primary[t]] for t in primary)


def _trained_gain_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's runs: the single-task LS references (for Δm%), ``method``'s and ``baseline``'s, as records."""
    from mtlflow import benchmarks  # noqa: PLC0415 (lazy: loads torch)

    references = []
    if config["metric"] == "delta_m":
        tasks = benchmarks.build(config["benchmark"], **{**dict(config.get("data_options", {})),
                                                         **dict(ctx.data_options)}).task_names
        references = [_train(ctx, config, {"label": f"stl-{task}", "method": "ls"}, seed, tasks=[task])[1]
                      for task in tasks]
    return {"references": references, "method": _train(ctx, config, config["method"], seed)[1],
            "baseline": _train(ctx, config, config["baseline"], seed)[1]}


def _trained_gain_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                          ctx: RunContext) -> dict[str, Any]:
    """Δm% against the references of every seed (the mean per task over seeds), or the mean test accuracy."""
    from mtlflow import jobs  # noqa: PLC0415 (lazy: loads torch)

    metric = config["metric"]
    refs, records = None, []
    if metric == "delta_m":
        records = [part["references"][t] for t in range(len(parts[0]["references"])) for part in parts]
        refs = jobs.build_references(records)["metrics"]
    sides: dict[str, list[float]] = {"method": [], "baseline": []}
    teleports: dict[str, list[int]] = {"method": [], "baseline": []}
    for side in sides:
        for part in parts:
            record = part[side]
            records.append(record)
            sides[side].append(_score(record, metric, refs))
            # COST's teleports per run (0 when its trigger never fired: the run is its base method's)
            teleports[side].append(sum((e.get("cost") or {}).get("teleports", 0) for e in record["metrics"]["epochs"]))
    return {"values": sides["method"], "baseline": sides["baseline"],
            "details": {"metric": metric, "teleports_per_run": teleports, "train_seconds": _train_seconds(records)}}


#: ``method`` against ``baseline`` (each ``{method, hparams, teleport, teleport_options}``) trained with the same
#: seeds; the metric is Δm% against single-task LS runs (same seeds) or the mean test accuracy (%)
run_trained_gain = SeedwiseRunner(_trained_gain_seed, _trained_gain_combine)


def _train_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    """The epochs' wall time of every run a claim used (what training them cost, also when they were reused)."""
    return round(sum(e["epoch_seconds"] for r in records for e in r["metrics"]["epochs"]), 1)


def _palora_front_seed(config: Mapping[str, Any], seed: int, ctx: RunContext) -> dict[str, Any]:
    """One seed's front on the test split (`mtlflow evaluate`): its value (the hypervolume, or the largest over
    tasks Spearman ρ between a task's preference and its error), the front and the run's record; with
    ``baseline``, the baseline's too."""
    from mtlflow import jobs  # noqa: PLC0415 (lazy: loads torch)
    from mtlflow.jobs.cache import cached_data_dir  # noqa: PLC0415 (lazy: loads torch)

    data = cached_data_dir(config["benchmark"], {**dict(config.get("data_options", {})), **dict(ctx.data_options)})

    def front_value(spec: Mapping[str, Any]) -> dict[str, Any]:
        run, record = _train(ctx, config, spec, seed)
        front = jobs.evaluate(run, data)["preference_front"]["splits"]["test"]
        summary = {"run": spec["label"], "seed": seed, "hypervolume": front["hypervolume"],
                   "spearman": front["spearman"], "non_dominated": front["non_dominated"]}
        if config["metric"] == "hypervolume":
            value = float(front["hypervolume"])
        else:
            # ρ is undefined (None) where a task's error is the same at every grid point: a flat front, no
            # correlation, so it counts as ρ = 0 (not monotone)
            value = max(0.0 if v is None else float(v) for v in front["spearman"].values())
        return {"value": value, "front": summary, "record": record}

    sides = ["method", "baseline"] if "baseline" in config else ["method"]
    return {side: front_value(config[side]) for side in sides}


def _palora_front_combine(config: Mapping[str, Any], parts: Sequence[Mapping[str, Any]],
                          ctx: RunContext) -> dict[str, Any]:
    sides = ["method", "baseline"] if "baseline" in config else ["method"]
    out: dict[str, Any] = {"values": [p["method"]["value"] for p in parts], "details": {"metric": config["metric"]}}
    if "baseline" in config:
        out["baseline"] = [p["baseline"]["value"] for p in parts]
    out["details"].update(train_seconds=_train_seconds([p[side]["record"] for side in sides for p in parts]),
                          fronts=[p[side]["front"] for side in sides for p in parts])
    return out


#: PaLoRA's front on the test split: its hypervolume or monotonicity per seed; with ``baseline``, the baseline's
run_palora_front = SeedwiseRunner(_palora_front_seed, _palora_front_combine)
