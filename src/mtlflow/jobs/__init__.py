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
from mtlflow.engine.trainer import Trainer, check_finite_evaluation
from mtlflow.jobs.cache import cache_path, cached_data
from mtlflow.jobs.data import check_expected_hash, load_prepared, manifest_benchmark, prepare, source_paths
from mtlflow.metrics.paired import N_RESAMPLES as PAIRED_RESAMPLES
from mtlflow.metrics.paired import SEED as PAIRED_SEED

#: The jobs' API (prepare and load_prepared live in :mod:`mtlflow.jobs.data`, read_run and run_label in
#: :mod:`mtlflow.engine.rundir`; they are part of it).
__all__ = ["TrainPlan", "aggregate", "build_references", "check_run_consistent", "evaluate", "load_prepared",
           "paper_reference_table", "parse_tasks", "plan_train", "prepare", "read_run", "resolved_hparams",
           "run_label", "split_evaluation_name", "summarise", "train"]


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
        bench = manifest_benchmark(data_dir, read_manifest(data_dir))
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
    inputs = ([("--data", data_dir)] if data_dir is not None else  # else the cache, prepared from the sources
              [("the cached data", cache_path(plan.bench)), *source_paths(plan.bench, data_options or {})])
    check_output_dir(out_dir, "--out", inputs)
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
             out_file: str | Path | None = None, confusion: bool = False, per_example: bool = False) -> dict[str, Any]:
    """Evaluate the final model of ``run_dir`` on ``split`` of ``data_dir``; writes ``evaluation.json``.

    ``confusion=True`` adds ``confusion_matrices`` (``{task: {kind, categories, matrix}}``, rows = true
    class) for the classification tasks (:mod:`mtlflow.metrics.confusion`; one more pass over the split).
    ``per_example=True`` also keeps each example's loss and error per task, in the split's order
    (:func:`mtlflow.metrics.evaluation.evaluate_examples`), in ``<evaluation file>.per_example.npz`` beside
    the JSON, which names it under ``per_example``.
    """
    from mtlflow.core.outputs import RUN_FILES, check_output_path
    from mtlflow.metrics import evaluation

    run_dir = Path(run_dir)
    # the JSON may go into the run's folder, never onto the run's other files or into the data
    check_output_path(out_file or run_dir / "evaluation.json", "--out", "file",
                      [("--data", data_dir), *(("the run file", run_dir / name) for name in RUN_FILES
                                               if name != "evaluation.json")])
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
    if per_example:
        values, examples = evaluation.evaluate_examples(model, bench, data.splits[split], tasks, index)
    else:
        values = evaluation.evaluate_model(model, bench, data.splits[split], tasks, index)
    check_finite_evaluation({split: values}, f"of {run_dir}")  # a diverged model: exit 4, nothing written
    result = {"run": str(run_dir), "benchmark": bench.name, "dataset": bench.label, "method": blob["method"],
              "split": split, "data_hash": data.content_hash, "tasks": [t.name for t in tasks],
              "metric_specs": {t.name: t.metric_specs() for t in tasks}, "metrics": values}
    if confusion:
        from mtlflow.metrics.confusion import confusion_matrices

        result["confusion_matrices"] = confusion_matrices(model, bench, data.splits[split], tasks, index)
    if "palora" in blob:  # a Pareto-front model: also every point of its preference grid
        from mtlflow.jobs.palora import evaluate_saved_front

        result["preference_front"] = evaluate_saved_front(run_dir / "model.pt", data.splits[split], split)
    out_file = Path(out_file or run_dir / "evaluation.json")
    if per_example:
        evaluation.write_examples(evaluation.examples_path(out_file), examples)
        result["per_example"] = {"file": evaluation.examples_path(out_file).name, "examples": len(data.splits[split]),
                                 "statistics": {t.name: evaluation.paired_statistic(t) for t in tasks}}
    atomic.write_json(out_file, result)
    return result


def build_references(reference_runs: Sequence[Mapping[str, Any]], split: str = "test") -> dict[str, Any]:
    """Single-task reference metrics: per task, the mean over seeds of the selected final metrics (``metrics``,
    what Δm% divides by) and their 95 % intervals over seeds (``intervals``)."""
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
    from mtlflow.metrics.intervals import mean_interval

    metrics = {task: {m: statistics.fmean(v[m] for v in values) for m in values[0]}
               for task, values in per_task.items()}
    intervals = {task: {m: mean_interval([v[m] for v in values]).as_dict() for m in values[0]}
                 for task, values in per_task.items()}
    return {"split": split, "data_hash": hashes.pop() if hashes else None, "metrics": metrics,
            "intervals": intervals, "metric_specs": specs, "sources": sources}


def aggregate(run_dirs: Sequence[str | Path], out_dir: str | Path,
              reference_dirs: Sequence[str | Path] = (), method_set: Sequence[str] | None = None,
              split: str = "test", paper_references: bool | None = None,
              evaluations: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Compare runs: per method every metric, Δm%, mean rank and hypervolume as a mean over seeds with its
    95 % interval, each method against LS and the best one (difference, probability of improvement, verdict),
    the Pareto sets (by the means, and at 95 %), the warnings, and the report (:func:`summarise`,
    :mod:`mtlflow.jobs.report`; definitions in docs/guides/reading-the-report.md).

    Δm% is computed against the single-task runs in ``reference_dirs`` ("own STL") and, labelled
    separately, against the single-task values the papers publish ("paper STL",
    ``Benchmark.published_references``): ``paper_references=None`` adds them when the benchmark has
    them, ``True`` requires them, ``False`` leaves them out.

    ``evaluations``: evaluation files written with per-example values (``evaluate(..., per_example=True)``)
    outside the run directories (the DVC stage's ``runs/evaluation/``), for the paired comparisons; a run's
    own ``<split>_evaluation.json`` (the pipelines' train step) or ``evaluation.json`` is found without it.
    """
    from mtlflow.core.outputs import check_output_dir
    from mtlflow.jobs.report import write_report

    if not run_dirs:
        raise InvalidParameterError("aggregate needs at least one run directory")
    check_output_dir(out_dir, "--out", [*(("run directory", d) for d in run_dirs),
                                        *(("reference run", d) for d in reference_dirs),
                                        *(("evaluation", e) for e in evaluations)])
    seen: dict[Path, str] = {}
    for d in [*run_dirs, *reference_dirs]:
        key = Path(d).resolve()
        if key in seen:
            raise InvalidParameterError(f"run directory {d} is given twice ({seen[key]} and {d}); give each run once")
        seen[key] = str(d)
    runs = [read_run(d) for d in run_dirs]
    refs = [read_run(d) for d in reference_dirs]
    summary = summarise(runs, refs, method_set=method_set, split=split, paper_references=paper_references,
                        evaluations=evaluations)
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
              paper_references: bool | None = None, evaluations: Sequence[str | Path] = ()) -> dict[str, Any]:
    """The comparison of ``runs`` (grouped by method) as a dict: every number a mean over seeds with its 95 %
    interval (:mod:`mtlflow.metrics.intervals`), each method against LS and against the best method, the
    Pareto sets, the warnings and the verdict (see docs/guides/reading-the-report.md for the definitions).

    Where both methods' runs kept per-example values of the same test split (:func:`_method_examples`; the
    ``evaluations`` files or the runs' own), each comparison also holds ``paired``: the paired bootstrap over
    test examples of :func:`mtlflow.metrics.paired.compare_methods` (each example's error averaged over a
    method's seeds); otherwise ``paired`` says why there is none."""
    import numpy as np

    from mtlflow.metrics.intervals import BOOTSTRAP_SEED, CONFIDENCE, N_RESAMPLES, mean_interval
    from mtlflow.metrics.scoring import (comparable_metrics, confident_pareto_mask, delta_m, hypervolume,
                                         mean_rank, mean_rank_interval, normalised_hypervolume, pareto_mask,
                                         task_delta)
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
    scale = [float(hv_ref[t]) for t in tasks]

    def errors_of(values: Mapping[str, Mapping[str, float]]) -> list[float]:
        return [metric_error(values[t][primary[t]], specs[t][primary[t]]["higher_is_better"],
                             specs[t][primary[t]]["unit_interval"]) for t in tasks]

    rows: dict[str, dict[str, Any]] = {}
    per_seed: dict[str, dict[str, Any]] = {}  # what the comparisons resample: one value per seed
    for label, group in sorted(by_method.items()):
        group = sorted(group, key=lambda g: g["run"]["config"]["seed"])
        finals = [g["metrics"]["final"][split] for g in group]
        mean = {t: {m: statistics.fmean(f[t][m] for f in finals) for m in finals[0][t]} for t in tasks}
        std = {t: {m: _sample_std([f[t][m] for f in finals]) for m in finals[0][t]} for t in tasks}
        seed_errors = [errors_of(f) for f in finals]
        seed_hv = [normalised_hypervolume([e], scale) for e in seed_errors]
        hv = mean_interval(seed_hv)
        row: dict[str, Any] = {
            "method": label, "seeds": [g["run"]["config"]["seed"] for g in group],
            "runs": [g["dir"] for g in group], "selection": sorted({g["metrics"]["selection"]["rule"] for g in group}),
            "mean": mean, "std": std,
            "intervals": {t: {m: mean_interval([f[t][m] for f in finals]).as_dict() for m in finals[0][t]}
                          for t in tasks},
            "primary_errors": errors_of(mean), "primary_errors_per_seed": seed_errors,
            "hypervolume": hv.mean, "hypervolume_interval": hv.as_dict(), "hypervolume_per_seed": seed_hv,
            "hypervolume_raw": hypervolume([errors_of(mean)], scale),
            "step_seconds_median": statistics.fmean(g["metrics"]["epochs"][-1]["step_seconds_median"] for g in group),
            "peak_memory_bytes": max(g["metrics"]["epochs"][-1]["peak_memory_bytes"] for g in group),
            "not_converged": [g["dir"] for g in group if _not_converged(g)],
        }
        per_seed[label] = {"tasks": {t: [f[t][primary[t]] for f in finals] for t in tasks}}
        if references:
            seed_dm = [delta_m(f, references["metrics"], specs, own_usable) for f in finals]
            dm = mean_interval(seed_dm)
            row.update({"delta_m": dm.mean, "delta_m_std": _sample_std(seed_dm),
                        "delta_m_per_seed": seed_dm, "delta_m_interval": dm.as_dict()})
            row["delta_task"] = {t: mean_interval([task_delta(f[t][primary[t]], references["metrics"][t][primary[t]],
                                                              specs[t][primary[t]]["higher_is_better"])
                                                   for f in finals]).as_dict()
                                 for t in tasks if t in references["metrics"]}
            per_seed[label]["delta_m"] = seed_dm
        if paper:
            seed_dm = [delta_m(f, paper["metrics"], specs, paper_usable) for f in finals]
            dm = mean_interval(seed_dm)
            row.update({"delta_m_paper": dm.mean,
                        "delta_m_paper_std": _sample_std(seed_dm),
                        "delta_m_paper_per_seed": seed_dm, "delta_m_paper_interval": dm.as_dict()})
        rows[label] = row
    ranks = mean_rank({m: rows[m]["mean"] for m in declared}, specs)
    for m, r in ranks.items():
        rows[m]["mean_rank"] = r
    columns = [(t, m) for t in tasks for m in rows[declared[0]]["mean"][t] if m != "loss"]
    rank_intervals = mean_rank_interval(
        {m: np.array([[f[t][c] for t, c in columns] for f in
                      (g["metrics"]["final"][split] for g in by_method[m])]) for m in declared},
        [specs[t][c]["higher_is_better"] for t, c in columns])
    for m in declared:
        rows[m]["mean_rank_interval"] = list(rank_intervals[m]) if rank_intervals else None
    labels = sorted(rows)
    points = [rows[m]["primary_errors"] for m in labels]
    mask = pareto_mask(points)
    confident = confident_pareto_mask([rows[m]["primary_errors_per_seed"] for m in labels])
    for m, keep, keep_confident in zip(labels, mask, confident):
        rows[m]["pareto_optimal"] = bool(keep)
        rows[m]["pareto_confident"] = bool(keep_confident)
    # Pareto-front methods (PaLoRA) also get their whole front, and the methods it dominates
    front_methods = attach_fronts(rows, by_method, split, tasks, primary, specs)
    best_by = "delta_m" if references else "mean_rank"
    best = min(declared, key=lambda m: (not np.isfinite(rows[m][best_by]), rows[m][best_by], m))  # NaN: last
    baseline = "ls" if "ls" in rows else None
    for label, row in rows.items():
        row["versus"] = {role: _compare_methods(per_seed[label], per_seed[other], tasks, primary, specs)
                         for role, other in (("ls", baseline), ("best", best)) if other is not None and other != label}
    given = _evaluations_by_run(evaluations, runs)
    examples = {label: _method_examples(label, by_method[label], split, tasks, given) for label in rows}
    paired: dict[tuple[str, str], dict[str, Any]] = {}  # LS as the best: one comparison serves both roles
    for label, row in rows.items():
        for role, versus in row["versus"].items():
            pair = (label, baseline if role == "ls" else best)
            if pair not in paired:
                paired[pair] = _paired_versus(*pair, examples)
            versus["paired"] = paired[pair]
    summary = {
        "schema": 2,
        "benchmark": benches.pop(),
        "dataset": runs[0]["run"].get("dataset", runs[0]["run"]["benchmark"]),
        "data_hash": hashes.pop(),
        "split": split,
        "tasks": tasks,
        "metric_specs": specs,
        "primary_metrics": primary,
        "hypervolume_reference_point": scale,
        "hypervolume_objective": "error of each task's primary metric (1 - value for bounded higher-is-better metrics)",
        "hypervolume_normalised": {
            "scale": scale, "reference_point": [1.0] * len(tasks),
            "definition": "each task's error divided by the benchmark's hypervolume reference error of that task "
                          "(hypervolume_reference_point, in the task's units), reference point 1 per task: the share "
                          "of the box [0, reference] a method dominates; per seed, then mean and 95 % interval"},
        "hypervolume_all_methods": normalised_hypervolume(points, scale),
        "pareto_set": [m for m, keep in zip(labels, mask) if keep],
        "pareto_set_confident": [m for m, keep in zip(labels, confident) if keep],
        "preference_front_methods": front_methods,
        "mean_rank_method_set": declared,
        "selection_rules": sorted({r["metrics"]["selection"]["rule"] for r in runs}),
        "references": references,
        "paper_references": paper,
        # metrics Δm% leaves out: their reference is 0 or undefined (e.g. a single-task F1 of 0)
        "delta_m_excluded": {"references": own_excluded, "paper_references": paper_excluded},
        "statistics": {"confidence": CONFIDENCE, "n_resamples": N_RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED,
                       "interval": "percentile bootstrap over seeds (scipy.stats.bootstrap); differences and mean "
                                   "ranks resample each method's seeds independently (stratified by method)",
                       "paired": PAIRED_RULE.format(n_resamples=PAIRED_RESAMPLES, seed=PAIRED_SEED)},
        "baseline": baseline,
        "best_method": best,
        "best_by": best_by,
        "methods": rows,
    }
    summary["warnings"] = _warnings(summary, runs, refs, own_excluded)
    return summary


def _sample_std(values: Sequence[float]) -> float:
    """The seeds' sample standard deviation (0 for one seed); NaN, not an error, when a value is NaN (a metric
    undefined for one seed), which ``statistics.stdev`` cannot take."""
    import numpy as np

    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _not_converged(run: Mapping[str, Any]) -> bool:
    """Whether a run says its validation metric was still improving when training stopped (``converged``
    false or ``not_converged`` true in run.json or metrics.json; runs from before the flag say nothing)."""
    for record in (run["run"], run["metrics"]):
        if record.get("converged") is False or record.get("not_converged"):
            return True
    return False


def _compare_methods(mine: Mapping[str, Any], other: Mapping[str, Any], tasks: Sequence[str],
                     primary: Mapping[str, str], specs: Mapping[str, Any]) -> dict[str, Any]:
    """One method against another over seeds: Δm% (when references exist) and each task's primary metric."""
    from mtlflow.metrics.intervals import compare

    result: dict[str, Any] = {
        "tasks": {t: compare(mine["tasks"][t], other["tasks"][t],
                             lower_is_better=not specs[t][primary[t]]["higher_is_better"]).as_dict() for t in tasks}}
    if "delta_m" in mine and "delta_m" in other:
        result["delta_m"] = compare(mine["delta_m"], other["delta_m"], lower_is_better=True).as_dict()
    return result


def split_evaluation_name(split: str) -> str:
    """The file name, in a run directory, of the run's evaluation on ``split`` with its per-example values
    (``<split>_evaluation.json``, the npz beside it): what the pipelines' train step keeps with the run."""
    return f"{split}_evaluation.json"


#: how the ``paired`` entry of a comparison is computed (results.json's ``statistics.paired``)
PAIRED_RULE = ("paired percentile bootstrap over the test examples (scipy.stats.bootstrap, paired; {n_resamples} "
               "resamples, generator seed {seed}) where both methods' runs kept per-example values of the same test "
               "split (same data hash, split and examples): each example's error (the task's paired statistic) is "
               "first averaged over each method's seeds, then this method minus the other; per task at 1 - 0.05/K "
               "(Bonferroni over the K tasks), and the mean over tasks of the per-task differences at 95 % "
               "(mtlflow.metrics.paired, the retrain gate's rule); it measures the sampling of the test examples, "
               "not the seed-to-seed spread")


def _evaluations_by_run(evaluations: Sequence[str | Path], runs: Sequence[Mapping[str, Any]]) -> dict[Path, Path]:
    """The given evaluation files by the (resolved) run directory each names; one that names no compared run is
    refused."""
    dirs = {Path(r["dir"]).resolve() for r in runs}
    given: dict[Path, Path] = {}
    for path in map(Path, evaluations):
        run = Path(atomic.read_json(path, "evaluation").get("run", "")).resolve()
        if run not in dirs:
            raise InvalidParameterError(f"evaluation {path} is of run {run}, which is not among the runs compared; "
                                        "give the evaluations of the compared runs only")
        given[run] = path
    return given


def _run_examples(run: Mapping[str, Any], split: str, tasks: Sequence[str],
                  given: Mapping[Path, Path]) -> dict[str, Any] | None:
    """A run's per-example errors on ``split`` and what identifies the test set (data hash, split, number of
    examples, each task's paired statistic): from its given evaluation file, else its own
    ``<split>_evaluation.json`` or ``evaluation.json``; None when none of them kept per-example values."""
    from mtlflow.metrics.evaluation import read_examples

    run_dir = Path(run["dir"])
    for path in (given.get(run_dir.resolve()), run_dir / split_evaluation_name(split), run_dir / "evaluation.json"):
        if path is None or not path.is_file():
            continue
        evaluation = atomic.read_json(path, "evaluation")
        kept = evaluation.get("per_example")
        if not kept or evaluation.get("split") != split:
            continue
        values = read_examples(path.parent / kept["file"])
        absent = [t for t in tasks if t not in values]
        if absent:
            raise DataError(f"per-example values {path.parent / kept['file']} have no task {', '.join(absent)}; "
                            "evaluate the run again with per-example values")
        return {"test_set": {"data_hash": evaluation["data_hash"], "split": split, "examples": int(kept["examples"]),
                             "statistics": {t: kept["statistics"][t] for t in tasks}},
                "errors": {t: values[t]["error"] for t in tasks}}
    return None


def _method_examples(label: str, group: Sequence[Mapping[str, Any]], split: str, tasks: Sequence[str],
                     given: Mapping[Path, Path]) -> dict[str, Any]:
    """Every seed's per-example errors of one method (``errors``: task -> one array per seed) and its test set,
    or ``missing`` (and ``verdict``, the report's short form): why a paired comparison of this method is
    impossible."""
    found = [(g["dir"], _run_examples(g, split, tasks, given)) for g in group]
    absent = [d for d, e in found if e is None]
    if absent:
        return {"verdict": "no per-example values",
                "missing": f"no per-example values for {label} ({len(absent)} of {len(group)} runs, e.g. "
                           f"{absent[0]})"}
    sets = [e["test_set"] for _, e in found]
    if any(s != sets[0] for s in sets) or any(len(e["errors"][t]) != sets[0]["examples"]
                                               for _, e in found for t in tasks):
        return {"verdict": "different test sets", "missing": f"the runs of {label} were evaluated on different "
                                                             "test sets"}
    return {"test_set": sets[0], "errors": {t: [e["errors"][t] for _, e in found] for t in tasks}}


def _paired_versus(label: str, other: str, examples: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``paired`` entry of ``label`` against ``other``: :func:`mtlflow.metrics.paired.compare_methods`
    over their shared test examples, or why there is none."""
    from mtlflow.metrics.paired import compare_methods

    mine, theirs = examples[label], examples[other]
    fallback = "intervals over seeds only"
    for side in (mine, theirs):
        if "missing" in side:
            return {"available": False, "verdict": side["verdict"], "reason": f"{side['missing']}: {fallback}"}
    if mine["test_set"] != theirs["test_set"]:
        differ = [k for k in mine["test_set"] if mine["test_set"][k] != theirs["test_set"][k]]
        return {"available": False, "verdict": "different test sets",
                "reason": f"{label} and {other} were evaluated on different test sets ({', '.join(differ)} differ): "
                          f"{fallback}"}
    try:
        comparison = compare_methods(mine["errors"], theirs["errors"], mine["test_set"]["statistics"],
                                     n_resamples=PAIRED_RESAMPLES, seed=PAIRED_SEED)
    except DataError as exc:  # e.g. too few labelled test examples: said in the entry, the table stays
        return {"available": False, "verdict": "no paired interval", "reason": f"{exc}: {fallback}"}
    return {"available": True, **comparison.as_dict(), "statistics": mine["test_set"]["statistics"],
            "seeds": [len(next(iter(mine["errors"].values()))), len(next(iter(theirs["errors"].values())))]}


#: fewer seeds than this and the report warns that the interval rests on too few runs
MIN_SEEDS = 3


def _warnings(summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]],
              excluded: Mapping[str, Sequence[str]]) -> list[str]:
    """What a reader must know before trusting the table: runs not converged, too few seeds, a test split too
    small for the printed interval, a degenerate single-task reference."""
    rows, split, primary = summary["methods"], summary["split"], summary["primary_metrics"]
    warnings = []
    unconverged = [f"{m} ({len(row['not_converged'])} of {len(row['runs'])} runs)"
                   for m, row in sorted(rows.items()) if row["not_converged"]]
    ref_tasks = sorted({r["metrics"]["tasks"][0] for r in refs})
    unconverged += [f"reference {t} ({sum(_not_converged(r) for r in refs if r['metrics']['tasks'][0] == t)} of "
                    f"{sum(r['metrics']['tasks'][0] == t for r in refs)} runs)" for t in ref_tasks
                    if any(_not_converged(r) for r in refs if r["metrics"]["tasks"][0] == t)]
    if unconverged:
        warnings.append("not converged: train longer (the validation metric was still improving at the end of "
                        f"{', '.join(unconverged)})")
    few = [f"{m} ({len(row['seeds'])})" for m, row in sorted(rows.items()) if len(row["seeds"]) < MIN_SEEDS]
    if few:
        warnings.append(f"fewer than {MIN_SEEDS} seeds: {', '.join(few)}"
                        + (" (1 seed: no interval, no verdict)" if any(len(r["seeds"]) == 1 for r in rows.values())
                           else " (the bootstrap interval of 2 seeds is their range)"))
    ref_seeds: dict[str, int] = {}
    for r in refs:
        task = r["metrics"]["tasks"][0]
        ref_seeds[task] = ref_seeds.get(task, 0) + 1
    few_refs = [f"{t} ({n})" for t, n in sorted(ref_seeds.items()) if n < MIN_SEEDS]
    if few_refs:
        warnings.append(f"single-task references with fewer than {MIN_SEEDS} seeds: {', '.join(few_refs)}")
    for task in summary["tasks"]:
        metric = primary[task]
        if not summary["metric_specs"][task][metric]["unit_interval"]:
            continue
        n = _split_size(runs[0], split, task)
        widths = [row["intervals"][task][metric]["high"] - row["intervals"][task][metric]["low"]
                  for row in rows.values() if row["intervals"][task][metric]["low"] is not None]
        if n is None or not widths:
            continue
        p = statistics.fmean(row["mean"][task][metric] for row in rows.values())
        sampling = 2 * 1.96 * (p * (1 - p) / n) ** 0.5  # width of the binomial 95 % interval of a proportion
        if sampling > max(widths):
            warnings.append(f"test split too small for the interval printed: {task} has {n} {split} examples, so "
                            f"its {metric} alone varies by about ±{sampling / 2:.4f} (95 %, binomial approximation) "
                            f"from the choice of test examples, more than the seed intervals (widest "
                            f"{max(widths):.4f}); differences "
                            f"smaller than that are not resolved")
    refs_metrics = (summary["references"] or {}).get("metrics", {})
    for task, names in sorted(excluded.items()):
        warnings.append(f"degenerate single-task reference for {task}: {', '.join(names)} is 0 or undefined, "
                        f"left out of Δm%")
    for task, values in sorted(refs_metrics.items()):
        metric = primary[task]
        spec = summary["metric_specs"][task][metric]
        if spec["unit_interval"] and spec["higher_is_better"] and values.get(metric) == 1.0:
            warnings.append(f"degenerate single-task reference for {task}: {metric} = 1 (no error), a multi-task "
                            f"method can only tie or lose on it")
    return warnings


def _split_size(run: Mapping[str, Any], split: str, task: str) -> int | None:
    """How many examples of ``split`` a task's metric was computed on, when known: the labelled examples of the
    run's per-example evaluation of that split (``<split>_evaluation.json``, kept by the pipelines' train step,
    or ``evaluation.json``), else ``split_sizes`` recorded in the run."""
    import math

    from mtlflow.metrics.evaluation import examples_path, read_examples

    for evaluation in (Path(run["dir"]) / split_evaluation_name(split), Path(run["dir"]) / "evaluation.json"):
        if evaluation.is_file() and examples_path(evaluation).is_file() \
                and atomic.read_json(evaluation, "evaluation").get("split") == split:
            errors = read_examples(examples_path(evaluation)).get(task, {}).get("error")
            if errors is not None:
                return sum(1 for e in errors if not math.isnan(e))
    for record in (run["metrics"], run["run"]):
        sizes = record.get("split_sizes") or {}
        size = sizes.get(split)
        if isinstance(size, Mapping):
            size = size.get(task)
        if isinstance(size, (int, float)) and size > 0:
            return int(size)
    return None
