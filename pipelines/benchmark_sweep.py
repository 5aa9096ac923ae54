r"""benchmark_sweep: version the data, train every (method, seed) and the single-task references, fit the
per-task baselines, evaluate, compare -- and always record how the run ended.

    ExitHandler(record_status) {
      prepare_data (DVC push) ─┬─ plan_runs ──────── ParallelFor(train → evaluate) ─┐
                               ├─ plan_references ── ParallelFor(train) ────────────┤
                               └─ plan_baselines ─── ParallelFor(baseline) ─────────┴─ aggregate
    }

The baselines (trivial always, hgb and linear for a table: planned from the prepared data) are rows of the
comparison, never in its scores; they are cached by the data's content hash on the checkpoints volume.

On the cluster every ``train`` requests one GPU, CPU and memory, is retried with back-off and keeps
its run directory on the checkpoints PVC under a key of its inputs (spec, data content hash, epochs,
options), so a retried or preempted task resumes from its last epoch and a finished training of the
same inputs -- from any earlier run -- is reused, while a failed one is trained again; loops run at
most ``parallelism`` tasks at once. kfp.local ignores the cluster settings.

Caching: ``prepare_data`` is never cached -- its DVC remote (and credentials) come from the
``mtlflow-dvc-remote`` Secret, which is not part of a KFP cache key, and a cache hit would skip the
push to a newly configured remote. Its output is a new artifact in every run, so KFP's cache does not
hit downstream of it either; the reuse of finished trainings is the run key's on the checkpoints PVC.
The exit handler, ``train`` and ``aggregate`` push to the Pushgateway and are not cached either.
"""

from typing import List

from kfp import dsl

from mtlflow.components.aggregate.component import aggregate
from mtlflow.components.baseline.component import baseline, plan_baselines
from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.plan_runs.component import plan_references, plan_runs
from mtlflow.components.prepare_data.component import prepare_data
from mtlflow.components.record_status.component import record_status
from mtlflow.components.train.component import train
from mtlflow.config.pipeline import SweepConfig
from mtlflow.ops.storage import CLUSTER_ROOT, StorageLayout
from mtlflow.pipelines import cluster

#: the pipeline's parameters: SweepConfig's fields, with its defaults (`mtlflow config schema --of sweep`)
DEFAULTS = SweepConfig.defaults()
#: concurrent training tasks per loop on the cluster (a compile-time constant in KFP)
PARALLELISM = 4


def status_handler(pipeline: str, layout: StorageLayout, pushgateway="") -> dsl.PipelineTask:
    """The exit task of a pipeline: records SUCCEEDED/FAILED with the error under the status dir (and
    pushes it to the Pushgateway when one is given)."""
    task = record_status(pipeline=pipeline, job_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, status_dir=layout.status,
                         pushgateway=pushgateway)
    task.set_display_name("record run status")
    return cluster.mount(cluster.uncached(cluster.light(task)), layout, "mtlflow-checkpoints")


def versioned_data(layout: StorageLayout, benchmark, data_options, spec, spec_rev, data_version,
                   dvc_remote) -> dsl.PipelineTask:
    """prepare_data with the DVC remote (Secret on the cluster, the data volume's directory by default);
    not cached: the Secret is not part of the cache key (see the module docstring)."""
    task = prepare_data(benchmark=benchmark, data_options=data_options, spec=spec, spec_rev=spec_rev,
                        data_version=data_version, dvc_remote=dvc_remote, default_remote=layout.dvc_remote,
                        dvc_cache=layout.dvc_cache)
    task.set_display_name("prepare and version data")
    return cluster.uncached(cluster.data_access(task, layout))


def training(layout: StorageLayout, data, run_spec, epochs, train_options, pushgateway="",
             pipeline_name: str = "") -> dsl.PipelineTask:
    """One GPU training task that checkpoints to (and resumes from) the checkpoints volume -- in the
    directory of its inputs' run key, shared by every pipeline run with the same inputs -- and pushes its
    telemetry to ``pushgateway`` (empty: off) labelled ``pipeline=pipeline_name`` and ``run=<run key>``, grouped
    also by ``pipeline_run=<this pipeline run's name>`` so that the exit handler deletes exactly this run's
    groups. Not cached: it takes the run's name and pushes (a cache hit would push nothing), and KFP's cache would
    not hit anyway, prepare_data's output being new in every run; the reuse of a finished training across
    pipeline runs is the run key's on the checkpoints volume, which leaves the run's name out."""
    task = train(data=data, run_spec=run_spec, epochs=epochs, train_options=train_options,
                 checkpoint_root=layout.checkpoints, pushgateway=pushgateway, pipeline_name=pipeline_name,
                 pipeline_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)
    return cluster.uncached(cluster.gpu_training(task, layout))


def baselines(layout: StorageLayout, data) -> dsl.PipelineTask:
    """The per-task baselines of ``data``, one task per kind that fits it (planned from the prepared data: the
    trivial one always, hgb and linear for a table), cached by data hash on the checkpoints volume, so a sweep
    of the same data refits none; the last task of the loop, whose ``run`` outputs ``dsl.Collected`` gathers."""
    kinds = cluster.light(plan_baselines(data=data))
    kinds.set_display_name("plan baselines")
    with dsl.ParallelFor(kinds.output) as kind:
        fitted = baseline(data=data, kind=kind, cache_root=layout.checkpoints)
        fitted.set_display_name("fit baseline")
        cluster.mount(cluster.light(fitted), layout, "mtlflow-checkpoints")
    return fitted


def build_benchmark_sweep(parallelism: int = PARALLELISM, storage_root: str = CLUSTER_ROOT):
    """The sweep with ``parallelism`` concurrent training tasks per loop -- capped so that both loops together
    fit the cluster profile's ``gpu_quota`` -- and its state (DVC remote and cache, checkpoints, status
    records) under ``storage_root``; both are compile-time settings (local runs use the number of cores and
    a local folder)."""
    layout = StorageLayout(storage_root)

    @dsl.pipeline(name="mtlflow-benchmark-sweep", description="Version the data with DVC, train MTL methods x "
                  "seeds and single-task references, evaluate, and compare them by Δm%, mean rank, "
                  "hypervolume and Pareto set; the run status is always recorded.")
    def benchmark_sweep(
        benchmark: str = DEFAULTS["benchmark"],
        data_options: dict = DEFAULTS["data_options"],
        spec: str = DEFAULTS["spec"],
        spec_rev: str = DEFAULTS["spec_rev"],
        data_version: str = DEFAULTS["data_version"],
        dvc_remote: str = DEFAULTS["dvc_remote"],
        methods: List[str] = DEFAULTS["methods"],
        seeds: List[int] = DEFAULTS["seeds"],
        method_hparams: dict = DEFAULTS["method_hparams"],
        epochs: int = DEFAULTS["epochs"],
        train_options: dict = DEFAULTS["train_options"],
        reference_seeds: List[int] = DEFAULTS["reference_seeds"],
        pushgateway: str = DEFAULTS["pushgateway"],
    ):
        per_loop = cluster.loop_parallelism(parallelism, loops=2)  # the methods' and the references' loops
        with dsl.ExitHandler(status_handler("benchmark_sweep", layout, pushgateway), name="sweep"):
            prep = versioned_data(layout, benchmark, data_options, spec, spec_rev, data_version, dvc_remote)
            data = prep.outputs["data"]
            runs = cluster.light(plan_runs(methods=methods, seeds=seeds, method_hparams=method_hparams))
            refs = cluster.light(plan_references(tasks=prep.outputs["Output"], seeds=reference_seeds))
            with dsl.ParallelFor(runs.output, parallelism=per_loop) as run_spec:
                trained = training(layout, data, run_spec, epochs, train_options, pushgateway, "benchmark_sweep")
                trained.set_display_name("train method")
                cluster.light(evaluate(data=data, run=trained.outputs["run"], split="test"))
            with dsl.ParallelFor(refs.output, parallelism=per_loop) as ref_spec:
                reference = training(layout, data, ref_spec, epochs, train_options, pushgateway, "benchmark_sweep")
                reference.set_display_name("train single-task reference")
            fitted = baselines(layout, data)
            # not cached: a cached comparison would push nothing to the Pushgateway
            cluster.uncached(cluster.light(aggregate(
                runs=dsl.Collected(trained.outputs["run"]), references=dsl.Collected(reference.outputs["run"]),
                method_set=methods, pushgateway=pushgateway, pipeline_name="benchmark_sweep",
                run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, baselines=dsl.Collected(fitted.outputs["run"]))))

    return benchmark_sweep
