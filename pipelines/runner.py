"""Compile pipelines to IR YAML and run them locally with kfp.local's SubprocessRunner.

Parameters are validated here, before compilation or execution, so an invalid sweep never reaches a
cluster or requests a GPU.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from mtlflow import atomic
from mtlflow.errors import InvalidParameterError, UnknownNameError


def pipeline_factories() -> dict[str, Callable[[int], Callable]]:
    """Name -> factory building the pipeline for a given loop parallelism."""
    from pipelines.main import build_main_pipeline

    return {"main": build_main_pipeline}


def pipelines() -> dict[str, Callable]:
    """Name -> pipeline as compiled for the cluster."""
    from pipelines.main import PARALLELISM

    return {name: factory(PARALLELISM) for name, factory in pipeline_factories().items()}


def get_pipeline(name: str, parallelism: int | None = None) -> Callable:
    from pipelines.main import PARALLELISM

    factories = pipeline_factories()
    if name not in factories:
        raise UnknownNameError("pipeline", name, sorted(factories))
    return factories[name](parallelism or PARALLELISM)


def load_params(path: str | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if path:
        file = Path(path)
        if not file.is_file():
            raise InvalidParameterError(f"parameter file not found: {file}")
        loaded = yaml.safe_load(file.read_text()) or {}
        if not isinstance(loaded, dict):
            raise InvalidParameterError(f"{file} must hold a mapping of pipeline parameters")
        params.update(loaded)
    params.update(overrides)
    return params


def validate_params(pipeline: str, params: Mapping[str, Any]) -> None:
    """Check names and values of pipeline parameters before anything runs."""
    import inspect

    from mtlflow import benchmarks
    from mtlflow.pipeline_specs import validate_sweep

    func = get_pipeline(pipeline)
    signature = inspect.signature(func.pipeline_func)
    unknown = sorted(set(params) - set(signature.parameters))
    if unknown:
        raise InvalidParameterError(f"unknown pipeline parameter(s) {', '.join(unknown)}; valid: "
                                    f"{', '.join(signature.parameters)}")
    merged = {k: p.default for k, p in signature.parameters.items()}
    merged.update(params)
    bench = benchmarks.build(merged["benchmark"], **merged.get("data_options") or {})
    validate_sweep(merged["methods"], merged["seeds"], merged.get("method_hparams"), merged.get("epochs"),
                   n_tasks=len(bench.task_names))
    if not merged.get("reference_seeds"):
        raise InvalidParameterError("reference_seeds is empty; Δm% needs at least one single-task run per task")


def compile_pipeline(out: str | Path, pipeline: str = "main") -> Path:
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(get_pipeline(pipeline), str(out))
    return out


def run_local(params: Mapping[str, Any], workdir: str | Path = "runs/pipeline", pipeline: str = "main") -> Path:
    """Run ``pipeline`` with kfp.local (SubprocessRunner, no venv); returns the HTML report path."""
    from kfp import local

    validate_params(pipeline, params)
    # One torch thread per task and as many concurrent tasks as cores: oversubscribed intra-op
    # threads made a 4-way parallel CPU run 3-4x slower than this.
    cores = max(1, len(os.sched_getaffinity(0)))
    previous_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir / "artifacts"),
               raise_on_error=True)
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
            result = get_pipeline(pipeline, parallelism=cores)(**params)
    finally:
        if previous_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous_threads
    seconds = time.perf_counter() - started
    artifact = Path(result.output.path)
    results = artifact.parent / "results"
    # Stable, human-friendly copies next to the kfp.local artifact tree.
    report = workdir / "report.html"
    atomic.write_bytes(report, artifact.read_bytes())
    if results.is_dir():
        with atomic.atomic_dir(workdir / "results") as tmp:
            shutil.copytree(results, tmp, dirs_exist_ok=True)
    atomic.write_json(workdir / "pipeline_run.json", {"pipeline": pipeline, "params": dict(params),
                                                     "seconds": round(seconds, 1), "artifact": str(artifact)})
    print(f"pipeline {pipeline} finished in {seconds:.1f} s")
    return report
