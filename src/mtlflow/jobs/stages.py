"""DVC stages: ``mtlflow stage {source,prepare,train,reference,baselines,evaluate,aggregate,experiment}`` read
``params.yaml`` and call the same :mod:`mtlflow.jobs` functions as the CLI and the Kubeflow components;
``mtlflow stage status`` says what ``dvc repro`` would run, the source stage's data inputs included.

``params.yaml`` is a :class:`~mtlflow.config.pipeline.SweepConfig` -- the ``benchmark_sweep`` pipeline's
parameters, with the same names -- plus a ``dvc`` section with what only this pipeline needs:
``reference_tasks`` (the matrix of the reference stage: the benchmark's tasks) and ``experiment_method``
(the research stage). ``method_hparams`` has an entry for every method a stage trains (each stage depends on
its own). Paths (relative to the DVC project root):

* ``data/source.json``                   -- what identifies the data's inputs (the benchmark and its options, or the
  task spec and its table's SHA-256); re-computed on every ``dvc repro``, so a new version of the user's table
  re-runs ``prepare`` and everything after it;
* ``data/prepared``                      -- prepared benchmark data (DVC-tracked, pushed with ``dvc push``);
* ``runs/mtl/<method>-s<seed>``          -- one run per (method, seed) of ``methods x seeds``;
* ``runs/reference/<task>-s<seed>``      -- single-task reference runs (``reference_seeds``; never COST);
* ``runs/baselines/<kind>``               -- the per-task baselines that fit the data (trivial always, hgb and
  linear for a table; :func:`mtlflow.jobs.baselines.applicable_kinds`), cached by data hash: rows of the report;
* ``runs/evaluation/<method>-s<seed>.json`` -- test-split evaluation of every sweep run, each example's error
  beside it (``.per_example.npz``: the aggregate's paired comparisons);
* ``runs/experiment/<method>-s<seed>``   -- the research run of ``dvc.experiment_method``
  (``dvc exp run -S dvc.experiment_method=X``);
* ``metrics/train/<method>-s<seed>.json``, ``metrics/evaluate.json``, ``metrics/summary.json`` and
  ``metrics/experiment.json`` -- DVC metrics, keyed by method name whatever its hyper-parameters
  (:func:`summary_metrics`);
* ``plots/train/<method>-s<seed>/<task>.json`` and ``plots/experiment/s<seed>/<task>.json`` -- DVC plots: per epoch,
  the task's mean training loss and its primary metric on val and test (:func:`epoch_curves`);
  ``plots/pareto.json`` -- every sweep method's primary-metric error per task and whether it is Pareto-optimal
  (``.dvc/plots/offline.html``, the page ``dvc plots show`` writes, has the Vega libraries inlined);
* ``reports/latest`` and ``reports/experiment`` -- the aggregate reports (HTML, plots, tables).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow import methods as method_registry
from mtlflow.config.pipeline import (
    BUDGET_KEYS,
    DEFAULT_BUDGET,
    SweepConfig,
    TunedSweepConfig,
    canonical_hparams,
    merged_train_options,
    reference_options,
)
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.engine.rundir import read_run
from mtlflow.jobs import tune_steps
from mtlflow.jobs.baselines import applicable_kinds, baseline
from mtlflow.jobs.compare.summary import MethodRow, Summary
from mtlflow.jobs.tune import tune as tune_job
from mtlflow.ops import dvc as dvc_io

LOCK = Path("dvc.lock")
SOURCE = Path("data/source.json")
DATA = Path("data/prepared")
RUNS = Path("runs/mtl")
REFERENCES = Path("runs/reference")
EVALUATIONS = Path("runs/evaluation")
BASELINES = Path("runs/baselines")
EXPERIMENTS = Path("runs/experiment")
PLOTS = Path("plots")
TUNE = Path("runs/tune")
TUNE_METRICS = Path("metrics/tune.json")
#: params.yaml's ``tune`` section (the tune stage): TunedSweepConfig fields; the data and the budget are the sweep's
TUNE_KEYS = ("methods", "budget_trials", "budget_steps", "seed", "retrain_seeds", "search_spaces", "method_hparams",
             "pruner", "startup_trials", "selection", "folds")


@dataclass(frozen=True)
class DvcParams:
    """``params.yaml``: the sweep and the DVC pipeline's own settings."""

    sweep: SweepConfig
    reference_tasks: list[str]
    experiment_method: str
    #: the experiment method's hyper-parameters (``method_hparams`` may name it when it is not in the sweep)
    experiment_hparams: dict[str, Any]
    #: the tune stage's section (:data:`TUNE_KEYS`; checked by :func:`tune_config`)
    tune: dict[str, Any] = field(default_factory=dict)


def load_params(path: str | Path = "params.yaml") -> DvcParams:
    path = Path(path)
    if not path.exists():
        raise InvalidParameterError(f"{path} not found; run DVC stages from the project root")
    params = atomic.read_yaml(path, "params file") or {}
    if not isinstance(params, dict):
        raise InvalidParameterError(f"{path} must hold a mapping of sweep parameters and a dvc section")
    dvc = params.pop("dvc", None)
    tune = params.pop("tune", None) or {}
    if not isinstance(dvc, dict) or set(dvc) != {"reference_tasks", "experiment_method"}:
        raise InvalidParameterError(f"{path} needs a dvc section with exactly reference_tasks (the benchmark's "
                                    "tasks) and experiment_method (the research stage's method)")
    experiment = dvc["experiment_method"]
    method_registry.get(experiment)  # an unknown name fails with the valid ones
    hparams = params.get("method_hparams")
    if not isinstance(hparams, dict):
        raise InvalidParameterError(f"{path}: method_hparams must map every method of methods and "
                                    f"dvc.experiment_method to its hyper-parameters ({{}} for none), got {hparams!r}")
    sweep_methods = params.get("methods", SweepConfig.defaults()["methods"])
    sweep_methods = sweep_methods if isinstance(sweep_methods, list) else []  # SweepConfig names the error
    check_hparams_entries(path, hparams, sweep_methods, experiment)
    hparams = dict(hparams)
    experiment_hparams = dict(hparams.get(experiment) or {})
    # entries of methods outside the sweep (the experiment method, or methods that `-S methods=[...]` left out)
    # are checked here and not passed to the sweep
    for method in [m for m in hparams if m not in sweep_methods]:
        method_registry.build(method, 2, **dict(hparams.pop(method) or {}))  # checks the names and values
    sweep = SweepConfig.from_mapping({**params, "method_hparams": hparams}, where=f"{path} key(s)")
    tasks = sweep.build_benchmark().task_names
    if list(dvc["reference_tasks"] or []) != list(tasks):
        raise InvalidParameterError(f"{path}: dvc.reference_tasks must list the benchmark's tasks {tasks} (the "
                                    "references of Δm%)")
    return DvcParams(sweep, list(tasks), experiment, experiment_hparams, tune)


def check_hparams_entries(path: Path, hparams: dict[str, Any], methods: list[str], experiment: str) -> None:
    """Every method of the sweep and the experiment method has an entry under ``method_hparams`` (``{}`` for
    none): each train stage depends on its own method's entry only (``method_hparams.${item.method}`` in
    dvc.yaml, ``method_hparams.${dvc.experiment_method}`` for the experiment stage), so a change of one method's
    hyper-parameters re-runs that method's stages alone -- and DVC fails on a stage whose entry is missing."""
    missing = [m for m in dict.fromkeys([*methods, experiment]) if m not in hparams]
    if missing:
        listed = ", ".join(m if m in methods else f"{m} (dvc.experiment_method)" for m in missing)
        raise InvalidParameterError(
            f"{path}: method_hparams has no entry for {listed}; each DVC stage depends on its own method's entry: "
            f"add {', '.join(f'{m}: {{}}' for m in missing)} under method_hparams (with dvc exp run: -S "
            f"'+method_hparams.{missing[0]}={{}}')")
    for method, values in hparams.items():
        if values is not None and not isinstance(values, dict):
            raise InvalidParameterError(f"{path}: method_hparams.{method} must be a mapping of hyper-parameters "
                                        f"({{}} for none), got {values!r}")


def run_name(method: str, seed: int) -> str:
    return f"{method}-s{seed}"


def flat_metrics(final: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"{task}.{name}": value for task, values in final.items() for name, value in values.items()}


def data_identity(params: DvcParams) -> dict[str, Any]:
    return inside_project_relative(params.sweep.build_benchmark().data_identity(), Path.cwd())


def stage_source(params: DvcParams) -> None:
    atomic.write_json(SOURCE, data_identity(params))


def source_status(params: DvcParams, lock: Path = LOCK) -> dict[str, Any]:
    """Whether the data's inputs changed since ``dvc.lock``: the identity the source stage would write now
    against the one the lock records. DVC itself only says "always changed" for the source stage (it has to
    re-read the inputs), so this is how a new version of a table shows before ``dvc repro``."""
    locked = dvc_io.locked_md5(lock, "source", SOURCE.as_posix())
    if locked is None:
        return {"changed": True, "why": f"{lock} records no source stage: dvc repro runs the pipeline"}
    with tempfile.TemporaryDirectory(prefix="mtlflow-source-") as scratch:
        now = Path(scratch) / SOURCE.name
        atomic.write_json(now, data_identity(params))  # the very bytes the stage would write
        if dvc_io.file_md5(now) == locked:
            return {"changed": False, "why": "the data's inputs are those dvc.lock records"}
        fresh = atomic.read_json(now, "data identity")
    why = "the data's inputs changed since dvc.lock"
    if SOURCE.is_file() and dvc_io.file_md5(SOURCE) == locked:  # the workspace copy is the locked one: name keys
        recorded = atomic.read_json(SOURCE, "data identity")
        keys = sorted(k for k in {*recorded, *fresh} if recorded.get(k) != fresh.get(k))
        why += f" ({', '.join(keys)})"
    return {"changed": True, "why": why + ": dvc repro prepares the data again and re-runs what follows"}


def stage_status(params: DvcParams) -> dict[str, Any]:
    """``dvc status`` with the source stage's real state in place of "always changed": ``{stage: reasons}`` of
    every stage ``dvc repro`` would run (empty when everything is up to date)."""
    status = dvc_io.pipeline_status(".")
    status.pop("source", None)
    source = source_status(params)
    return {"source": [source["why"]], **status} if source["changed"] else status


def inside_project_relative(value: Any, project: Path) -> Any:
    """``value`` (a data identity) with every absolute local path inside ``project`` written relative to it.

    A task spec's table, images and weights are absolute once read (relative to the spec file); DVC runs every
    stage from the project root, so relative to it the same data has the same identity in every clone, on a CI
    runner as on the laptop that committed ``dvc.lock``, and only a new version of the data re-runs
    ``prepare``. Paths outside the project (a data volume) stay absolute."""
    if isinstance(value, dict):
        return {key: inside_project_relative(item, project) for key, item in value.items()}
    if isinstance(value, list):
        return [inside_project_relative(item, project) for item in value]
    if isinstance(value, str) and Path(value).is_absolute():
        try:
            return Path(value).relative_to(project.resolve()).as_posix()
        except ValueError:
            return value
    return value


def stage_prepare(params: DvcParams) -> None:
    benchmark, options = params.sweep.preparation()
    jobs.prepare(benchmark, DATA, overwrite=True, **options)


def _train_options(params: DvcParams) -> dict[str, Any]:
    """The runs' options under the one budget rule of every entry point (docs/guides/training.md): params.yaml's
    ``train_options`` merged key by key over the sweep's DEFAULT_BUDGET; when the data is a spec, the spec's own
    budget (its ``train:`` section over the spec defaults, what ``mtlflow train --spec`` and the pipeline give it)
    in place of params.yaml's laptop budget (:data:`BUDGET_KEYS`). Says which on stderr."""
    sweep = params.sweep
    if sweep.spec:
        laptop = {"epochs": sweep.epochs, **{k: v for k, v in sweep.train_options.items() if k in BUDGET_KEYS}}
        print(f"params.yaml: the data is the spec {sweep.spec}: its own budget rule (its train: section over the "
              f"spec defaults) sizes the runs, not params.yaml's {', '.join(f'{k}={v}' for k, v in laptop.items())}; "
              "set a spec's budget in its train: section", file=sys.stderr)
        return {k: v for k, v in sweep.train_options.items() if k not in BUDGET_KEYS}
    options, note = merged_train_options(DEFAULT_BUDGET, sweep.train_options, epochs_given=True)
    print(f"params.yaml {note}", file=sys.stderr)
    return {"epochs": sweep.epochs, **options}


def _train_method(params: DvcParams, method: str, seed: int, hparams: dict[str, Any], out: Path) -> dict[str, Any]:
    return jobs.train(DATA, out, method=method, seed=seed, hparams=hparams, overwrite=True, progress=False,
                      **_train_options(params))


def epoch_curves(run_dir: Path) -> dict[str, list[dict[str, float]]]:
    """Per task of a run, one row per epoch: its mean training loss and its primary metric on val and test (the
    rows of a DVC plot, whose fields must have the same names in every file)."""
    metrics = atomic.read_json(run_dir / "metrics.json", "run metrics")
    curves = {}
    for task in metrics["tasks"]:
        primary = metrics["primary_metrics"][task]
        curves[task] = [{"epoch": epoch["epoch"], "train_loss": epoch["train_loss"][task],
                         "val": epoch["splits"]["val"][task][primary], "test": epoch["splits"]["test"][task][primary]}
                        for epoch in metrics["epochs"]]
    return curves


def write_epoch_curves(run_dir: Path, out_dir: Path) -> None:
    for task, rows in epoch_curves(run_dir).items():
        atomic.write_json(out_dir / f"{task}.json", rows)


def stage_train(params: DvcParams, method: str, seed: int) -> None:
    hparams = params.sweep.method_hparams.get(method, {})
    out = RUNS / run_name(method, seed)
    result = _train_method(params, method, seed, hparams, out)
    atomic.write_json(Path("metrics/train") / f"{run_name(method, seed)}.json", flat_metrics(result["final"]["test"]))
    write_epoch_curves(out, PLOTS / "train" / run_name(method, seed))


def stage_reference(params: DvcParams, task: str, seed: int) -> None:
    jobs.train(DATA, REFERENCES / f"{task}-s{seed}", method="ls", seed=seed, tasks=[task], progress=False,
               overwrite=True, **reference_options(_train_options(params)))


def _reference_dirs(params: DvcParams) -> list[Path]:
    return [REFERENCES / f"{t}-s{s}" for t in params.reference_tasks for s in params.sweep.reference_seeds]


def _scores(row: MethodRow) -> dict[str, float]:
    scores = {"delta_m": row.delta_m and row.delta_m.mean, "mean_rank": row.mean_rank and row.mean_rank.mean,
              "hypervolume": row.hypervolume}
    return {k: v for k, v in scores.items() if v is not None}


def rows_by_method(params: DvcParams, summary: Summary) -> dict[str, MethodRow]:
    """The summary's rows under the sweep's method names. The summary labels a row with its hyper-parameters
    (``fairgrad(alpha=2.0)``); DVC compares metrics by key, so a key that changed with a hyper-parameter would
    read as one metric removed and another added (``-`` in ``dvc metrics diff``) instead of a change. A sweep
    has one row per method, so the name alone identifies it; its hyper-parameters are recorded as values."""
    method_of = {(RUNS / run_name(m, s)).resolve(): m for m in params.sweep.methods for s in params.sweep.seeds}
    return {method_of[Path(row.runs[0]).resolve()]: row for row in summary.methods.values()}


def summary_metrics(params: DvcParams, summary: Summary) -> dict[str, dict[str, Any]]:
    """``metrics/summary.json``: per method name, its scores and the hyper-parameters it ran with (``hparams``,
    left out when it has none: DVC drops an empty mapping, and the file reads back the same in ``dvc exp show``)."""
    metrics = {}
    for method, row in sorted(rows_by_method(params, summary).items()):
        hparams = canonical_hparams(method, params.sweep.method_hparams.get(method, {}))
        metrics[method] = {**_scores(row), **({"hparams": hparams} if hparams else {})}
    return metrics


def stage_evaluate(params: DvcParams) -> None:
    """Evaluate the final model of every sweep run on the test split (checks the data version too), keeping
    each example's error beside the evaluation for the aggregate's paired comparisons."""
    flat = {}
    for method in params.sweep.methods:
        for seed in params.sweep.seeds:
            name = run_name(method, seed)
            result = jobs.evaluate(RUNS / name, DATA, split="test", out_file=EVALUATIONS / f"{name}.json",
                                   per_example=True)
            flat[name] = flat_metrics(result["metrics"])
    atomic.write_json(Path("metrics/evaluate.json"), flat)


def stage_baselines(params: DvcParams) -> None:
    """Fit every baseline kind that fits the prepared data into ``runs/baselines/<kind>`` (from the cache when the
    same data had it fitted: :mod:`mtlflow.jobs.baselines`); ``metrics/baselines.json``: each kind's test metrics.
    ``params`` are not read: the data alone decides (the stage depends on data/prepared)."""
    flat = {}
    for kind in applicable_kinds(DATA):
        outcome = baseline(DATA, kind, BASELINES / kind, overwrite=True)
        flat[kind] = flat_metrics(outcome["metrics"]["test"])
    atomic.write_json(Path("metrics/baselines.json"), flat)


def _baseline_dirs() -> list[Path]:
    """The baselines the baselines stage fitted (none before it ran: the report then has no baseline rows)."""
    return sorted(p for p in BASELINES.iterdir() if (p / "run.json").is_file()) if BASELINES.is_dir() else []


def stage_aggregate(params: DvcParams) -> None:
    names = [run_name(m, s) for m in params.sweep.methods for s in params.sweep.seeds]
    summary = jobs.aggregate([RUNS / n for n in names], Path("reports/latest"), reference_dirs=_reference_dirs(params),
                             evaluations=[EVALUATIONS / f"{n}.json" for n in names], baseline_dirs=_baseline_dirs())
    atomic.write_json(Path("metrics/summary.json"), summary_metrics(params, summary))
    atomic.write_json(PLOTS / "pareto.json", pareto_points(params, summary))


#: the fields of the Pareto plot's axes (dvc.yaml's plots need fixed names): the first two tasks' errors
PARETO_AXES = ("first task error", "second task error")


def pareto_points(params: DvcParams, summary: Summary) -> list[dict[str, Any]]:
    """One row per sweep method (by name, as in ``metrics/summary.json``; ``label`` adds its hyper-parameters):
    its primary-metric error on each task (``<task> error``, lower is better; the first two again under
    :data:`PARETO_AXES`, the axes of the report's Pareto plot) and whether no other method beats it on every
    task."""
    return [{"method": method, "label": row.method, **dict(zip(PARETO_AXES, row.primary_errors, strict=False)),
             **{f"{task} error": error for task, error in zip(summary.tasks, row.primary_errors, strict=True)},
             "pareto_optimal": row.pareto_optimal}
            for method, row in sorted(rows_by_method(params, summary).items())]


def _check_references(params: DvcParams) -> None:
    """Refuse to start an experiment whose single-task references are missing or unfinished (DataError, exit 3)."""
    missing = [str(d) for d in _reference_dirs(params) if not (d / "run.json").is_file()]
    if missing:
        raise DataError(f"the single-task references {', '.join(missing)} are missing; train them first: "
                        "dvc repro reference (or mtlflow stage reference --task TASK --seed SEED)")
    for run_dir in _reference_dirs(params):
        read_run(run_dir)


def stage_experiment(params: DvcParams) -> None:
    """The research loop: train ``dvc.experiment_method`` (one run per seed of ``seeds``) and score it against
    the single-task references; ``dvc exp run -S dvc.experiment_method=X`` compares methods as experiments."""
    method = params.experiment_method
    _check_references(params)  # before any training: the score needs them
    runs = []
    for seed in params.sweep.seeds:
        out = EXPERIMENTS / run_name(method, seed)
        _train_method(params, method, seed, params.experiment_hparams, out)
        # one path per seed whatever the method: `dvc plots diff` overlays the experiments' methods
        write_epoch_curves(out, PLOTS / "experiment" / f"s{seed}")
        runs.append(out)
    summary = jobs.aggregate(runs, Path("reports/experiment"), reference_dirs=_reference_dirs(params))
    (row,) = summary.methods.values()
    atomic.write_json(Path("metrics/experiment.json"), {
        **_scores(row),
        **{f"test.{k}": v for k, v in flat_metrics(row.mean).items()}})


def tune_config(params: DvcParams) -> TunedSweepConfig:
    """The tune stage's settings: params.yaml's ``tune`` section on the sweep's data, validated."""
    if not isinstance(params.tune, dict) or set(params.tune) - set(TUNE_KEYS):
        raise InvalidParameterError(f"params.yaml: the tune section must be a mapping of {', '.join(TUNE_KEYS)}, got "
                                    f"{params.tune!r}")
    sweep = params.sweep
    data = {"benchmark": sweep.benchmark, "data_options": sweep.data_options, "spec": sweep.spec,
            "spec_rev": sweep.spec_rev}
    return TunedSweepConfig.from_mapping({**data, **params.tune}, where="params.yaml tune key(s)")


def stage_tune(params: DvcParams) -> None:
    """Tune every method of the tune section and the single-task references under the same budget, each trial
    trained under the sweep's budget rule (:func:`_train_options`), retrain the chosen configurations and compare
    them (``runs/tune``: mtlflow tune's work directory, tune.json and comparison), the same job as ``mtlflow tune``
    and the ``tuned_sweep`` pipeline; ``metrics/tune.json`` holds per study its best validation score, budget spent
    and chosen settings, and the comparison's best method."""
    arguments = {**tune_steps.tune_kwargs(tune_config(params).tune_arguments()),
                 "train_options": _train_options(params)}
    result = tune_job(TUNE, data_dir=DATA, progress=False, **arguments)
    best = atomic.read_json(TUNE / result["comparison"]["results"], "tuned comparison")["best_method"]
    atomic.write_json(TUNE_METRICS, {"best_method": best, **tune_steps.tuned_metrics(result)})
