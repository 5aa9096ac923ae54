r"""distributed_train: one method trained on several GPUs/nodes as a Kubeflow Trainer TrainJob
(``job_kind=PyTorchJob`` for clusters with training-operator v1), then evaluated.

    ExitHandler(record_status) { prepare_data → plan_run → launch_trainjob → evaluate }

Cluster only: the launcher creates Kubernetes objects, which kfp.local cannot. The job runs the
project image with ``torchrun -m mtlflow train ... --resume`` on the PVCs of ``k8s/base``: torchrun
takes its topology from the ``PET_*`` variables the operator sets (Kubeflow Trainer's torch runtime;
for PyTorchJob a training-operator release that sets ``PET_MASTER_ADDR``), each process trains on its
GPU (``LOCAL_RANK``, NCCL) and its shard of every global batch of ``num_nodes x gpus_per_node x
train_options.batch_size`` samples (:mod:`mtlflow.engine.distributed`), and rank 0 writes the run directory
on the checkpoints volume. The cluster profile the pipeline is compiled with goes to the launcher as a
constant, so the job's pods get the same node selection, tolerations, user and pull Secrets as the
pipeline's own tasks, and CPU/memory per GPU; the job's deadline is the profile's
``trainjob.deadline_seconds`` and its rank 0 pushes telemetry to ``pushgateway`` like a training task.
"""

from kfp import dsl

from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.image import IMAGE
from mtlflow.components.launch_trainjob.component import launch_trainjob
from mtlflow.components.plan_runs.component import plan_run
from mtlflow.config.pipeline import DistributedTrainConfig
from mtlflow.ops.storage import CLUSTER_ROOT, StorageLayout
from mtlflow.pipelines import cluster
from mtlflow.pipelines.benchmark_sweep import PARALLELISM, status_handler, versioned_data

#: the pipeline's parameters: DistributedTrainConfig's fields, with its defaults
DEFAULTS = DistributedTrainConfig.defaults()


def build_distributed_train(parallelism: int = PARALLELISM, storage_root: str = CLUSTER_ROOT):
    """``parallelism`` is unused (one job) and accepted for the common factory signature."""
    layout = StorageLayout(storage_root)

    @dsl.pipeline(name="mtlflow-distributed-train", description="Train one method with torchrun on several "
                  "GPUs as a TrainJob (or PyTorchJob) and evaluate it.")
    def distributed_train(
        benchmark: str = DEFAULTS["benchmark"],
        data_options: dict = DEFAULTS["data_options"],
        spec: str = DEFAULTS["spec"],
        spec_rev: str = DEFAULTS["spec_rev"],
        data_version: str = DEFAULTS["data_version"],
        dvc_remote: str = DEFAULTS["dvc_remote"],
        method: str = DEFAULTS["method"],
        seed: int = DEFAULTS["seed"],
        hparams: dict = DEFAULTS["hparams"],
        epochs: int = DEFAULTS["epochs"],
        train_options: dict = DEFAULTS["train_options"],
        job_kind: str = DEFAULTS["job_kind"],
        num_nodes: int = DEFAULTS["num_nodes"],
        gpus_per_node: int = DEFAULTS["gpus_per_node"],
        pushgateway: str = DEFAULTS["pushgateway"],
    ):
        with dsl.ExitHandler(status_handler("distributed_train", layout, pushgateway), name="distributed-train"):
            prep = versioned_data(layout, benchmark, data_options, spec, spec_rev, data_version, dvc_remote)
            spec = cluster.light(plan_run(method=method, seed=seed, hparams=hparams))
            profile = cluster.active_profile()
            job = launch_trainjob(data=prep.outputs["data"], run_spec=spec.output, epochs=epochs,
                                  train_options=train_options, storage_root=layout.root, kind=job_kind,
                                  num_nodes=num_nodes, gpus_per_node=gpus_per_node, image=IMAGE,
                                  run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, pushgateway=pushgateway,
                                  pipeline_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                                  timeout_seconds=profile.trainjob.deadline_seconds,
                                  profile=profile.model_dump(mode="json", exclude_none=True))
            job.set_display_name("launch multi-GPU training job")
            cluster.job_launcher(job, layout)
            cluster.light(evaluate(data=prep.outputs["data"], run=job.outputs["run"], split="test"))

    return distributed_train
