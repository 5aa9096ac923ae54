"""The four jobs of mtlflow -- prepare, train, evaluate, aggregate -- as plain functions.

The CLI, the DVC stages and the Kubeflow components all call these, so the three execution modes
run the same code.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mtlflow import benchmarks, methods, teleport
from mtlflow.benchmarks.base import Benchmark, read_manifest
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.engine.rundir import check_run_consistent, load_model, read_run, run_label
from mtlflow.engine.trainer import Trainer
from mtlflow.jobs.cache import cached_data
from mtlflow.jobs.data import check_expected_hash, load_prepared, prepare

#: The jobs' API (prepare and load_prepared live in :mod:`mtlflow.jobs.data`, read_run and run_label in
#: :mod:`mtlflow.engine.rundir`; they are part of it).
__all__ = ["TrainPlan", "aggregate", "build_references", "check_run_consistent", "evaluate", "load_prepared",
           "paper_reference_table", "parse_tasks", "plan_train", "prepare", "read_run", "resolved_hparams",
           "run_label", "summarise", "train"]


def resolved_hparams(bench, method: str, hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    """The benchmark's defaults for ``method`` overridden by the user's hyper-parameters; a method with a
    ``min_losses`` hyper-parameter gets the benchmark's loss lower bounds by default."""
    defaults = bench.method_defaults(method)
    if bench.loss_lower_bounds is not None and "min_losses" in methods.get(method).hparams:
        defaults.setdefault("min_losses", list(bench.loss_lower_bounds))
    return {**defaults, **dict(hparams or {})}


@dataclass(frozen=True)
class TrainPlan:
    """A training request validated as a whole, before any data is read: the benchmark, the run's
    configuration and where its prepared data is (None: prepared into the cache when training starts)."""

    bench: Benchmark
    config: RunConfig
    data_dir: Path | None


def plan_train(data_dir: str | Path | None = None, benchmark: str | None = None,
               data_options: Mapping[str, Any] | None = None, method: str = "ls", seed: int = 0,
               hparams: Mapping[str, Any] | None = None, tasks: str | Sequence[str] | None = None,
               **overrides: Any) -> TrainPlan:
    """Validate everything a run depends on without reading its data: the benchmark (from the prepared
    data's manifest, or by name with its preparation options), the tasks, the method's hyper-parameters
    (the benchmark's defaults under the user's), the run configuration and whether COST fits the model."""
    if data_dir is not None:
        manifest = read_manifest(data_dir)
        bench = benchmarks.build(manifest["benchmark"], **manifest.get("config", {}))
    elif benchmark is not None:
        bench = benchmarks.build(benchmark, **dict(data_options or {}))
    else:
        raise InvalidParameterError("give --benchmark NAME (data prepared into the cache) or --data DIR")
    task_names = parse_tasks(tasks, bench.task_names)
    selected = bench.select_tasks(task_names)
    hparams = resolved_hparams(bench, method, hparams)
    methods.build(method, len(selected), **hparams)
    config = RunConfig.for_benchmark(bench.train_defaults, method=method, seed=seed, hparams=hparams,
                                     tasks=task_names, **overrides)
    teleport.check_benchmark(bench, [t.name for t in selected], config.teleport, config.teleport_options)
    return TrainPlan(bench, config, None if data_dir is None else Path(data_dir))


def train(data_dir: str | Path | None, out_dir: str | Path, method: str = "ls", seed: int = 0,
          hparams: Mapping[str, Any] | None = None, tasks: str | Sequence[str] | None = None,
          resume: bool = False, progress: bool = True, expected_hash: str | None = None,
          callbacks: Sequence[Callback] = (), overwrite: bool = False, benchmark: str | None = None,
          data_options: Mapping[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """Train ``method`` on prepared data (``data_dir``), or on ``benchmark`` prepared with ``data_options``
    into the cache (``data_dir=None``); writes the run directory ``out_dir``.

    The whole request is validated (:func:`plan_train`) and the output path checked before any data is
    prepared or loaded; the data is hashed once, when it is loaded. An ``out_dir`` that already holds a run
    needs ``resume`` (continue from its checkpoint) or ``overwrite`` (its result files are deleted first);
    the directory is locked while training (:func:`mtlflow.core.outputs.run_dir_guard`). ``callbacks``
    extend the trainer (e.g. :class:`mtlflow.ops.observability.PrometheusExporter`).
    """
    from mtlflow.core.outputs import check_output_dir, run_dir_guard, stale_run_files
    from mtlflow.engine import distributed

    main_process = distributed.is_main_process()  # only rank 0 of a torchrun job claims and writes out_dir
    check_output_dir(out_dir, "--out")
    if main_process:
        stale_run_files(out_dir, resume, overwrite)  # refuse to touch an existing result before any work
    plan = plan_train(data_dir, benchmark, data_options, method, seed, hparams, tasks, **overrides)
    if plan.data_dir is None:
        data_dir, data = cached_data(plan.bench)
    else:
        check_expected_hash(data_dir, read_manifest(data_dir), expected_hash)
        data = plan.bench.load(data_dir)
    with run_dir_guard(out_dir, resume=resume, overwrite=overwrite, main_process=main_process):
        trainer = Trainer(plan.bench, data, plan.config, out_dir, progress=progress, callbacks=callbacks)
        result = trainer.fit(resume=resume)
    return {"run_dir": str(out_dir), **result}


def parse_tasks(tasks: str | Sequence[str] | None, valid: Sequence[str]) -> list[str] | None:
    """The task subset of a run: ``None`` (every task) or a list of distinct, known task names.

    Accepts the CLI's comma-separated string or a list. An empty selection (``''``, ``','``, ``[]``)
    is an error rather than "all tasks", and a repeated task would build two heads for one target.
    """
    if tasks is None:
        return None
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise InvalidParameterError(f"--tasks {tasks!r} names an empty task; give comma-separated task names "
                                    f"from: {', '.join(valid)} (or leave --tasks out for all)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidParameterError(f"--tasks names {', '.join(repeated)} more than once; give each task once")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise InvalidParameterError(f"unknown task(s) {', '.join(unknown)}; valid tasks: {', '.join(valid)}")
    return names


def evaluate(run_dir: str | Path, data_dir: str | Path, split: str = "test",
             out_file: str | Path | None = None, confusion: bool = False) -> dict[str, Any]:
    """Evaluate the final model of ``run_dir`` on ``split`` of ``data_dir``; writes ``evaluation.json``.

    ``confusion=True`` adds ``confusion_matrices`` (``{task: {kind, categories, matrix}}``, rows = true
    class) for the classification tasks (:mod:`mtlflow.metrics.confusion`; one more pass over the split).
    """
    from mtlflow.metrics.evaluation import evaluate_model

    run_dir = Path(run_dir)
    if (run_dir / "run.json").exists() or (run_dir / "metrics.json").exists():
        check_run_consistent(run_dir)
    # else a bare model.pt exported by `mtlflow palora merge`: no run to be consistent with
    bench, model, blob = load_model(run_dir / "model.pt")
    _, data = load_prepared(data_dir)
    if data.content_hash != blob["data_hash"]:
        raise DataError(f"run {run_dir} was trained on data {blob['data_hash'][:12]} but {data_dir} holds "
                        f"{data.content_hash[:12]}; evaluate with the same prepared data")
    if split not in data.splits:
        raise InvalidParameterError(f"unknown split {split!r}; valid: {', '.join(data.splits)}")
    tasks = bench.select_tasks(blob["tasks"])
    index = [bench.task_names.index(t.name) for t in tasks]
    values = evaluate_model(model, bench, data.splits[split], tasks, index)
    result = {"run": str(run_dir), "benchmark": bench.name, "dataset": bench.label, "method": blob["method"],
              "split": split, "data_hash": data.content_hash, "tasks": [t.name for t in tasks],
              "metric_specs": {t.name: t.metric_specs() for t in tasks}, "metrics": values}
    if confusion:
        from mtlflow.metrics.confusion import confusion_matrices

        result["confusion_matrices"] = confusion_matrices(model, bench, data.splits[split], tasks, index)
    if "palora" in blob:  # a Pareto-front model: also every point of its preference grid
        from mtlflow.jobs.palora import evaluate_saved_front

        result["preference_front"] = evaluate_saved_front(run_dir / "model.pt", data.splits[split], split)
    atomic.write_json(out_file or run_dir / "evaluation.json", result)
    return result


def build_references(reference_runs: Sequence[Mapping[str, Any]], split: str = "test") -> dict[str, Any]:
    """Single-task reference metrics: per task, the mean over seeds of the selected final metrics."""
    per_task: dict[str, list[Mapping[str, float]]] = {}
    hashes, sources, specs = set(), [], {}
    for ref in reference_runs:
        tasks = ref["metrics"]["tasks"]
        if len(tasks) != 1:
            raise InvalidParameterError(f"reference run {ref['dir']} trains {len(tasks)} tasks; "
                                        "references must be single-task runs (--tasks NAME)")
        task = tasks[0]
        per_task.setdefault(task, []).append(ref["metrics"]["final"][split][task])
        specs[task] = ref["metrics"]["metric_specs"][task]
        hashes.add(ref["run"]["data_hash"])
        sources.append({"run": ref["dir"], "task": task, "seed": ref["run"]["config"]["seed"],
                        "selection": ref["metrics"]["selection"]["rule"]})
    if len(hashes) > 1:
        raise DataError("reference runs were trained on different data versions; use one prepared dataset")
    metrics = {task: {m: statistics.fmean(v[m] for v in values) for m in values[0]}
               for task, values in per_task.items()}
    return {"split": split, "data_hash": hashes.pop() if hashes else None, "metrics": metrics,
            "metric_specs": specs, "sources": sources}


def aggregate(run_dirs: Sequence[str | Path], out_dir: str | Path,
              reference_dirs: Sequence[str | Path] = (), method_set: Sequence[str] | None = None,
              split: str = "test", paper_references: bool | None = None) -> dict[str, Any]:
    """Compare runs: per-method mean±std metrics, Δm%, mean rank, hypervolume, Pareto set, report.

    Δm% is computed against the single-task runs in ``reference_dirs`` ("own STL") and, labelled
    separately, against the single-task values the papers publish ("paper STL",
    ``Benchmark.published_references``): ``paper_references=None`` adds them when the benchmark has
    them, ``True`` requires them, ``False`` leaves them out.
    """
    from mtlflow.jobs.report import write_report

    if not run_dirs:
        raise InvalidParameterError("aggregate needs at least one run directory")
    seen: dict[Path, str] = {}
    for d in [*run_dirs, *reference_dirs]:
        key = Path(d).resolve()
        if key in seen:
            raise InvalidParameterError(f"run directory {d} is given twice ({seen[key]} and {d}); give each run once")
        seen[key] = str(d)
    runs = [read_run(d) for d in run_dirs]
    refs = [read_run(d) for d in reference_dirs]
    summary = summarise(runs, refs, method_set=method_set, split=split, paper_references=paper_references)
    write_report(summary, runs, Path(out_dir))
    return summary


def paper_reference_table(run: Mapping[str, Any], tasks: Sequence[str], wanted: bool | None) -> dict[str, Any] | None:
    """The benchmark's published single-task metrics for ``tasks`` (see :func:`aggregate`), or None."""
    if wanted is False:
        return None
    bench = benchmarks.build(run["benchmark"], **run.get("benchmark_config", {}))
    published = bench.published_references()
    metrics = published.restricted(tasks) if published is not None else {}
    if not metrics:
        if wanted:
            raise InvalidParameterError(f"benchmark {run['benchmark']!r} publishes no single-task references for "
                                        f"tasks {list(tasks)}; drop --paper-references")
        return None
    return {"label": published.label, "source": published.source, "note": published.note, "metrics": metrics}


def summarise(runs: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]],
              method_set: Sequence[str] | None = None, split: str = "test",
              paper_references: bool | None = None) -> dict[str, Any]:
    from mtlflow.metrics.scoring import comparable_metrics, delta_m, hypervolume, mean_rank, pareto_mask
    from mtlflow.metrics.task import metric_error
    from mtlflow.pareto.front import attach_fronts

    benches = {r["run"]["benchmark"] for r in runs}
    hashes = {r["run"]["data_hash"] for r in runs}
    if len(benches) > 1:
        raise InvalidParameterError(f"runs mix benchmarks {sorted(benches)}; aggregate one benchmark at a time")
    if len(hashes) > 1:
        raise DataError("runs were trained on different data versions; aggregate runs of one prepared dataset")
    first = runs[0]["metrics"]
    tasks, specs = first["tasks"], first["metric_specs"]
    primary, hv_ref = first["primary_metrics"], first["hv_reference"]
    references = build_references(refs, split) if refs else None
    if references and references["data_hash"] not in hashes:
        raise DataError("single-task references were trained on another data version than the runs")
    paper = paper_reference_table(runs[0]["run"], tasks, paper_references)

    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        if r["metrics"]["tasks"] != tasks:
            raise InvalidParameterError(f"run {r['dir']} has tasks {r['metrics']['tasks']}, expected {tasks}")
        by_method.setdefault(run_label(r["run"]), []).append(r)
    for label, group in by_method.items():
        dirs_by_seed: dict[int, list[str]] = {}
        for g in group:
            dirs_by_seed.setdefault(g["run"]["config"]["seed"], []).append(g["dir"])
        for seed, dirs in dirs_by_seed.items():
            if len(dirs) > 1:  # the same experiment twice would count as extra seeds with zero spread
                raise InvalidParameterError(f"runs {', '.join(dirs)} are all {label} with seed {seed}; "
                                            "keep one run per method and seed")

    declared = list(method_set) if method_set else sorted(by_method)
    missing = [m for m in declared if m not in by_method]
    if missing:
        raise InvalidParameterError(f"declared method set names {missing} but no run has that method; "
                                    f"runs have: {', '.join(sorted(by_method))}")
    own_usable, own_excluded = comparable_metrics(references["metrics"]) if references else ({}, {})
    paper_usable, paper_excluded = comparable_metrics(paper["metrics"]) if paper else ({}, {})
    rows: dict[str, dict[str, Any]] = {}
    for label, group in sorted(by_method.items()):
        finals = [g["metrics"]["final"][split] for g in group]
        mean = {t: {m: statistics.fmean(f[t][m] for f in finals) for m in finals[0][t]} for t in tasks}
        std = {t: {m: (statistics.stdev([f[t][m] for f in finals]) if len(finals) > 1 else 0.0)
                   for m in finals[0][t]} for t in tasks}
        errors = [metric_error(mean[t][primary[t]], specs[t][primary[t]]["higher_is_better"],
                               specs[t][primary[t]]["unit_interval"]) for t in tasks]
        row: dict[str, Any] = {
            "method": label, "seeds": sorted(g["run"]["config"]["seed"] for g in group),
            "runs": [g["dir"] for g in group], "selection": sorted({g["metrics"]["selection"]["rule"] for g in group}),
            "mean": mean, "std": std, "primary_errors": errors,
            "hypervolume": hypervolume([errors], [hv_ref[t] for t in tasks]),
            "step_seconds_median": statistics.fmean(g["metrics"]["epochs"][-1]["step_seconds_median"] for g in group),
            "peak_memory_bytes": max(g["metrics"]["epochs"][-1]["peak_memory_bytes"] for g in group),
        }
        if references:
            per_seed = [delta_m(f, references["metrics"], specs, own_usable) for f in finals]
            row["delta_m"] = statistics.fmean(per_seed)
            row["delta_m_std"] = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
            row["delta_m_per_seed"] = per_seed
        if paper:
            per_seed = [delta_m(f, paper["metrics"], specs, paper_usable) for f in finals]
            row["delta_m_paper"] = statistics.fmean(per_seed)
            row["delta_m_paper_std"] = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
            row["delta_m_paper_per_seed"] = per_seed
        rows[label] = row
    ranks = mean_rank({m: rows[m]["mean"] for m in declared}, specs)
    for m, r in ranks.items():
        rows[m]["mean_rank"] = r
    labels = sorted(rows)
    points = [rows[m]["primary_errors"] for m in labels]
    mask = pareto_mask(points)
    for m, keep in zip(labels, mask):
        rows[m]["pareto_optimal"] = bool(keep)
    # Pareto-front methods (PaLoRA) also get their whole front, and the methods it dominates
    front_methods = attach_fronts(rows, by_method, split, tasks, primary, specs)
    reference_point = [hv_ref[t] for t in tasks]
    return {
        "schema": 1,
        "benchmark": benches.pop(),
        "dataset": runs[0]["run"].get("dataset", runs[0]["run"]["benchmark"]),
        "data_hash": hashes.pop(),
        "split": split,
        "tasks": tasks,
        "metric_specs": specs,
        "primary_metrics": primary,
        "hypervolume_reference_point": reference_point,
        "hypervolume_objective": "error of each task's primary metric (1 - value for bounded higher-is-better metrics)",
        "hypervolume_all_methods": hypervolume(points, reference_point),
        "pareto_set": [m for m, keep in zip(labels, mask) if keep],
        "preference_front_methods": front_methods,
        "mean_rank_method_set": declared,
        "selection_rules": sorted({r["metrics"]["selection"]["rule"] for r in runs}),
        "references": references,
        "paper_references": paper,
        # metrics Δm% leaves out: their reference is 0 or undefined (e.g. a single-task F1 of 0)
        "delta_m_excluded": {"references": own_excluded, "paper_references": paper_excluded},
        "methods": rows,
    }
