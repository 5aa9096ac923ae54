"""The four jobs of mtlflow -- prepare, train, evaluate, aggregate -- as plain functions.

The CLI, the DVC stages and the Kubeflow components all call these, so the three execution modes
run the same code. The aggregate's comparison is :mod:`mtlflow.jobs.compare` (a typed
:class:`~mtlflow.jobs.compare.summary.Summary`), its report :mod:`mtlflow.jobs.report`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtlflow import benchmarks, methods, teleport
from mtlflow.benchmarks.base import Benchmark, read_manifest
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.core.outputs import RUN_FILES, check_output_dir, check_output_path, run_dir_guard, stale_run_files
from mtlflow.engine import distributed
from mtlflow.engine.rundir import check_run_consistent, load_model, read_run, run_label
from mtlflow.engine.trainer import Trainer, check_finite_evaluation
from mtlflow.jobs.cache import cache_path, cached_data
from mtlflow.jobs.compare import build_references, paper_reference_table, split_evaluation_name, summarise
from mtlflow.jobs.compare.baselines import split_baselines
from mtlflow.jobs.compare.summary import Summary
from mtlflow.jobs.data import check_expected_hash, load_prepared, manifest_benchmark, prepare, source_paths
from mtlflow.jobs.palora import evaluate_saved_front
from mtlflow.jobs.report import write_report
from mtlflow.metrics import evaluation
from mtlflow.metrics.confusion import confusion_matrices

#: The jobs' API (prepare and load_prepared live in :mod:`mtlflow.jobs.data`, read_run and run_label in
#: :mod:`mtlflow.engine.rundir`; they are part of it).
__all__ = ["Summary", "TrainPlan", "aggregate", "build_references", "check_run_consistent", "evaluate",
           "load_prepared", "paper_reference_table", "parse_tasks", "plan_train", "prepare", "read_run",
           "resolved_hparams", "run_label", "split_evaluation_name", "summarise", "train"]


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
    configuration, where its prepared data is (None: prepared into the cache when training starts) and that
    data's manifest (read once, here; None with the cache)."""

    bench: Benchmark
    config: RunConfig
    data_dir: Path | None
    manifest: Mapping[str, Any] | None = None


def plan_train(data_dir: str | Path | None = None, benchmark: str | None = None,
               data_options: Mapping[str, Any] | None = None, method: str = "ls", seed: int = 0,
               hparams: Mapping[str, Any] | None = None, tasks: str | Sequence[str] | None = None,
               **overrides: Any) -> TrainPlan:
    """Validate everything a run depends on without reading its data: the benchmark (from the prepared
    data's manifest, or by name with its preparation options), the tasks, the method's hyper-parameters
    (the benchmark's defaults under the user's), the run configuration and whether COST fits the model."""
    manifest = read_manifest(data_dir) if data_dir is not None else None
    if data_dir is not None:
        bench = manifest_benchmark(data_dir, manifest)
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
    return TrainPlan(bench, config, None if data_dir is None else Path(data_dir), manifest)


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
    main_process = distributed.is_main_process()  # only rank 0 of a torchrun job claims and writes out_dir
    plan = plan_train(data_dir, benchmark, data_options, method, seed, hparams, tasks, **overrides)
    inputs = ([("--data", data_dir)] if data_dir is not None else  # else the cache, prepared from the sources
              [("the cached data", cache_path(plan.bench)), *source_paths(plan.bench, data_options or {})])
    check_output_dir(out_dir, "--out", inputs)
    if main_process:
        stale_run_files(out_dir, resume, overwrite)  # refuse to touch an existing result before any work
    if plan.data_dir is None:
        data_dir, data = cached_data(plan.bench)
    else:
        check_expected_hash(data_dir, plan.manifest, expected_hash)
        data = plan.bench.load(data_dir, manifest=plan.manifest)
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
        result["confusion_matrices"] = confusion_matrices(model, bench, data.splits[split], tasks, index)
    if "palora" in blob:  # a Pareto-front model: also every point of its preference grid
        result["preference_front"] = evaluate_saved_front(run_dir / "model.pt", data.splits[split], split)
    out_file = Path(out_file or run_dir / "evaluation.json")
    if per_example:
        evaluation.write_examples(evaluation.examples_path(out_file), examples)
        result["per_example"] = {"file": evaluation.examples_path(out_file).name, "examples": len(data.splits[split]),
                                 "statistics": {t.name: evaluation.paired_statistic(t) for t in tasks}}
    atomic.write_json(out_file, result)
    return result


def aggregate(run_dirs: Sequence[str | Path], out_dir: str | Path,
              reference_dirs: Sequence[str | Path] = (), method_set: Sequence[str] | None = None,
              split: str = "test", paper_references: bool | None = None,
              evaluations: Sequence[str | Path] = (), baseline_dirs: Sequence[str | Path] = ()) -> Summary:
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

    ``baseline_dirs``: directories of ``mtlflow baseline`` (:mod:`mtlflow.jobs.baselines`; a baseline among
    ``run_dirs`` is recognised by its run.json's ``kind`` too), rows of the report beside the methods and
    compared with each of them, but in no Δm%, mean rank or Pareto set.
    """
    if not run_dirs:
        raise InvalidParameterError("aggregate needs at least one run directory")
    check_output_dir(out_dir, "--out", [*(("run directory", d) for d in run_dirs),
                                        *(("reference run", d) for d in reference_dirs),
                                        *(("baseline", d) for d in baseline_dirs),
                                        *(("evaluation", e) for e in evaluations)])
    seen: dict[Path, str] = {}
    for d in [*run_dirs, *reference_dirs, *baseline_dirs]:
        key = Path(d).resolve()
        if key in seen:
            raise InvalidParameterError(f"run directory {d} is given twice ({seen[key]} and {d}); give each run once")
        seen[key] = str(d)
    runs, baselines = split_baselines([read_run(d) for d in run_dirs])
    refs = [read_run(d) for d in reference_dirs]
    summary = summarise(runs, refs, method_set=method_set, split=split, paper_references=paper_references,
                        evaluations=evaluations, baselines=[*baselines, *(read_run(d) for d in baseline_dirs)])
    write_report(summary, runs, Path(out_dir))
    return summary
