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

Pods: non-root with ``seccompProfile: RuntimeDefault``, no privilege escalation and every capability dropped
(the restricted Pod Security Standard; the UID is the profile's or the platform's), and no Istio sidecar
unless the profile asks for one (it breaks torchrun's rendezvous).

Cancellation: the job is owned by the launcher's pod (an ``ownerReference``, when both are in one
namespace), so the garbage collector deletes it with that pod; the launcher deletes it itself when it is
terminated (SIGTERM: the run was cancelled or the task timed out, :func:`deleted_on_termination`); and
``activeDeadlineSeconds`` (the profile's ``trainjob.deadline_seconds``) bounds it when neither happens.

Lifecycle (:func:`run_job`, :func:`delete_job`): a job whose inputs (the digest of its spec) match and
that has not failed is re-attached by a retried launcher; a failed one, or one of other inputs, is
deleted and created anew; a failed job is deleted after its failure is read, a finished one after the
launcher collected its run directory, so finished jobs never hold the namespace's TrainJob quota.
The manifests are plain dicts (no API server is needed to build them); the API is any object with the
``CustomObjectsApi`` methods ``create_``, ``get_`` and ``delete_namespaced_custom_object``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
#: label of a job with the id of the pipeline run that launched it
RUN_ID_LABEL = "mtlflow/run-id"
#: Istio's switch for its sidecar, as a pod label (Istio >= 1.10 honours the label over the annotation)
ISTIO_INJECT = "sidecar.istio.io/inject"
#: the container part of the restricted Pod Security Standard
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


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
    #: the launcher pod as an ownerReference (:func:`launcher_owner`); None: the job has no owner
    owner: Mapping[str, Any] | None = None
    run_id: str = ""

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
                  train_options: Mapping[str, Any], pushgateway: str = "", pipeline_run: str = "") -> list[str]:
    """``torchrun -m mtlflow train ...`` for one run spec; always ``--resume`` so a restarted job continues.
    With ``pushgateway`` the run pushes its telemetry there (``mtlflow train`` exports from rank 0 only), grouped
    also by ``pipeline_run`` when given (the pipeline's exit handler deletes the group by it)."""
    spec = json.loads(run_spec)
    command = ["torchrun", "-m", "mtlflow", "train", "--data", data_dir, "--out", run_dir, "--resume", "--no-progress"]
    if pushgateway:
        command += ["--pushgateway", pushgateway]
        if pipeline_run:
            command += ["--pipeline-run", pipeline_run]
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


def pod_security_context(profile: ClusterProfile) -> dict[str, Any]:
    """A training pod's securityContext: non-root with the runtime's default seccomp profile, the profile's
    UID/GID when it sets them (else the platform's), and the volumes' group (``OnRootMismatch``: a large
    volume is not re-chowned at every start)."""
    security = profile.security
    context: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if security.run_as_user is not None:
        context["runAsUser"] = security.run_as_user
    if security.run_as_group is not None:
        context["runAsGroup"] = security.run_as_group
    if security.fs_group is not None:
        context.update(fsGroup=security.fs_group, fsGroupChangePolicy="OnRootMismatch")
    return context


def _pod_labels(job: DistributedTraining) -> dict[str, str]:
    return {**PART_OF, ISTIO_INJECT: "true" if job.profile.trainjob.istio_sidecar else "false"}


def _job_metadata(job: DistributedTraining) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": job.name, "namespace": job.namespace, "labels": dict(PART_OF)}
    if job.run_id:
        metadata["labels"][RUN_ID_LABEL] = re.sub(r"[^A-Za-z0-9_.-]", "-", job.run_id)[:63].strip("-_.")
    if job.owner:
        metadata["ownerReferences"] = [dict(job.owner)]
    return metadata


def _pod_scheduling(profile: ClusterProfile) -> dict[str, Any]:
    """The profile's part of a training pod's spec: GPU nodes, the security context, pull Secrets."""
    pod: dict[str, Any] = {
        "nodeSelector": dict(profile.node_selector), "tolerations": profile.tolerations_manifest(),
        "securityContext": pod_security_context(profile)}
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
    pod_spec = {**_pod_scheduling(job.profile),
                "containers": [{"name": TRAINER_NODE, "securityContext": dict(CONTAINER_SECURITY)}]}
    pod_patch = {"template": {"spec": {"template": {"metadata": {"labels": _pod_labels(job)}, "spec": pod_spec}}}}
    return _with_digest({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _job_metadata(job),
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
            "metadata": {"labels": _pod_labels(job)},
            "spec": {"containers": [{"name": "pytorch", "image": job.image, "command": list(job.command),
                                     "env": _env(job), "resources": _resources(job), "volumeMounts": mounts,
                                     "securityContext": dict(CONTAINER_SECURITY)}],
                     "volumes": volumes, **_pod_scheduling(job.profile)}}}

    specs = {"Master": replica(1)}
    if job.num_nodes > 1:
        specs["Worker"] = replica(job.num_nodes - 1)
    return _with_digest({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _job_metadata(job),
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


def delete_and_wait(api: Any, ref: Sequence[str], read: Callable[[], Any], what: str, error: type[Exception], *,
                    propagation: str, delete_hint: str, finalizer_hint: str, timeout_seconds: float,
                    poll_seconds: float, sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    """Delete the custom object at ``ref`` and wait until ``read()`` finds it gone (a missing object is fine);
    a refused deletion or one that does not finish in time raises ``error`` naming ``what`` and the hint."""
    try:
        api.delete_namespaced_custom_object(*ref, propagation_policy=propagation)
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            raise error(f"could not delete {what}: {_api_error(exc)}; {delete_hint}") from None
    deadline = clock() + timeout_seconds
    while read() is not None:
        if clock() >= deadline:
            raise error(f"{what} was still there {timeout_seconds:.0f} s after its deletion; {finalizer_hint}")
        sleep(poll_seconds)


def delete_job(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 300.0, poll_seconds: float = 2.0,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Delete the job (its JobSet and pods go with it) and wait until it is gone; a missing job is fine."""
    kind, (_, _, namespace, _, name) = manifest["kind"], _ref(manifest)
    delete_and_wait(api, _ref(manifest), lambda: _get(api, manifest), f"{kind} {namespace}/{name}", JobFailedError,
                    propagation="Background", finalizer_hint="check its finalizers",
                    delete_hint="it holds the namespace's TrainJob quota until deleted (kubectl delete it)",
                    timeout_seconds=timeout_seconds, poll_seconds=poll_seconds, sleep=sleep, clock=clock)


def run_job(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 24 * 3600, poll_seconds: float = 30.0,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Create the job and wait until it succeeds; returns the finished object, which the caller
    deletes (:func:`delete_job`) once it has collected the result.

    An existing job of the same name is re-attached only when its spec digest matches and it has not
    failed (a retried launcher); otherwise it is deleted and created anew. A create that the namespace's
    quota refuses is retried every ``poll_seconds`` within ``timeout_seconds``: a full quota is waited for,
    not failed on. A failed job is deleted after its failure is read (its checkpoints stay on the PVC:
    the next try resumes from them) and :class:`JobFailedError` raised; on timeout the job keeps running
    (a retry re-attaches) until its ``activeDeadlineSeconds``."""
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
    deadline = clock() + timeout_seconds
    if existing is None:
        _create_when_the_quota_admits(manifest, api, deadline, poll_seconds, sleep, clock, log)
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


def launcher_owner(core_api: Any, namespace: str, pod_name: str | None = None,
                   log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The launcher's own pod (``$HOSTNAME``, the pod's name) as an ownerReference for a job in
    ``namespace``, so that the garbage collector deletes the job with the pod; None, with one logged line,
    when the pod is in another namespace (an owner in another namespace counts as absent, and the collector
    would delete the job at once) or cannot be read. ``core_api``: a ``CoreV1Api``-like object."""
    pod_name = pod_name or os.environ.get("HOSTNAME", "")
    own_namespace = current_namespace(default="")
    if not pod_name or own_namespace != namespace:
        log(f"the job in {namespace!r} gets no owner: the launcher pod {pod_name!r} is in {own_namespace or 'no'} "
            "namespace; a cancelled run's job then stops at its deadline or at the launcher's termination")
        return None
    try:
        pod = core_api.read_namespaced_pod(pod_name, namespace)
    except Exception as exc:
        log(f"the job gets no owner: could not read the launcher pod {namespace}/{pod_name} ({_api_error(exc)})")
        return None
    # no blockOwnerDeletion: it needs the right to update the pod's finalizers, which the Role does not grant
    return {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}


@contextlib.contextmanager
def on_termination(cleanup: Callable[[], None]) -> Iterator[None]:
    """While the block runs: on SIGTERM (the run was cancelled, or the task timed out and the pod is stopped)
    run ``cleanup``, then exit with 143 as a terminated process."""

    def terminate(signum: int, frame: Any) -> None:
        cleanup()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def deleted_on_termination(manifest: Mapping[str, Any], api: Any,
                           log: Callable[[str], None] = print) -> contextlib.AbstractContextManager[None]:
    """While the launcher waits for its job: on SIGTERM delete the job, so its GPUs are freed, then exit 143."""
    kind, (_, _, namespace, _, name) = manifest["kind"], _ref(manifest)

    def delete() -> None:
        log(f"terminated: deleting {kind} {namespace}/{name}")
        try:
            delete_job(manifest, api, timeout_seconds=20.0, poll_seconds=1.0)
        except JobFailedError as exc:
            log(str(exc))

    return on_termination(delete)


def _over_quota(exc: Exception) -> bool:
    """A create refused because the namespace's ResourceQuota is used up (403 "exceeded quota")."""
    return getattr(exc, "status", None) == 403 and "exceeded quota" in _api_error(exc)


def _create_when_the_quota_admits(manifest: Mapping[str, Any], api: Any, deadline: float, poll_seconds: float,
                                  sleep: Callable[[float], None], clock: Callable[[], float],
                                  log: Callable[[str], None]) -> None:
    """Create the job; while the namespace's quota refuses it (other jobs hold it), wait and try again until
    ``deadline``, logging the wait once -- a full quota is a queue, not a failure."""
    kind, (group, version, namespace, plural, name) = manifest["kind"], _ref(manifest)
    waiting_since = None
    while True:
        try:
            api.create_namespaced_custom_object(group, version, namespace, plural, dict(manifest))
        except Exception as exc:
            if not _over_quota(exc):
                raise JobFailedError(f"could not create {kind} {namespace}/{name}: {_api_error(exc)}; check the "
                                     "pipeline pods' RBAC (k8s/base/rbac.yaml) and the CRD") from None
            if waiting_since is None:
                waiting_since = clock()
                log(f"waiting for quota: {kind} {namespace}/{name} is refused ({_api_error(exc)}); retrying every "
                    f"{poll_seconds:.0f} s until other jobs finish")
            if clock() >= deadline:
                raise JobFailedError(f"{kind} {namespace}/{name} waited {clock() - waiting_since:.0f} s for the "
                                     f"namespace's quota and was still refused ({_api_error(exc)}); lower the "
                                     "parallelism or raise the quota (k8s/overlays/<env>)") from None
            sleep(poll_seconds)
            continue
        if waiting_since is not None:
            log(f"quota admitted {kind} {namespace}/{name} after {clock() - waiting_since:.0f} s")
        return


def current_namespace(default: str = "default") -> str:
    """The namespace of the pod this runs in (service-account mount), else ``default``."""
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return path.read_text().strip() if path.is_file() else default


def _load_config() -> None:
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def custom_objects_api() -> Any:
    """An in-cluster ``CustomObjectsApi`` (falls back to the local kube config)."""
    from kubernetes import client

    _load_config()
    return client.CustomObjectsApi()


def core_api() -> Any:
    """An in-cluster ``CoreV1Api`` (falls back to the local kube config)."""
    from kubernetes import client

    _load_config()
    return client.CoreV1Api()
