"""Cluster settings of pipeline tasks: GPUs, CPU/memory, retries, PVC mounts, Secrets, scheduling,
the pods' user and image pull Secrets.

Everything here compiles into the IR (``resources`` and ``platforms.kubernetes``) and is ignored by
kfp.local, so the same pipeline definition runs on this machine and on the cluster. The PVC and
Secret names match ``k8s/base``. What differs between clusters (node labels and taints, the
accelerator, CPU/memory per task class, UID/GID, pull Secrets) comes from the cluster profile
(:mod:`mtlflow.config.cluster`) active while the pipeline is built: :func:`profile_applied`.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

from kfp import dsl, kubernetes

from mtlflow.config.cluster import ClusterProfile
from mtlflow.ops.storage import StorageLayout

#: Secret with the DVC remote URL and S3/MinIO credentials (template: k8s/base/secret-dvc-remote.template.yaml)
DVC_SECRET = "mtlflow-dvc-remote"
DVC_SECRET_ENV = {"url": "MTLFLOW_DVC_REMOTE", "access_key_id": "AWS_ACCESS_KEY_ID",
                  "secret_access_key": "AWS_SECRET_ACCESS_KEY", "endpoint_url": "AWS_ENDPOINT_URL"}

#: a preempted or failed training pod is retried and resumes from its checkpoint on the PVC
TRAIN_RETRIES = {"num_retries": 3, "backoff_duration": "60s", "backoff_factor": 2.0, "backoff_max_duration": "3600s"}
TRAIN_TIMEOUT_SECONDS = 24 * 3600

# The pipeline decorator runs the pipeline body when the factory is called, so the profile is read
# while the tasks are declared; a context variable keeps the factories' signature (parallelism,
# storage_root) the same for every pipeline.
_PROFILE: ContextVar[ClusterProfile] = ContextVar("cluster_profile", default=ClusterProfile())


@contextlib.contextmanager
def profile_applied(profile: ClusterProfile | None) -> Iterator[ClusterProfile]:
    """Pipelines built inside this block get ``profile``'s settings (``None``: the default profile)."""
    token = _PROFILE.set(profile or ClusterProfile())
    try:
        yield _PROFILE.get()
    finally:
        _PROFILE.reset(token)


def active_profile() -> ClusterProfile:
    return _PROFILE.get()


def _pod_settings(task: dsl.PipelineTask, task_class: str) -> dsl.PipelineTask:
    """CPU/memory of the task class, non-root (with the profile's UID/GID when it sets them) and image pull
    Secrets. kfp-kubernetes 2.17 cannot set a pod's fsGroup, seccomp profile or capabilities: the volumes'
    group comes from the runtime's fsGroup (TrainJobs) or the volume itself (docs/guides/kubeflow.md,
    "Volumes and the image's user"). A profile for a KFP backend before 2.16 (``kfp_backend``) gets no
    securityContext at all: those drivers reject the field."""
    profile = active_profile()
    spec = profile.resources[task_class]
    task.set_cpu_request(spec.cpu_request).set_cpu_limit(spec.cpu_limit)
    task.set_memory_request(spec.memory_request).set_memory_limit(spec.memory_limit)
    if profile.task_security_context():
        kubernetes.set_security_context(task, run_as_user=profile.security.run_as_user,
                                        run_as_group=profile.security.run_as_group, run_as_non_root=True)
    if profile.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(profile.image_pull_secrets))
    return task


def loop_parallelism(parallelism: int, loops: int) -> int:
    """Concurrent training tasks per loop when ``loops`` loops train at once: at most ``parallelism``, and no
    more than the profile's GPU quota admits, so that no task waits for (or is refused by) the quota."""
    profile = active_profile()
    if profile.gpu_quota is None:
        return parallelism
    return max(1, min(parallelism, profile.gpu_quota // (profile.accelerator.count * loops)))


def mount(task: dsl.PipelineTask, layout: StorageLayout, *claims: str) -> dsl.PipelineTask:
    for claim in claims:
        kubernetes.mount_pvc(task, pvc_name=claim, mount_path=layout.mount(claim))
    return task


def light(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Bookkeeping steps: small CPU/memory requests."""
    return _pod_settings(task, "light")


def data_access(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """Preparing/versioning data: the data PVC (DVC cache, local remote) and the DVC remote Secret as
    environment variables (optional: without the Secret the PVC remote is used)."""
    kubernetes.use_secret_as_env(task, secret_name=DVC_SECRET, secret_key_to_env=DVC_SECRET_ENV, optional=True)
    return mount(light(task), layout, "mtlflow-data")


def gpu_node(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Schedule on the profile's GPU nodes: node selector, taint tolerations, shared memory for data loaders."""
    profile = active_profile()
    for key, value in profile.node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for toleration in profile.tolerations:
        kubernetes.add_toleration(task, **toleration.manifest())
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


def gpu_training(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """One training run: the profile's accelerator, CPU/memory, retries with back-off, a timeout and
    the checkpoints PVC (the run directory the task resumes from)."""
    accelerator = active_profile().accelerator
    task.set_accelerator_type(accelerator.type).set_accelerator_limit(accelerator.count)
    _pod_settings(task, "train").set_retry(**TRAIN_RETRIES)
    kubernetes.set_timeout(task, seconds=TRAIN_TIMEOUT_SECONDS)
    return mount(gpu_node(task), layout, "mtlflow-checkpoints")


def cpu_training(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """A training task without an accelerator (a claim reproduced on ``cpu``): the profile's train CPU/memory,
    retries with back-off, a timeout and the checkpoints PVC it resumes from."""
    _pod_settings(task, "train").set_retry(**TRAIN_RETRIES)
    kubernetes.set_timeout(task, seconds=TRAIN_TIMEOUT_SECONDS)
    return mount(task, layout, "mtlflow-checkpoints")


#: what a launcher may take beyond its TrainJob's deadline (staging the data, copying the run directory)
LAUNCHER_GRACE_SECONDS = 1800


def job_launcher(task: dsl.PipelineTask, layout: StorageLayout) -> dsl.PipelineTask:
    """A task that submits a TrainJob and waits: small, retried, both PVCs (staging and results), and a
    timeout of the profile's TrainJob deadline plus a grace period, so the launcher never outlives its job."""
    light(task).set_retry(**TRAIN_RETRIES)
    kubernetes.set_timeout(task, seconds=active_profile().trainjob.deadline_seconds + LAUNCHER_GRACE_SECONDS)
    return mount(task, layout, "mtlflow-data", "mtlflow-checkpoints")


def uncached(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Steps with side effects outside their artifacts (status records, model promotion)."""
    return task.set_caching_options(False)
