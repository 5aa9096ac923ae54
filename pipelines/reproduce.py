r"""reproduce: one seed paper's claim (`mtlflow reproduce CLAIM`) as a pipeline, each seed a task of its own.

    ExitHandler(record_status) {
      plan_claim ── ParallelFor(seed: reproduce_seed) ── combine_claim (result file + metrics)
    }

``reproduce_seed`` runs one seed's runs (:func:`mtlflow.experiments.claims.measure_seed`) and writes its
measurement as an artifact; ``combine_claim`` turns them into the claim's result file -- the JSON `mtlflow
reproduce` writes, with the same values, mean, 95 % interval and verdict (:func:`~mtlflow.experiments.claims.
combine_seeds`) -- and logs its numbers as KFP metrics. The claims and their papers' tables are in
:mod:`mtlflow.experiments.claims`.

The device is a compile-time setting, like the cluster profile: ``cuda`` gives every seed task the profile's
accelerator, GPU node selector and tolerations, ``cpu`` the profile's train CPU/memory without one. Seed tasks
are not cached (a run measures afresh), are retried with back-off and keep their runs on the checkpoints PVC
under ``claims/<scale>-<digest of the configuration>`` (the CLI's ``runs/claims/`` layout), so a retried task
reuses the runs it finished; they mount the data volume too, where a claim's ``--data-dir`` (data we cannot
ship) lies. kfp.local ignores the cluster settings (`mtlflow reproduce CLAIM --pipeline --local`).
"""

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from kfp import dsl

from mtlflow.components.reproduce.component import combine_claim, plan_claim, reproduce_seed
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops.storage import CLUSTER_ROOT, StorageLayout
from mtlflow.pipelines import cluster
from mtlflow.pipelines.benchmark_sweep import PARALLELISM, status_handler

DEVICES = ("cpu", "cuda")
PIPELINE_NAME = "mtlflow-reproduce"


def build_reproduce(parallelism: int = PARALLELISM, storage_root: str = CLUSTER_ROOT, device: str = "cpu",
                    defaults: Optional[Mapping[str, Any]] = None):
    """The pipeline with ``parallelism`` concurrent seed tasks (capped by the profile's GPU quota on ``cuda``),
    its state under ``storage_root`` and its seed tasks on ``device``; ``defaults`` (:func:`parameters`) are the
    default values of its parameters (what a submitted run without parameters reproduces)."""
    given = {**parameters("asmg-synthetic", "ci"), **dict(defaults or {})}
    if device not in DEVICES:
        raise InvalidParameterError(f"--device must be one of {', '.join(DEVICES)} for --pipeline, got {device!r}")
    layout = StorageLayout(storage_root)
    work_root = f"{layout.mount('mtlflow-checkpoints')}/claims"  # next to the sweeps' runs/, on the same PVC

    @dsl.pipeline(name=PIPELINE_NAME, description="Reproduce one seed paper's claim: each seed's runs as a task, "
                  "then the claim's result file (every seed's value, the mean and 95 % interval, the verdict).")
    def reproduce(
        claim: str = given["claim"],
        scale: str = given["scale"],
        seeds: List[int] = given["seeds"],  # empty: the scale's seeds
        settings: str = given["settings"],
        data_options: str = given["data_options"],
        command: str = given["command"],
        pushgateway: str = "",
    ):
        with dsl.ExitHandler(status_handler("reproduce", layout, pushgateway), name="reproduce"):
            plan = cluster.light(plan_claim(claim=claim, scale=scale, seeds=seeds, settings=settings))
            plan.set_display_name("plan seeds")
            loop = cluster.loop_parallelism(parallelism, loops=1) if device == "cuda" else parallelism
            with dsl.ParallelFor(plan.output, parallelism=loop) as seed:
                measured = reproduce_seed(claim=claim, scale=scale, seed=seed, device=device, settings=settings,
                                          data_options=data_options, work_root=work_root)
                measured.set_display_name("reproduce one seed")
                # not cached: a submitted run measures afresh (timings, the date); trained runs are reused from
                # the checkpoints PVC as `mtlflow reproduce` reuses runs/claims/
                (cluster.gpu_training if device == "cuda" else cluster.cpu_training)(cluster.uncached(measured), layout)
                # data we cannot ship (--data-dir) is read from the data volume
                cluster.mount(measured, layout, "mtlflow-data")
            combined = combine_claim(claim=claim, scale=scale, seeds=plan.output,
                                     parts=dsl.Collected(measured.outputs["part"]), device=device,
                                     settings=settings, data_options=data_options, command=command)
            combined.set_display_name("combine seeds into the result")
            cluster.uncached(cluster.light(combined))

    return reproduce


def parameters(claim: str, scale: str, seeds: Sequence[int] | None = None, settings: Mapping[str, Any] | None = None,
               data_options: Mapping[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """The pipeline's parameters for one claim (settings and data options as JSON: exact numbers)."""
    return {"claim": claim, "scale": scale, "seeds": list(seeds or []), "settings": json.dumps(dict(settings or {})),
            "data_options": json.dumps(dict(data_options or {})), "command": command}


def compile_reproduce(out: str | Path, params: Mapping[str, Any], device: str = "cpu", profile=None) -> Path:
    """The pipeline's IR YAML (written atomically) for the cluster ``profile`` (None: the default one), with
    ``params`` (:func:`parameters`) as its parameters' defaults."""
    from kfp import compiler

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="mtlflow-compile-") as tmp, cluster.profile_applied(profile):
        package = Path(tmp) / "reproduce.yaml"
        compiler.Compiler().compile(build_reproduce(device=device, defaults=params), str(package))
        atomic.write_bytes(out, package.read_bytes())
    return out


def run_local(params: Mapping[str, Any], workdir: str | Path, device: str = "cpu") -> dict[str, Any]:
    """Run the pipeline with kfp.local (SubprocessRunner, no venv, one torch thread per task and as many
    concurrent seed tasks as cores); the seeds' runs and the status records go to ``<workdir>/storage``.
    Returns the result record (the combine task's ``result`` artifact, also at ``<workdir>/result.json``)."""
    from kfp import local

    from mtlflow.pipelines.runner import LOG_NAME, PipelineFailed, execute_locally

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    cores = max(1, len(os.sched_getaffinity(0)))
    pipeline_func = build_reproduce(parallelism=cores, storage_root=str(workdir / "storage"), device=device)
    artifact_root = workdir / "artifacts"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(artifact_root), raise_on_error=True)
    log_path = workdir / LOG_NAME
    started = time.time()
    execute_locally("reproduce", pipeline_func, params, log_path,
                    f"pipeline reproduce: running {params['claim']} ({params['scale']}); the tasks' output goes to "
                    f"{log_path}")
    runs = [p for p in artifact_root.glob(f"{PIPELINE_NAME}-*") if p.is_dir() and p.stat().st_mtime >= started - 1]
    if not runs:
        raise PipelineFailed(f"kfp.local wrote no run directory {PIPELINE_NAME}-* under {artifact_root}")
    result = next(max(runs, key=lambda p: p.stat().st_mtime).rglob("combine-claim/result"))
    record = atomic.read_json(result, "claim result")
    atomic.write_json(workdir / "result.json", record)
    return record
