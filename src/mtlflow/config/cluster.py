"""The cluster profile: what differs between the Kubernetes clusters a pipeline is compiled for.

GPU node selection (labels and taints), the accelerator, CPU/memory per task class, the pods' user and
fsGroup, image pull Secrets, the namespace and the pipeline pods' ServiceAccount. One YAML file per
environment (``k8s/overlays/<env>/profile.yaml``), read by ``mtlflow pipeline compile --profile FILE``;
the pipelines apply it to every task at compile time (:mod:`mtlflow.pipelines.cluster`) and the
``launch_trainjob`` component to the TrainJobs it creates (:mod:`mtlflow.ops.k8s_jobs`).

Without a profile the defaults below apply: NVIDIA GPU Operator labels and taint, the platform's UID (the
image's user 1000 on plain Kubernetes), no fsGroup, no pull Secret.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError

#: Kubernetes CPU quantities (cores or millicores) and binary memory quantities
_CPU = re.compile(r"^(\d+(\.\d{1,3})?|\d+m)$")
_MEMORY = re.compile(r"^\d+(Ki|Mi|Gi|Ti|K|M|G|T)$")
#: what a TrainJob node's memory is multiplied from: a whole number of a binary unit
_MEMORY_PER_GPU = re.compile(r"^(\d+)(Mi|Gi)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Toleration(_Strict):
    """A pod toleration (``Exists`` tolerates every value of ``key``)."""

    key: str
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class TaskResources(_Strict):
    """CPU and memory of one class of pipeline task (Kubernetes quantities)."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str

    @field_validator("cpu_request", "cpu_limit")
    @classmethod
    def _cpu(cls, value: str) -> str:
        if not _CPU.match(value):
            raise ValueError(f"{value!r} is not a CPU quantity; write cores (\"4\", \"0.5\") or millicores (\"500m\")")
        return value

    @field_validator("memory_request", "memory_limit")
    @classmethod
    def _memory(cls, value: str) -> str:
        if not _MEMORY.match(value):
            raise ValueError(f"{value!r} is not a memory quantity; write e.g. \"16Gi\" or \"512Mi\"")
        return value


class Accelerator(_Strict):
    """The accelerator resource a training task and each TrainJob process uses."""

    type: str = "nvidia.com/gpu"
    count: int = Field(1, ge=1, description="accelerators of one training task of the sweep")


class TrainJobNode(_Strict):
    """A TrainJob node's CPU and memory per GPU (a node gets them times its GPU count), how long a TrainJob
    may run, and whether Istio injects its sidecar into the TrainJob pods."""

    cpu_per_gpu: float = Field(8.0, gt=0)
    memory_per_gpu: str = "32Gi"
    deadline_seconds: int = Field(24 * 3600, ge=60, description="activeDeadlineSeconds of a TrainJob: the most "
                                  "a cancelled run's job can keep its GPUs when nothing else deletes it")
    istio_sidecar: bool = Field(False, description="let Istio inject its sidecar into TrainJob pods; off, since "
                                "the sidecar breaks torchrun's rendezvous (the pods are then outside the mesh)")

    @field_validator("memory_per_gpu")
    @classmethod
    def _memory(cls, value: str) -> str:
        if not _MEMORY_PER_GPU.match(value):
            raise ValueError(f"{value!r} is not a whole number of Mi or Gi; write e.g. \"32Gi\"")
        return value

    def cpu(self, gpus: int) -> str:
        millicores = round(self.cpu_per_gpu * gpus * 1000)
        return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"

    def memory(self, gpus: int) -> str:
        amount, unit = _MEMORY_PER_GPU.match(self.memory_per_gpu).groups()  # type: ignore[union-attr]
        return f"{int(amount) * gpus}{unit}"


class PodSecurity(_Strict):
    """Who the pods run as. Every pod runs non-root whatever is set here; ``run_as_user``/``run_as_group``
    unset (the default) leave the user to the platform: the image's ``USER 1000:0`` on plain Kubernetes, a UID
    of the namespace's range on OpenShift (whose restricted-v2 SCC rejects a fixed UID outside it).
    ``fs_group`` makes mounted volumes group-writable where the volume driver applies fsGroup (block
    volumes); NFS/EFS/CephFS exports must grant that group themselves. Unset (the default), OpenShift's SCC
    picks it from the namespace's range, and plain Kubernetes applies none."""

    run_as_user: int | None = Field(None, ge=1)
    run_as_group: int | None = Field(None, ge=0)
    fs_group: int | None = Field(None, ge=0)


#: KFP backends before this release do not know a task's ``securityContext`` (the field came with
#: kubeflow/pipelines#12832, first released in 2.16.0); 2.14 and 2.15 reject it when the API server compiles the
#: run ("unknown field"), older ones drop it (docs/guides/kubeflow.md)
TASK_SECURITY_CONTEXT_SINCE = (2, 16)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(\.\d+)?([-+.].*)?$")


def version_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of a release name such as ``2.15.1`` or ``v2.16.0-rc.1``; None when it is not one."""
    match = _VERSION.match(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def supports_task_security_context(kfp_backend: str) -> bool:
    """Whether a KFP backend of this release accepts the tasks' ``securityContext``."""
    version = version_tuple(kfp_backend)
    return version is None or version >= TASK_SECURITY_CONTEXT_SINCE


def _default_resources() -> dict[str, TaskResources]:
    return {"light": TaskResources(cpu_request="1", cpu_limit="2", memory_request="2G", memory_limit="8G"),
            "train": TaskResources(cpu_request="4", cpu_limit="8", memory_request="16G", memory_limit="32G")}


class ClusterProfile(_Strict):
    """One cluster environment's scheduling, resources and identity settings."""

    name: str = "default"
    namespace: str = Field("", description="namespace of the pipeline pods and TrainJobs ('' = the pod's own)")
    service_account: str = Field("mtlflow-pipeline", description="ServiceAccount of the pipeline pods")
    node_selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: tuple[Toleration, ...] = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)
    accelerator: Accelerator = Accelerator()
    resources: dict[Literal["light", "train"], TaskResources] = Field(default_factory=_default_resources)
    trainjob: TrainJobNode = TrainJobNode()
    security: PodSecurity = PodSecurity()
    image_pull_secrets: tuple[str, ...] = ()
    gpu_quota: int | None = Field(None, ge=1, description="accelerators the namespace's ResourceQuota grants "
                                  "(requests.<accelerator>): caps the sweep's concurrent training tasks")
    kfp_backend: str = Field("", description="release of the cluster's KFP backend, e.g. '2.15.0' ('' = 2.16 or "
                             "later): before 2.16 the tasks are compiled without securityContext")

    @field_validator("kfp_backend")
    @classmethod
    def _release(cls, value: str) -> str:
        if value and version_tuple(value) is None:
            raise ValueError(f"{value!r} is not a KFP release; write e.g. \"2.15.0\"")
        return value

    def task_security_context(self) -> bool:
        """Whether the compiled tasks carry a securityContext (the backend accepts one)."""
        return supports_task_security_context(self.kfp_backend)

    @field_validator("resources")
    @classmethod
    def _every_class(cls, value: dict[str, TaskResources]) -> dict[str, TaskResources]:
        missing = sorted({"light", "train"} - set(value))
        if missing:
            raise ValueError(f"missing task class(es) {', '.join(missing)}; give light and train")
        return value

    def tolerations_manifest(self) -> list[dict[str, str]]:
        return [t.manifest() for t in self.tolerations]


def load_profile(path: str | Path) -> ClusterProfile:
    """The profile in a YAML file; any problem is one :class:`InvalidParameterError` naming the file
    and the key path."""
    data = atomic.read_yaml(path, "cluster profile")
    if not isinstance(data, dict):
        raise InvalidParameterError(f"cluster profile {path} must be a mapping of settings (name, node_selector, "
                                    "tolerations, ...)")
    try:
        return ClusterProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        extra = f" ({len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise InvalidParameterError(f"cluster profile {path}: {where}: {first['msg']}{extra}") from None
