"""Multi-GPU training jobs: Kubeflow Trainer ``TrainJob`` and training-operator v1 ``PyTorchJob``
manifests, and their lifecycle (used by the ``launch_trainjob`` component).

Both run the project image with ``torchrun -m mtlflow train ...``. torchrun reads its topology from
the ``PET_*`` environment variables both operators set (``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``PET_MASTER_PORT``), so one command serves both kinds.

* ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, Trainer >= v2.3.0) refers to the namespaced
  ``TrainingRuntime`` ``mtlflow-torch-distributed`` from ``k8s/base`` (PVC volumes, the JobSet failure
  policy); the cluster profile's node selector, tolerations, pod security context and pull Secrets
  reach its pods through ``spec.runtimePatches``.
* ``PyTorchJob`` (``kubeflow.org/v1``) for clusters with only training-operator v1 carries them itself.

Lifecycle (:func:`run_job`, :func:`delete_job`): a job whose inputs (the digest of its spec) match and
that has not failed is re-attached by a retried launcher; a failed one, or one of other inputs, is
deleted and created anew; a failed job is deleted after its failure is read, a finished one after the
launcher collected its run directory, so finished jobs never hold the namespace's TrainJob quota.
The manifests are plain dicts (no API server is needed to build them); the API is any object with the
``CustomObjectsApi`` methods ``create_``, ``get_`` and ``delete_namespaced_custom_object``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from mtlflow.config.cluster import ClusterProfile
from mtlflow.config.pipeline import JOB_KINDS
from mtlflow.config.run import train_arguments
from mtlflow.core.errors import InvalidParameterError, MtlflowError

API = {"TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
       "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs")}
TRAINING_RUNTIME = "mtlflow-torch-distributed"
#: the runtime's replicated job (and container) that runs the trainer; the runtime patches target it
TRAINER_NODE = "node"
PART_OF = {"app.kubernetes.io/part-of": "mtlflow"}
#: annotation holding the digest of a job's spec: a retry re-attaches only to a job of the same inputs
SPEC_DIGEST = "mtlflow/spec-digest"
PATCH_MANAGER = "mtlflow/launch-trainjob"


class JobFailedError(MtlflowError):
    """A distributed training job failed or did not finish in time."""


@dataclass(frozen=True)
class Volume:
    """A PVC mounted into the training containers."""

    claim: str
    mount_path: str


@dataclass(frozen=True)
class DistributedTraining:
    """What a multi-GPU training job needs; both manifest builders read it. CPU and memory per node
    are the profile's per-GPU amounts times ``gpus_per_node``."""

    name: str
    namespace: str
    image: str
    command: list[str]
    num_nodes: int = 1
    gpus_per_node: int = 1
    volumes: tuple[Volume, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    profile: ClusterProfile = field(default_factory=ClusterProfile)
    timeout_seconds: int = 24 * 3600

    def validate(self) -> None:
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
            raise InvalidParameterError(f"job name {self.name!r} is not an RFC 1035 label (lower-case, <= 63 chars)")
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise InvalidParameterError(f"num_nodes and gpus_per_node must be >= 1, got {self.num_nodes}, "
                                        f"{self.gpus_per_node}")
        if not self.namespace:
            raise InvalidParameterError("a training job needs a namespace")
        if self.timeout_seconds < 1:
            raise InvalidParameterError(f"timeout_seconds must be >= 1, got {self.timeout_seconds}")


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
    accelerator, node = job.profile.accelerator.type, job.profile.trainjob
    cpu, memory, gpus = node.cpu(job.gpus_per_node), node.memory(job.gpus_per_node), str(job.gpus_per_node)
    return {"requests": {"cpu": cpu, "memory": memory, accelerator: gpus},
            "limits": {"memory": memory, accelerator: gpus}}


def _env(job: DistributedTraining) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in sorted(job.env.items())]


def _pod_scheduling(profile: ClusterProfile) -> dict[str, Any]:
    """The profile's part of a training pod's spec: GPU nodes, the image's user and the volumes' group
    (``OnRootMismatch``: a large volume is not re-chowned at every start), pull Secrets."""
    security = profile.security
    pod: dict[str, Any] = {
        "nodeSelector": dict(profile.node_selector), "tolerations": profile.tolerations_manifest(),
        "securityContext": {"runAsUser": security.run_as_user, "runAsGroup": security.run_as_group,
                            "runAsNonRoot": True, "fsGroup": security.fs_group,
                            "fsGroupChangePolicy": "OnRootMismatch"}}
    if profile.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in profile.image_pull_secrets]
    return pod


def _with_digest(manifest: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(manifest["spec"], sort_keys=True).encode()).hexdigest()[:16]
    manifest["metadata"]["annotations"] = {SPEC_DIGEST: digest}
    return manifest


def trainjob_manifest(job: DistributedTraining, runtime: str = TRAINING_RUNTIME,
                      runtime_kind: str = "TrainingRuntime") -> dict[str, Any]:
    """A Kubeflow Trainer ``TrainJob`` running ``job.command`` on ``job.num_nodes`` GPU nodes; the
    controller fails it after ``job.timeout_seconds`` (``activeDeadlineSeconds``)."""
    job.validate()
    pod_patch = {"template": {"spec": {"template": {"spec": _pod_scheduling(job.profile)}}}}
    return _with_digest({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": dict(PART_OF)},
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": runtime_kind},
            "activeDeadlineSeconds": job.timeout_seconds,
            "trainer": {"image": job.image, "command": list(job.command), "env": _env(job),
                        "numNodes": job.num_nodes, "numProcPerNode": job.gpus_per_node,
                        "resourcesPerNode": _resources(job)},
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": [{"name": TRAINER_NODE, **pod_patch}]}}}}],
        },
    })


def pytorchjob_manifest(job: DistributedTraining, backoff_limit: int = 3) -> dict[str, Any]:
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
                     "volumes": volumes, **_pod_scheduling(job.profile)}}}

    specs = {"Master": replica(1)}
    if job.num_nodes > 1:
        specs["Worker"] = replica(job.num_nodes - 1)
    return _with_digest({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": dict(PART_OF)},
        "spec": {"nprocPerNode": str(job.gpus_per_node),
                 "runPolicy": {"backoffLimit": backoff_limit, "cleanPodPolicy": "None",
                               "activeDeadlineSeconds": job.timeout_seconds},
                 "pytorchReplicaSpecs": specs},
    })


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


def _api_error(exc: Exception) -> str:
    """One line from a ``kubernetes.client.ApiException`` (its str holds HTTP headers and the body)."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body)["message"] if body else ""
    except (ValueError, KeyError, TypeError):
        message = ""
    status = getattr(exc, "status", None)
    if status is None:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"HTTP {status} {getattr(exc, 'reason', '') or ''}: {message}".strip(": ")


def _ref(manifest: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    group, version, plural = API[manifest["kind"]]
    return group, version, manifest["metadata"]["namespace"], plural, manifest["metadata"]["name"]


def _get(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return api.get_namespaced_custom_object(*_ref(manifest))
    except Exception as exc:  # kubernetes.client.ApiException without importing kubernetes here
        if getattr(exc, "status", None) == 404:
            return None
        raise JobFailedError(f"could not read {manifest['kind']} {_ref(manifest)[2]}/{_ref(manifest)[4]}: "
                             f"{_api_error(exc)}") from None


def delete_job(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 300.0, poll_seconds: float = 2.0,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Delete the job (its JobSet and pods go with it) and wait until it is gone; a missing job is fine."""
    kind, (_, _, namespace, _, name) = manifest["kind"], _ref(manifest)
    try:
        api.delete_namespaced_custom_object(*_ref(manifest), propagation_policy="Background")
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            raise JobFailedError(f"could not delete {kind} {namespace}/{name}: {_api_error(exc)}; it holds the "
                                 "namespace's TrainJob quota until deleted (kubectl delete it)") from None
    deadline = clock() + timeout_seconds
    while _get(api, manifest) is not None:
        if clock() >= deadline:
            raise JobFailedError(f"{kind} {namespace}/{name} was still there {timeout_seconds:.0f} s after its "
                                 "deletion; check its finalizers")
        sleep(poll_seconds)


def run_job(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 24 * 3600, poll_seconds: float = 30.0,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Create the job and wait until it succeeds; returns the finished object, which the caller
    deletes (:func:`delete_job`) once it has collected the result.

    An existing job of the same name is re-attached only when its spec digest matches and it has not
    failed (a retried launcher); otherwise it is deleted and created anew. A failed job is deleted
    after its failure is read (its checkpoints stay on the PVC: the next try resumes from them) and
    :class:`JobFailedError` raised; on timeout the job keeps running (a retry re-attaches) until its
    ``activeDeadlineSeconds``."""
    kind, (_, _, namespace, _, name) = manifest["kind"], _ref(manifest)
    digest = manifest["metadata"]["annotations"][SPEC_DIGEST]
    existing = _get(api, manifest)
    if existing is not None:
        same_inputs = ((existing.get("metadata") or {}).get("annotations") or {}).get(SPEC_DIGEST) == digest
        if same_inputs and job_state(existing) != "failed":
            log(f"re-attaching to {kind} {namespace}/{name} ({job_state(existing)})")
        else:
            log(f"deleting {kind} {namespace}/{name} ({'failed' if same_inputs else 'other inputs'}) to create it anew")
            delete_job(manifest, api, sleep=sleep, clock=clock)
            existing = None
    if existing is None:
        try:
            group, version, _, plural, _ = _ref(manifest)
            api.create_namespaced_custom_object(group, version, namespace, plural, dict(manifest))
        except Exception as exc:
            raise JobFailedError(f"could not create {kind} {namespace}/{name}: {_api_error(exc)}; check the "
                                 "pipeline pods' RBAC (k8s/base/rbac.yaml), the CRD and the namespace's quota") \
                from None
    deadline = clock() + timeout_seconds
    while True:
        obj = _get(api, manifest)
        if obj is None:
            raise JobFailedError(f"{kind} {namespace}/{name} was deleted while the launcher waited for it")
        state = job_state(obj)
        if state == "succeeded":
            return obj
        if state == "failed":
            message = _failure_message(obj)
            delete_job(manifest, api, sleep=sleep, clock=clock)
            raise JobFailedError(f"{kind} {namespace}/{name} failed ({message}); it was deleted, its checkpoints "
                                 "stay on the PVC and a retry resumes from them")
        if clock() >= deadline:
            raise JobFailedError(f"{kind} {namespace}/{name} did not finish within {timeout_seconds:.0f} s; it "
                                 "keeps running -- retry the task to re-attach")
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
