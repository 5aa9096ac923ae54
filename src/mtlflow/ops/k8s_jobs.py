"""Multi-GPU training jobs: Kubeflow Trainer ``TrainJob`` and training-operator v1 ``PyTorchJob``
manifests, and their submission (used by the ``launch_trainjob`` component).

Both run the project image with ``torchrun -m mtlflow train ...``. torchrun reads its topology from
the ``PET_*`` environment variables both operators set (``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``PET_MASTER_PORT``), so one command serves both kinds.

* ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) refers to the namespaced ``TrainingRuntime``
  ``mtlflow-torch-distributed`` from ``k8s/base``, which carries the PVC volumes, the GPU node
  selector and the tolerations, so the job itself uses only the stable ``trainer`` fields.
* ``PyTorchJob`` (``kubeflow.org/v1``) for clusters with only training-operator v1 carries them itself.

The manifests are plain dicts (no API server is needed to build or test them); :func:`submit_and_wait`
takes any object with the ``CustomObjectsApi`` methods ``create_namespaced_custom_object`` and
``get_namespaced_custom_object``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from mtlflow.config.pipeline import JOB_KINDS
from mtlflow.config.run import train_arguments
from mtlflow.core.errors import InvalidParameterError, MtlflowError

API = {"TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
       "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs")}
TRAINING_RUNTIME = "mtlflow-torch-distributed"
PART_OF = {"app.kubernetes.io/part-of": "mtlflow"}
GPU = "nvidia.com/gpu"
#: node selector and toleration of GPU nodes (NVIDIA GPU feature discovery / GPU operator defaults)
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
GPU_TOLERATIONS = ({"key": GPU, "operator": "Exists", "effect": "NoSchedule"},)

class JobFailedError(MtlflowError):
    """A distributed training job failed or did not finish in time."""


@dataclass(frozen=True)
class Volume:
    """A PVC mounted into the training containers."""

    claim: str
    mount_path: str


@dataclass(frozen=True)
class DistributedTraining:
    """What a multi-GPU training job needs; both manifest builders read it."""

    name: str
    namespace: str
    image: str
    command: list[str]
    num_nodes: int = 1
    gpus_per_node: int = 1
    cpu: str = "8"
    memory: str = "32Gi"
    volumes: tuple[Volume, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
            raise InvalidParameterError(f"job name {self.name!r} is not an RFC 1035 label (lower-case, <= 63 chars)")
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise InvalidParameterError(f"num_nodes and gpus_per_node must be >= 1, got {self.num_nodes}, "
                                        f"{self.gpus_per_node}")
        if not self.namespace:
            raise InvalidParameterError("a training job needs a namespace")


def job_name(run_key: str, prefix: str = "mtlflow") -> str:
    """An RFC 1035 label (<= 63 chars) from a run key, keeping its hash suffix."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{run_key}".lower()).strip("-")
    if len(cleaned) > 63:
        head, _, digest = cleaned.rpartition("-")
        cleaned = f"{head[:62 - len(digest)].rstrip('-')}-{digest}"
    return cleaned


def train_command(data_dir: str, run_dir: str, run_spec: str, epochs: int,
                  train_options: Mapping[str, Any]) -> list[str]:
    """``torchrun -m mtlflow train ...`` for one run spec; always ``--resume`` so a restarted job continues."""
    spec = json.loads(run_spec)
    command = ["torchrun", "-m", "mtlflow", "train", "--data", data_dir, "--out", run_dir, "--resume", "--no-progress"]
    return command + train_arguments({"method": spec["method"], "seed": int(spec["seed"]), "epochs": int(epochs),
                                      "hparams": spec.get("hparams") or None, "tasks": spec.get("tasks") or None,
                                      **train_options})


def _resources(job: DistributedTraining) -> dict[str, Any]:
    return {"requests": {"cpu": job.cpu, "memory": job.memory, GPU: str(job.gpus_per_node)},
            "limits": {"memory": job.memory, GPU: str(job.gpus_per_node)}}


def _env(job: DistributedTraining) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in sorted(job.env.items())]


def trainjob_manifest(job: DistributedTraining, runtime: str = TRAINING_RUNTIME,
                      runtime_kind: str = "TrainingRuntime") -> dict[str, Any]:
    """A Kubeflow Trainer ``TrainJob`` running ``job.command`` on ``job.num_nodes`` GPU nodes."""
    job.validate()
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": dict(PART_OF)},
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": runtime_kind},
            "trainer": {"image": job.image, "command": list(job.command), "env": _env(job),
                        "numNodes": job.num_nodes, "numProcPerNode": job.gpus_per_node,
                        "resourcesPerNode": _resources(job)},
        },
    }


def pytorchjob_manifest(job: DistributedTraining, node_selector: Mapping[str, str] = GPU_NODE_SELECTOR,
                        tolerations: Sequence[Mapping[str, Any]] = GPU_TOLERATIONS,
                        backoff_limit: int = 3) -> dict[str, Any]:
    """A training-operator v1 ``PyTorchJob``: one Master and ``num_nodes - 1`` Workers."""
    job.validate()

    def replica(replicas: int) -> dict[str, Any]:
        volumes = [{"name": f"vol-{i}", "persistentVolumeClaim": {"claimName": v.claim}}
                   for i, v in enumerate(job.volumes)]
        mounts = [{"name": f"vol-{i}", "mountPath": v.mount_path} for i, v in enumerate(job.volumes)]
        # NCCL needs more shared memory than the container default of 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        return {"replicas": replicas, "restartPolicy": "OnFailure", "template": {
            "metadata": {"labels": dict(PART_OF)},
            "spec": {"containers": [{"name": "pytorch", "image": job.image, "command": list(job.command),
                                     "env": _env(job), "resources": _resources(job), "volumeMounts": mounts}],
                     "volumes": volumes, "nodeSelector": dict(node_selector),
                     "tolerations": [dict(t) for t in tolerations]}}}

    specs = {"Master": replica(1)}
    if job.num_nodes > 1:
        specs["Worker"] = replica(job.num_nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": dict(PART_OF)},
        "spec": {"nprocPerNode": str(job.gpus_per_node),
                 "runPolicy": {"backoffLimit": backoff_limit, "cleanPodPolicy": "None"},
                 "pytorchReplicaSpecs": specs},
    }


def build_manifest(kind: str, job: DistributedTraining) -> dict[str, Any]:
    if kind == "TrainJob":
        return trainjob_manifest(job)
    if kind == "PyTorchJob":
        return pytorchjob_manifest(job)
    raise InvalidParameterError(f"unknown job kind {kind!r}; valid: {', '.join(JOB_KINDS)}")


def job_state(manifest_or_object: Mapping[str, Any]) -> str:
    """``succeeded``, ``failed`` or ``running`` from a job's status conditions (either kind)."""
    conditions = (manifest_or_object.get("status") or {}).get("conditions") or []
    active = {c.get("type") for c in conditions if str(c.get("status")) == "True"}
    if active & {"Failed"}:
        return "failed"
    if active & {"Complete", "Succeeded"}:
        return "succeeded"
    return "running"


def _failure_message(obj: Mapping[str, Any]) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed":
            return f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return "no failure message"


def submit_and_wait(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 24 * 3600,
                    poll_seconds: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Create the job (an existing one of the same name is reused: a retried launcher task re-attaches
    to its job) and wait until it succeeds; raises :class:`JobFailedError` on failure or timeout."""
    group, version, plural = API[manifest["kind"]]
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    try:
        api.create_namespaced_custom_object(group, version, namespace, plural, dict(manifest))
    except Exception as exc:  # kubernetes.client.ApiException without importing kubernetes here
        if getattr(exc, "status", None) != 409:
            raise JobFailedError(f"could not create {manifest['kind']} {namespace}/{name}: {exc}; check the "
                                 "RBAC of the pipeline runner (k8s/base/rbac.yaml) and the CRD") from None
    deadline = clock() + timeout_seconds
    while True:
        obj = api.get_namespaced_custom_object(group, version, namespace, plural, name)
        state = job_state(obj)
        if state == "succeeded":
            return obj
        if state == "failed":
            raise JobFailedError(f"{manifest['kind']} {namespace}/{name} failed ({_failure_message(obj)}); "
                                 "its checkpoints stay on the PVC and a retry resumes from them")
        if clock() >= deadline:
            raise JobFailedError(f"{manifest['kind']} {namespace}/{name} did not finish within "
                                 f"{timeout_seconds:.0f} s; it keeps running -- retry the task to re-attach")
        sleep(poll_seconds)


def current_namespace(default: str = "default") -> str:
    """The namespace of the pod this runs in (service-account mount), else ``default``."""
    from pathlib import Path

    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return path.read_text().strip() if path.is_file() else default


def custom_objects_api() -> Any:
    """An in-cluster ``CustomObjectsApi`` (falls back to the local kube config)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CustomObjectsApi()
