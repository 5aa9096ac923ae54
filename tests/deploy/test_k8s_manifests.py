"""k8s/ manifests, validated offline: `kubectl kustomize` builds base and both overlays,
kubernetes-validate (--strict, k8s 1.32) checks every core object, and the CRDs (TrainingRuntime,
TrainJob, PyTorchJob -- no schema offline) are checked as dicts. Also the job manifests the
launch_trainjob component submits, and its wait loop against a fake API."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops import k8s_jobs
from mtlflow.ops.storage import VOLUMES, StorageLayout
from mtlflow.pipelines import cluster

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
K8S_VERSION = "1.32.0"
CRD_KINDS = {"TrainingRuntime", "TrainJob", "PyTorchJob"}


def kustomize(path: Path) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def builds():
    return {name: kustomize(K8S / path) for name, path in
            (("base", "base"), ("dev", "overlays/dev"), ("prod", "overlays/prod"))}


def by_kind(objs, kind):
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def test_core_objects_pass_strict_schema_validation(builds):
    import kubernetes_validate

    for name, objs in builds.items():
        kinds = {o["kind"] for o in objs}
        assert {"Namespace", "PersistentVolumeClaim", "Role", "RoleBinding", "ResourceQuota", "LimitRange",
                "TrainingRuntime"} <= kinds, name
        assert "Secret" not in kinds, "credentials must never be part of the kustomization"
        for obj in objs:
            if obj["kind"] not in CRD_KINDS:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_strict_validation_catches_mistakes():
    import kubernetes_validate

    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}},
                    "storageClass": "typo"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pvc, K8S_VERSION, strict=True)


def test_every_object_lands_in_the_overlay_namespace(builds):
    for name, namespace in (("dev", "mtlflow-dev"), ("prod", "mtlflow")):
        objs = builds[name]
        assert set(by_kind(objs, "Namespace")) == {namespace}
        assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {namespace}
        (binding,) = by_kind(objs, "RoleBinding").values()
        assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {
            ("default-editor", namespace), ("pipeline-runner", namespace)}
        assert all(o["metadata"]["labels"]["mtlflow/environment"] == name for o in objs)


def test_volumes_match_the_pipeline_mounts(builds):
    layout = StorageLayout()
    for objs in builds.values():
        pvcs = by_kind(objs, "PersistentVolumeClaim")
        assert set(pvcs) == set(VOLUMES)
        assert all(p["spec"]["accessModes"] == ["ReadWriteMany"] for p in pvcs.values())
        (runtime,) = by_kind(objs, "TrainingRuntime").values()
        pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {claims[n]: mounts[n] for n in claims} == {c: layout.mount(c) for c in ("mtlflow-data", "mtlflow-checkpoints")}
    assert all(p["spec"]["storageClassName"] == "shared-rwx"
                                         for p in by_kind(builds["prod"], "PersistentVolumeClaim").values())


def test_runner_may_manage_training_jobs(builds):
    (role,) = by_kind(builds["base"], "Role").values()
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for api in k8s_jobs.API.values():
        assert {"create", "get", "delete"} <= grants[(api[0], api[2])]
    assert all("secrets" not in r for (_, r) in grants), "the runner needs no access to Secrets"


def test_gpu_quota_and_scheduling_per_environment(builds):
    expected = {"dev": ("2", "NVIDIA-L4"), "prod": ("32", "NVIDIA-H100-80GB-HBM3")}
    for name, (gpus, product) in expected.items():
        (quota,) = by_kind(builds[name], "ResourceQuota").values()
        assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == gpus
        (runtime,) = by_kind(builds[name], "TrainingRuntime").values()
        assert runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        assert job["name"] == "node"
        assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
        pod = job["template"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["name"] == "node"
        assert pod["nodeSelector"] == {**k8s_jobs.GPU_NODE_SELECTOR, "nvidia.com/gpu.product": product}
        assert k8s_jobs.GPU_TOLERATIONS[0] in pod["tolerations"]
    prod_pod = by_kind(builds["prod"], "TrainingRuntime")["mtlflow-torch-distributed"]["spec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoSchedule"} in prod_pod["tolerations"]


def test_secret_template_is_valid_but_holds_no_credentials(builds):
    import kubernetes_validate

    template = yaml.safe_load((K8S / "base" / "secret-dvc-remote.template.yaml").read_text())
    kubernetes_validate.validate(template, K8S_VERSION, strict=True)
    assert template["metadata"]["name"] == cluster.DVC_SECRET
    assert set(template["stringData"]) == set(cluster.DVC_SECRET_ENV)
    assert all("REPLACE" in v for v in template["stringData"].values())
    listed = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["resources"]
    assert not any("secret" in r for r in listed)


# -- the job manifests of launch_trainjob ------------------------------------------------------

SPEC = json.dumps({"method": "fairgrad", "seed": 3, "hparams": {"alpha": 2.0}})


def _job(**kw):
    layout = StorageLayout()
    command = k8s_jobs.train_command("/mnt/mtlflow/data/datasets/abc", "/mnt/mtlflow/checkpoints/runs/k", SPEC, 10,
                                     {"batch_size": 128, "device": "cuda"})
    return k8s_jobs.DistributedTraining(
        name=k8s_jobs.job_name("fairgrad-s3-0123456789abcdef"), namespace="mtlflow", image="reg/mtlflow:1",
        command=command, volumes=tuple(k8s_jobs.Volume(c, layout.mount(c)) for c in ("mtlflow-data", "mtlflow-checkpoints")),
        **kw)


def test_train_command_runs_the_cli_under_torchrun_with_resume():
    command = _job().command
    assert command[:4] == ["torchrun", "-m", "mtlflow", "train"]
    pairs = dict(zip(command[4::1], command[5::1]))
    assert pairs["--method"] == "fairgrad" and pairs["--seed"] == "3" and pairs["--epochs"] == "10"
    assert pairs["--hp"] == "alpha=2.0" and pairs["--batch-size"] == "128" and pairs["--device"] == "cuda"
    assert "--resume" in command and "--no-progress" in command
    # the command parses with the real CLI parser
    from mtlflow.cli import build_parser

    args = build_parser().parse_args(command[3:])
    assert args.resume and args.method == "fairgrad" and args.batch_size == 128
    with pytest.raises(InvalidParameterError, match="unknown training option.s. warmup; valid: method, hparams"):
        k8s_jobs.train_command("/d", "/r", SPEC, 1, {"warmup": 3})


def test_train_command_passes_the_gradient_backend_options():
    command = k8s_jobs.train_command("/d", "/r", SPEC, 1, {"grad_backend": "batched", "grad_wrt": "parameters"})
    from mtlflow.cli import build_parser

    args = build_parser().parse_args(command[3:])
    assert (args.grad_backend, args.grad_wrt) == ("batched", "parameters")


def test_checkpoint_keys_separate_pipeline_runs_and_keep_retries_together():
    from mtlflow.config.pipeline import run_key

    key = lambda run_id: run_key(SPEC, "hash", 10, {"batch_size": 128, "device": "cuda"}, run_id)  # noqa: E731
    assert key("run-a") == key("run-a") == run_key(SPEC, "hash", 10, {"batch_size": 128, "device": "cpu"}, "run-a")
    assert key("run-a") != key("run-b") and key("run-a").startswith("fairgrad-s3-")
    assert k8s_jobs.job_name(key("run-a")) != k8s_jobs.job_name(key("run-b"))


def test_job_names_are_rfc1035_labels_that_keep_the_hash():
    long = k8s_jobs.job_name("ls-s0-" + "very_long_task_name-" * 6 + "0123456789abcdef")
    assert len(long) <= 63 and long.endswith("-0123456789abcdef") and long[0].isalpha()
    with pytest.raises(InvalidParameterError, match="RFC 1035"):
        k8s_jobs.trainjob_manifest(k8s_jobs.DistributedTraining(name="Bad_Name", namespace="x", image="i", command=[]))


def test_trainjob_manifest_shape():
    job = _job(num_nodes=2, gpus_per_node=4)
    m = k8s_jobs.trainjob_manifest(job)
    assert (m["apiVersion"], m["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert m["metadata"] == {"name": job.name, "namespace": "mtlflow", "labels": {"app.kubernetes.io/part-of": "mtlflow"}}
    assert m["spec"]["runtimeRef"] == {"name": "mtlflow-torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                       "kind": "TrainingRuntime"}
    trainer = m["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4 and trainer["image"] == "reg/mtlflow:1"
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
    assert trainer["command"] == job.command
    assert set(m["spec"]) == {"runtimeRef", "trainer"}


def test_pytorchjob_manifest_shape_and_valid_pod_template():
    import kubernetes_validate

    job = _job(num_nodes=3, gpus_per_node=2)
    m = k8s_jobs.pytorchjob_manifest(job)
    assert (m["apiVersion"], m["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert m["spec"]["nprocPerNode"] == "2" and m["spec"]["runPolicy"]["backoffLimit"] == 3
    replicas = m["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for spec in replicas.values():
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch" and container["command"] == job.command
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        mounts = {v["mountPath"] for v in container["volumeMounts"]}
        assert {"/mnt/mtlflow/data", "/mnt/mtlflow/checkpoints", "/dev/shm"} == mounts
        # the replica's pod template is a core PodTemplateSpec: validate it as a Pod
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **spec["template"]["metadata"]},
               "spec": spec["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    single = k8s_jobs.pytorchjob_manifest(_job(num_nodes=1))
    assert set(single["spec"]["pytorchReplicaSpecs"]) == {"Master"}


class FakeCustomObjects:
    def __init__(self, states, exists=False):
        self.states, self.exists, self.created, self.polls = list(states), exists, [], 0

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        if self.exists:
            error = RuntimeError("conflict")
            error.status = 409
            raise error
        self.created.append((group, version, namespace, plural, body["metadata"]["name"]))

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.polls += 1
        kind = self.states.pop(0) if self.states else None
        conditions = [{"type": kind, "status": "True", "reason": "BackoffLimitExceeded", "message": "pod OOMKilled"}] \
            if kind else []
        return {"status": {"conditions": conditions}}


def test_submit_and_wait_polls_until_complete_and_reattaches_on_retry():
    api = FakeCustomObjects([None, "Created", "Complete"])
    k8s_jobs.submit_and_wait(k8s_jobs.trainjob_manifest(_job()), api, sleep=lambda s: None)
    assert api.created[0][:4] == ("trainer.kubeflow.org", "v1alpha1", "mtlflow", "trainjobs") and api.polls == 3
    again = FakeCustomObjects(["Succeeded"], exists=True)
    k8s_jobs.submit_and_wait(k8s_jobs.pytorchjob_manifest(_job()), again, sleep=lambda s: None)
    assert again.created == [] and again.polls == 1


def test_submit_and_wait_reports_failure_and_timeout():
    with pytest.raises(k8s_jobs.JobFailedError, match="BackoffLimitExceeded: pod OOMKilled"):
        k8s_jobs.submit_and_wait(k8s_jobs.trainjob_manifest(_job()), FakeCustomObjects(["Failed"]), sleep=lambda s: None)
    clock = iter(range(0, 1000, 10))
    with pytest.raises(k8s_jobs.JobFailedError, match="did not finish within 25 s"):
        k8s_jobs.submit_and_wait(k8s_jobs.trainjob_manifest(_job()), FakeCustomObjects([]), timeout_seconds=25,
                                 sleep=lambda s: None, clock=lambda: next(clock))
