"""Cluster settings of pipeline tasks: GPUs, CPU/memory, retries, PVC mounts, Secrets, scheduling.

Everything here compiles into the IR (``resources`` and ``platforms.kubernetes``) and is ignored by
kfp.local, so the same pipeline definition runs on this machine and on the cluster. The PVC and
Secret names match ``k8s/base``.
"""

from kfp import dsl, kubernetes

from mtlflow.ops.k8s_jobs import GPU, GPU_NODE_SELECTOR, GPU_TOLERATIONS
from mtlflow.ops.storage import StorageLayout

#: Secret with the DVC remote URL and S3/MinIO credentials (template: k8s/base/secret-dvc-remote.template.yaml)
DVC_SECRET = "mtlflow-dvc-remote"
DVC_SECRET_ENV = {"url": "MTLFLOW_DVC_REMOTE", "access_key_id": "AWS_ACCESS_KEY_ID",
                  "secret_access_key": "AWS_SECRET_ACCESS_KEY", "endpoint_url": "AWS_ENDPOINT_URL"}

TRAIN_RESOURCES = {"cpu_request": "4", "cpu_limit": "8", "memory_request": "16G", "memory_limit": "32G"}
LIGHT_RESOURCES = {"cpu_request": "1", "cpu_limit": "2", "memory_request": "2G", "memory_limit": "8G"}
#: a preempted or failed training pod is retried and resumes from its checkpoint on the PVC
TRAIN_RETRIES = {"num_retries": 3, "backoff_duration": "60s", "backoff_factor": 2.0, "backoff_max_duration": "3600s"}
TRAIN_TIMEOUT_SECONDS = 24 * 3600


def _resources(task: dsl.PipelineTask, spec: dict) -> dsl.PipelineTask:
    return (task.set_cpu_request(spec["cpu_request"]).set_cpu_limit(spec["cpu_limit"])
            .set_memory_request(spec["memory_request"]).set_memory_limit(spec["memory_limit"]))


def mount(task: dsl.PipelineTask, layout: StorageLayout, *claims: str) -> dsl.PipelineTask:
    for claim in claims:
        kubernetes.mount_pvc(task, pvc_name=claim, mount_path=layout.mount(claim))
    return task


def light(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Bookkeeping steps: small CPU/memory requests."""
    return _resources(task, LIGHT_RESOURCES)


def data_access(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """Preparing/versioning data: the data PVC (DVC cache, local remote) and the DVC remote Secret as
    environment variables (optional: without the Secret the PVC remote is used)."""
    kubernetes.use_secret_as_env(task, secret_name=DVC_SECRET, secret_key_to_env=DVC_SECRET_ENV, optional=True)
    return mount(_resources(task, LIGHT_RESOURCES), layout, "mtlflow-data")


def gpu_node(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Schedule on a GPU node: node selector, GPU taint toleration, shared memory for data loaders."""
    for key, value in GPU_NODE_SELECTOR.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for tol in GPU_TOLERATIONS:
        kubernetes.add_toleration(task, key=tol["key"], operator=tol["operator"], effect=tol["effect"])
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


def gpu_training(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """One training run: one GPU, CPU/memory requests, retries with back-off, a timeout and the
    checkpoints PVC (the run directory the task resumes from)."""
    task.set_accelerator_type(GPU).set_accelerator_limit(1)
    _resources(task, TRAIN_RESOURCES).set_retry(**TRAIN_RETRIES)
    kubernetes.set_timeout(task, seconds=TRAIN_TIMEOUT_SECONDS)
    return mount(gpu_node(task), layout, "mtlflow-checkpoints")


def job_launcher(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """A task that submits a TrainJob and waits: small, retried, both PVCs (staging and results)."""
    light(task).set_retry(**TRAIN_RETRIES)
    return mount(task, layout, "mtlflow-data", "mtlflow-checkpoints")


def uncached(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Steps with side effects outside their artifacts (status records, model promotion)."""
    return task.set_caching_options(False)
