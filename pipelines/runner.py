"""Compile pipelines to IR YAML and run them locally with kfp.local's SubprocessRunner.

Parameters are validated here, before compilation, submission or execution, so an invalid sweep
never reaches a cluster or requests a GPU.

Pipelines: ``benchmark_sweep`` (alias ``main``, the ``make demo`` pipeline), ``retrain``, ``tuned_sweep`` and
``distributed_train`` (cluster only). Each is built by a factory ``(parallelism, storage_root)``:
both are compile-time settings -- the cluster build uses :data:`PARALLELISM` and the PVC mount root
``/mnt/mtlflow``; a local run uses the number of CPU cores and ``<workdir>/storage``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, TextIO

from mtlflow.config.pipeline import pipeline_config
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError, MtlflowError, UnknownNameError

if TYPE_CHECKING:
    from mtlflow.config.cluster import ClusterProfile

ALIASES = {"main": "benchmark_sweep"}
#: pipelines that kfp.local can run (distributed_train creates Kubernetes objects)
LOCAL_PIPELINES = ("benchmark_sweep", "retrain", "tuned_sweep")


def pipeline_factories() -> dict[str, Callable[..., Callable]]:
    """Name -> factory ``(parallelism, storage_root)`` building the pipeline."""
    from mtlflow.pipelines.benchmark_sweep import build_benchmark_sweep
    from mtlflow.pipelines.distributed_train import build_distributed_train
    from mtlflow.pipelines.retrain import build_retrain
    from mtlflow.pipelines.tuned_sweep import build_tuned_sweep

    return {"benchmark_sweep": build_benchmark_sweep, "retrain": build_retrain,
            "distributed_train": build_distributed_train, "tuned_sweep": build_tuned_sweep}


def canonical_name(name: str) -> str:
    name = ALIASES.get(name, name)
    factories = pipeline_factories()
    if name not in factories:
        raise UnknownNameError("pipeline", name, sorted([*factories, *ALIASES]))
    return name


def pipelines() -> dict[str, Callable]:
    """Name -> pipeline as compiled for the cluster (aliases excluded)."""
    return {name: factory() for name, factory in pipeline_factories().items()}


def get_pipeline(name: str, parallelism: int | None = None, storage_root: str | None = None) -> Callable:
    from mtlflow.ops.storage import CLUSTER_ROOT
    from mtlflow.pipelines.benchmark_sweep import PARALLELISM

    factory = pipeline_factories()[canonical_name(name)]
    return factory(parallelism or PARALLELISM, storage_root or CLUSTER_ROOT)


def load_params(path: str | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if path:
        file = Path(path)
        loaded = atomic.read_yaml(file, "parameter file") or {}
        if not isinstance(loaded, dict):
            raise InvalidParameterError(f"{file} must hold a mapping of pipeline parameters")
        params.update(loaded)
    params.update(overrides)
    return params


def validate_params(pipeline: str, params: Mapping[str, Any]) -> None:
    """Check names and values of pipeline parameters before anything is compiled, submitted or run
    (:func:`mtlflow.config.pipeline.pipeline_config`)."""
    pipeline_config(canonical_name(pipeline), params)


class PipelineFailed(MtlflowError):
    """A task of a local pipeline run failed (its error is in the run's log)."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: a task's own error in its traceback: any mtlflow exception (mtlflow.core.errors.DataError, the spec's
#: mtlflow.benchmarks._spec.schema.SpecError, ...) with its one-line message
_TASK_ERROR = re.compile(r"\bmtlflow(?:\.\w+)*\.\w*(?:Error|Failed|Exceeded|Terminated)\w*: (.+)$")


def failure_reason(message: str, log_path: Path) -> str:
    """The failed task's own one-line error from the run's log, else kfp.local's summary of the failure."""
    lines = log_path.read_text(errors="replace").splitlines() if log_path.is_file() else []
    errors = [m.group(1).strip() for m in map(_TASK_ERROR.search, lines) if m]
    summary = _ANSI.sub("", message).strip().splitlines()[0]
    return errors[-1] if errors else summary


def compile_pipeline(out: str | Path, pipeline: str = "benchmark_sweep", profile: ClusterProfile | None = None) -> Path:
    """The pipeline's IR YAML, its tasks set up by the cluster ``profile`` (``None``: the profile already
    active, :func:`mtlflow.pipelines.cluster.profile_applied`, else the default one)."""
    from kfp import compiler

    from mtlflow.pipelines import cluster

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with cluster.profile_applied(profile) if profile is not None else contextlib.nullcontext():
        compiler.Compiler().compile(get_pipeline(pipeline), str(out))
    return out


def compile_all(out_dir: str | Path, profile: ClusterProfile | None = None) -> list[Path]:
    """Every pipeline's IR YAML as ``<out_dir>/<name>.yaml``."""
    return [compile_pipeline(Path(out_dir) / f"{name}.yaml", pipeline=name, profile=profile)
            for name in pipeline_factories()]


def _expected_tasks(name: str, pipeline_func: Callable, params: Mapping[str, Any]) -> int:
    """How many tasks a local run executes (for the progress line's N/M and ETA)."""
    import inspect

    from mtlflow import benchmarks
    from mtlflow.benchmarks._tabular import TabularBenchmark
    from mtlflow.config.pipeline import from_struct
    from mtlflow.ops.observability.progress import expected_tasks

    merged = {k: p.default for k, p in inspect.signature(pipeline_func.pipeline_func).parameters.items()}
    merged.update(from_struct(dict(params)))
    bench = benchmarks.build(merged["benchmark"], **merged.get("data_options") or {})
    # the sweep fits hgb and linear baselines too for a table (a spec's, a table benchmark's), else the trivial one
    tabular = bool(merged.get("spec")) or isinstance(bench, TabularBenchmark)
    return expected_tasks(name, merged, len(bench.task_names), baseline_kinds=3 if tabular else 1)


def _latest_run_dir(artifact_root: Path, pipeline_func: Callable, started: float) -> Path:
    prefix = pipeline_func.component_spec.name + "-"
    runs = [p for p in artifact_root.glob(prefix + "*") if p.is_dir() and p.stat().st_mtime >= started - 1]
    if not runs:
        raise RuntimeError(f"kfp.local wrote no run directory {prefix}* under {artifact_root}")
    return max(runs, key=lambda p: p.stat().st_mtime)


#: where a local run's task output (kfp.local's executor logs, every task's prints) goes, in the work directory
LOG_NAME = "kfp-local.log"


@contextlib.contextmanager
def task_output_to(log_path: Path) -> Iterator[TextIO]:
    """Send everything written to this process's stdout and stderr -- and so the kfp.local task subprocesses'
    output, which they inherit -- to ``log_path``; yields a stream on the real terminal for progress lines."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    try:
        with open(log_path, "a", buffering=1) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:  # Python-level writers (kfp.local's log handler) too, whatever sys.stdout was
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield terminal
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        terminal.close()
        for fd in saved:
            os.close(fd)


def execute_locally(name: str, pipeline_func: Callable, params: Mapping[str, Any], log_path: Path, announce: str,
                    progress: Callable[[TextIO], contextlib.AbstractContextManager] | None = None) -> None:
    """Run ``pipeline_func(**params)`` under the kfp.local runner already initialised: one torch thread per task
    (oversubscribed intra-op threads made a 4-way parallel CPU run 3-4x slower), the tasks' output into
    ``log_path`` after ``announce`` on the terminal, ``progress(terminal)`` around the run when given; a failed
    task is :class:`PipelineFailed` naming the task's own one-line error."""
    previous_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with task_output_to(log_path) as terminal:
            print(announce, file=terminal, flush=True)
            original_print = builtins.print
            try:
                with warnings.catch_warnings(), progress(terminal) if progress else contextlib.nullcontext():
                    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
                    pipeline_func(**params)
            except RuntimeError as exc:  # kfp.local's "finished with status FAILURE", after the task's own output
                raise PipelineFailed(f"pipeline {name} failed: {failure_reason(str(exc), log_path)}; the tasks' "
                                     f"output is in {log_path}") from None
            finally:
                # kfp.local indents prints by swapping builtins.print per task; concurrent tasks restore each
                # other's swaps out of order and can leave an indenting print behind
                builtins.print = original_print
    finally:
        if previous_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous_threads


def run_local(params: Mapping[str, Any], workdir: str | Path = "runs/pipeline", pipeline: str = "benchmark_sweep",
              storage_root: str | Path | None = None) -> Path:
    """Run ``pipeline`` with kfp.local (SubprocessRunner, no venv).

    State that outlives a run -- DVC remote and cache, checkpoints, status records, the model store --
    goes to ``storage_root`` (default ``<workdir>/storage``; reuse it so ``retrain`` sees the champion).
    Returns ``<workdir>/report.html`` for ``benchmark_sweep`` and ``tuned_sweep`` (which also writes
    ``<workdir>/tune.json``) and ``<workdir>/retrain.json`` (decision, champion, status) for ``retrain``.
    """
    from kfp import local

    from mtlflow.ops.observability.progress import PipelineProgress
    from mtlflow.ops.storage import StorageLayout

    name = canonical_name(pipeline)
    if name not in LOCAL_PIPELINES:
        raise InvalidParameterError(f"pipeline {name} creates Kubernetes jobs and runs only on a cluster; "
                                    "submit it with `mtlflow pipeline submit --host URL`")
    from mtlflow.core.outputs import check_output_dir

    check_output_dir(workdir, "--workdir")
    if storage_root is not None:
        check_output_dir(storage_root, "--storage-root")
    spec = str(params.get("spec") or "")
    if spec and "://" not in spec:  # the tasks run in other processes: a spec path relative to here, made absolute
        params = {**params, "spec": str(Path(spec).resolve())}
    tuned = str(params.get("tuned") or "")
    if tuned:  # retrain's tuning result, read by a task in another process: absolute too
        params = {**params, "tuned": str(Path(tuned).resolve())}
    config = pipeline_config(name, params)
    if getattr(config, "tuner", "optuna") == "katib":
        raise InvalidParameterError("tuner katib creates Katib Experiments and runs only on a cluster; run locally "
                                    "with tuner optuna, or submit it with `mtlflow pipeline submit --host URL`")
    from mtlflow.jobs.data import source_paths

    bench = config.build_benchmark()
    check_source = getattr(bench, "check_source", None)
    if check_source is not None:  # a spec's table, labels and split: refused here, before the workdir is written
        check_source()
    # the workdir holds the DVC storage and artifacts: it must keep clear of the data it is prepared from
    sources = source_paths(bench, config.preparation()[1])
    check_output_dir(workdir, "--workdir", sources)
    if storage_root is not None:
        check_output_dir(storage_root, "--storage-root", sources)
    # as many concurrent tasks as cores, one torch thread each (execute_locally)
    cores = max(1, len(os.sched_getaffinity(0)))
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    layout = StorageLayout(str(Path(storage_root).resolve() if storage_root else workdir / "storage"))
    pipeline_func = get_pipeline(name, parallelism=cores, storage_root=layout.root)
    artifact_root = workdir / "artifacts"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(artifact_root), raise_on_error=True)
    log_path = workdir / LOG_NAME
    started = time.time()
    execute_locally(name, pipeline_func, params, log_path, f"pipeline {name}: running; the tasks' output goes to "
                    f"{log_path}", lambda terminal: PipelineProgress(
                        name, _expected_tasks(name, pipeline_func, params), artifact_root, stream=terminal))
    seconds = time.time() - started
    run_dir = _latest_run_dir(artifact_root, pipeline_func, started)
    status = atomic.read_json(Path(layout.status) / f"{run_dir.name}.json", "run status record")
    summary = {"pipeline": name, "params": dict(params), "seconds": round(seconds, 1), "artifacts": str(run_dir),
               "storage_root": layout.root, "status": status}
    if name == "benchmark_sweep":
        result = _collect_sweep(run_dir, workdir)
    elif name == "tuned_sweep":
        result = _collect_tuned(run_dir, workdir)
    else:
        result = _collect_retrain(run_dir, workdir, layout, config.build_benchmark().label, summary)
    atomic.write_json(workdir / "pipeline_run.json", summary)
    print(f"pipeline {name} finished in {seconds:.1f} s")
    return result


def _collect_sweep(run_dir: Path, workdir: Path) -> Path:
    """Stable, human-friendly copies of the report and results next to the kfp.local artifact tree."""
    artifact = next(run_dir.rglob("aggregate/report"))
    report = workdir / "report.html"
    atomic.write_bytes(report, artifact.read_bytes())
    results = artifact.parent / "results"
    if results.is_dir():
        with atomic.atomic_dir(workdir / "results") as tmp:
            shutil.copytree(results, tmp, dirs_exist_ok=True)
    return report


def _collect_tuned(run_dir: Path, workdir: Path) -> Path:
    """The tuned comparison's report and ``tune.json`` next to the kfp.local artifact tree."""
    task = next(run_dir.rglob("compare-tuned/report")).parent
    atomic.write_bytes(workdir / "tune.json", (task / "result").read_bytes())
    report = workdir / "report.html"
    atomic.write_bytes(report, (task / "report").read_bytes())
    return report


def _collect_retrain(run_dir: Path, workdir: Path, layout, dataset: str, summary: dict[str, Any]) -> Path:
    """``retrain.json``: the outcome decided under the model store's lock (the settled decision record), not
    the gate's verdict, which a concurrent retrain can overtake."""
    from mtlflow.ops import model_store

    proposed = atomic.read_json(next(run_dir.rglob("compare-to-champion/decision")), "gate decision")
    record = model_store.decisions_dir(layout.models, dataset) / proposed["record"]
    decision = atomic.read_json(record, "gate decision record")
    result = {"promoted": bool(decision["promoted"]), "outcome": decision["outcome"],
              "champion": model_store.read_champion(layout.models, dataset), "decision": str(record),
              "model_store": layout.models, "status": summary["status"]}
    path = workdir / "retrain.json"
    atomic.write_json(path, result)
    return path
