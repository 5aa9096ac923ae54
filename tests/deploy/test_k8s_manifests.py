"""k8s/ manifests, validated offline: `kubectl kustomize` builds base and both overlays,
kubernetes-validate (--strict, k8s 1.32) checks every core object and the vendored CRD schemas of
Kubeflow Trainer v2.3.0 / training-operator v1.9.4 (k8s/schemas/) every custom resource, so no object
goes unchecked. Also the RBAC's references, the claims' access modes and storage classes, the runtime's
failure policy, the backend versions the guide states, and the job manifests launch_trainjob creates."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import kubernetes_schemas
import pod_security
from mtlflow.config.cluster import ClusterProfile, load_profile
from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops import k8s_jobs
from mtlflow.ops.storage import VOLUMES, StorageLayout
from mtlflow.pipelines import cluster

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
K8S_VERSION = "1.32.0"


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


def runtime_pod(objs):
    (runtime,) = by_kind(objs, "TrainingRuntime").values()
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_every_object_passes_strict_schema_validation(builds):
    import kubernetes_validate

    for name, objs in builds.items():
        kinds = {o["kind"] for o in objs}
        assert {"Namespace", "PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "ResourceQuota",
                "LimitRange", "TrainingRuntime"} <= kinds, name
        assert "Secret" not in kinds, "credentials must never be part of the kustomization"
        for obj in objs:
            if (obj["apiVersion"], obj["kind"]) in kubernetes_schemas.custom_kinds():
                assert kubernetes_schemas.errors(obj) == [], (name, obj["kind"])
            else:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_crd_validation_rejects_what_the_current_trainer_removed():
    """The runtime as it was (mlPolicy.torch.numProcPerNode, removed in Trainer v2.2.0) and a mistyped
    TrainJob field are errors; a missing required field too."""
    runtime = yaml.safe_load((K8S / "base" / "training-runtime.yaml").read_text())
    assert kubernetes_schemas.errors(runtime) == []
    runtime["spec"]["mlPolicy"]["torch"]["numProcPerNode"] = "auto"
    assert kubernetes_schemas.errors(runtime) == [
        "spec.mlPolicy.torch: Additional properties are not allowed ('numProcPerNode' was unexpected)"]
    job = k8s_jobs.trainjob_manifest(_job())
    job["spec"]["trainer"]["numProcsPerNode"] = 2
    del job["spec"]["runtimeRef"]
    assert set(kubernetes_schemas.errors(job)) == {
        "spec: 'runtimeRef' is a required property",
        "spec.trainer: Additional properties are not allowed ('numProcsPerNode' was unexpected)"}


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
        assert all(o["metadata"]["labels"]["mtlflow/environment"] == name for o in objs)


def test_rbac_binds_our_own_service_account_to_our_role(builds):
    """Every RoleBinding refers to a Role and to ServiceAccounts that the same build creates in its
    namespace (no default-editor or pipeline-runner, which exist only in some KFP installations)."""
    for name, objs in builds.items():
        roles, accounts = by_kind(objs, "Role"), by_kind(objs, "ServiceAccount")
        bindings = by_kind(objs, "RoleBinding")
        assert bindings, name
        for binding in bindings.values():
            assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["name"] in roles
            namespace = binding["metadata"].get("namespace")
            for subject in binding["subjects"]:
                assert subject["kind"] == "ServiceAccount" and subject["name"] in accounts, (name, subject)
                assert subject["namespace"] == namespace == accounts[subject["name"]]["metadata"].get("namespace")
        profiles = {"dev": load_profile(K8S / "overlays/dev/profile.yaml"),
                    "prod": load_profile(K8S / "overlays/prod/profile.yaml")}
        if name in profiles:
            assert profiles[name].service_account in accounts
            assert profiles[name].namespace == set(by_kind(objs, "Namespace")).pop()


def test_pipeline_account_may_manage_training_jobs_and_reads_no_other_secret(builds):
    (role,) = by_kind(builds["base"], "Role").values()
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for api in k8s_jobs.API.values():
        assert {"create", "get", "delete"} <= grants[(api[0], api[2])]
    assert {"get", "list"} <= grants[("", "pods/log")]
    for rule in role["rules"]:
        if "secrets" in rule["resources"]:
            assert rule["resourceNames"] == ["mlpipeline-minio-artifact"] and rule["verbs"] == ["get"]


def test_claims_get_a_class_that_provides_their_access_mode(builds):
    """The shared volumes are ReadWriteMany on a named class in every overlay (the clouds' default
    classes are ReadWriteOnce); the model store, mounted by one pod at a time, is ReadWriteOnce."""
    layout = StorageLayout()
    expected_class = {"dev": "nfs-client", "prod": "shared-rwx"}
    for name, objs in builds.items():
        pvcs = by_kind(objs, "PersistentVolumeClaim")
        assert set(pvcs) == set(VOLUMES)
        modes = {claim: p["spec"]["accessModes"] for claim, p in pvcs.items()}
        assert modes == {"mtlflow-data": ["ReadWriteMany"], "mtlflow-checkpoints": ["ReadWriteMany"],
                         "mtlflow-models": ["ReadWriteOnce"]}
        if name in expected_class:
            for claim, pvc in pvcs.items():
                if pvc["spec"]["accessModes"] == ["ReadWriteMany"]:
                    assert pvc["spec"]["storageClassName"] == expected_class[name], (name, claim)
        pod = runtime_pod(objs)
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {claims[n]: mounts[n] for n in claims} == {c: layout.mount(c) for c in ("mtlflow-data", "mtlflow-checkpoints")}
        assert {modes[c][0] for c in claims.values()} == {"ReadWriteMany"}


def test_runtime_restarts_a_failed_node_and_runs_as_the_image_user(builds):
    for objs in builds.values():
        (runtime,) = by_kind(objs, "TrainingRuntime").values()
        policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
        assert policy["maxRestarts"] >= 1 and policy["restartStrategy"] == "Recreate"
        # no fixed UID or fsGroup in the runtime: a TrainJob's patch cannot remove one (OpenShift assigns them)
        assert runtime_pod(objs)["securityContext"] == k8s_jobs.pod_security_context(ClusterProfile()) == {
            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_volume_permissions_job_hands_every_claim_to_the_image_user(builds, env):
    """Issue 30, item 11: KFP task pods cannot get an fsGroup (kfp-kubernetes 2.17 has no setter) and the overlays'
    shared-filesystem classes ignore it, so both overlays include the init Job (k8s/components/volume-permissions):
    a valid Job in the overlay's namespace that mounts every claim where the pipeline does and gives its top
    directory to the profile's UID/GID."""
    import kubernetes_validate

    (job,) = by_kind(builds[env], "Job").values()
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    profile = load_profile(K8S / "overlays" / env / "profile.yaml")
    assert job["metadata"]["namespace"] == profile.namespace
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
    mounts = {claims[m["name"]]: m["mountPath"] for m in container["volumeMounts"]}
    layout = StorageLayout()
    assert mounts == {claim: layout.mount(claim) for claim in VOLUMES}
    script = container["command"][-1]
    assert f"chown {profile.security.run_as_user}:{profile.security.run_as_group} {' '.join(mounts.values())}" \
        in script
    assert "Job" not in {o["kind"] for o in builds["base"]}, "the base stays free of it"


def test_gpu_quota_and_scheduling_per_environment(builds):
    expected = {"dev": ("2", "NVIDIA-L4"), "prod": ("32", "NVIDIA-H100-80GB-HBM3")}
    for name, (gpus, product) in expected.items():
        (quota,) = by_kind(builds[name], "ResourceQuota").values()
        assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == gpus
        (runtime,) = by_kind(builds[name], "TrainingRuntime").values()
        assert runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        assert job["name"] == k8s_jobs.TRAINER_NODE
        assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
        pod = job["template"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["name"] == k8s_jobs.TRAINER_NODE
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product}
    prod_pod = runtime_pod(builds["prod"])
    assert {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoSchedule"} in prod_pod["tolerations"]


def test_guide_states_the_backend_versions_the_schemas_come_from():
    """docs/guides/kubeflow.md names, as minimum versions, exactly the releases of k8s/schemas/versions.yaml."""
    guide = (ROOT / "docs" / "guides" / "kubeflow.md").read_text()
    section = guide.split("## Backend versions", 1)[1].split("\n## ", 1)[0]
    releases = kubernetes_schemas.versions()
    for label, key in (("Kubeflow Trainer", "kubeflow-trainer"), ("JobSet", "jobset"),
                       ("training-operator", "training-operator"), ("KFP backend", "kfp-backend")):
        assert f"| {label} | {releases[key]['version']} |" in section, label
    for release in releases.values():
        for file in (release.get("files") or {}).values():
            assert (K8S / "schemas" / file).is_file()


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
    command = kw.pop("command", None) or k8s_jobs.train_command(
        "/mnt/mtlflow/data/datasets/abc", "/mnt/mtlflow/checkpoints/runs/k", SPEC, 10,
        {"batch_size": 128, "device": "cuda"})
    return k8s_jobs.DistributedTraining(
        name=k8s_jobs.job_name("fairgrad-s3-0123456789abcdef"), namespace="mtlflow", image="reg/mtlflow:1",
        command=command, volumes=tuple(k8s_jobs.Volume(c, layout.mount(c)) for c in ("mtlflow-data", "mtlflow-checkpoints")),
        **kw)


def test_train_command_runs_the_cli_under_torchrun_with_resume():
    command = _job().command
    assert command[:4] == ["torchrun", "-m", "mtlflow", "train"]
    pairs = dict(itertools.pairwise(command[4:]))
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


def test_trainjob_manifest_is_valid_for_the_current_trainer_and_carries_the_profile():
    prod = load_profile(K8S / "overlays/prod/profile.yaml")
    job = _job(num_nodes=2, gpus_per_node=4, profile=prod, timeout_seconds=3600)
    m = k8s_jobs.trainjob_manifest(job)
    assert kubernetes_schemas.errors(m) == []
    assert (m["apiVersion"], m["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert m["metadata"]["labels"] == {"app.kubernetes.io/part-of": "mtlflow"}
    assert m["spec"]["runtimeRef"] == {"name": "mtlflow-torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                       "kind": "TrainingRuntime"}
    assert m["spec"]["activeDeadlineSeconds"] == 3600
    trainer = m["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4 and trainer["image"] == "reg/mtlflow:1"
    assert trainer["command"] == job.command
    # prod's 8 CPU and 60Gi per GPU, times 4 GPUs (hand-computed)
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "32", "memory": "240Gi", "nvidia.com/gpu": "4"},
                                           "limits": {"memory": "240Gi", "nvidia.com/gpu": "4"}}
    (patch,) = m["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == prod.node_selector
    assert {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["securityContext"]["fsGroup"] == 1000 and pod["securityContext"]["runAsUser"] == 1000
    assert pod["imagePullSecrets"] == [{"name": "mtlflow-registry"}]


def test_trainjob_resources_follow_the_gpu_count():
    one, eight = (k8s_jobs.trainjob_manifest(_job(gpus_per_node=g))["spec"]["trainer"]["resourcesPerNode"]
                  for g in (1, 8))
    assert one["requests"]["cpu"] == "8" and one["requests"]["memory"] == "32Gi"
    assert eight["requests"]["cpu"] == "64" and eight["requests"]["memory"] == "256Gi"
    half = ClusterProfile.model_validate({"trainjob": {"cpu_per_gpu": 0.5, "memory_per_gpu": "1536Mi"}})
    three = k8s_jobs.trainjob_manifest(_job(gpus_per_node=3, profile=half))["spec"]["trainer"]["resourcesPerNode"]
    assert three["requests"]["cpu"] == "1500m" and three["requests"]["memory"] == "4608Mi"


def test_the_spec_digest_changes_with_the_inputs():
    digest = lambda m: m["metadata"]["annotations"][k8s_jobs.SPEC_DIGEST]  # noqa: E731
    base = digest(k8s_jobs.trainjob_manifest(_job()))
    assert base == digest(k8s_jobs.trainjob_manifest(_job()))
    assert base != digest(k8s_jobs.trainjob_manifest(_job(gpus_per_node=2)))
    assert base != digest(k8s_jobs.trainjob_manifest(_job(profile=load_profile(K8S / "overlays/dev/profile.yaml"))))


def test_pytorchjob_manifest_shape_and_valid_pod_template():
    import kubernetes_validate

    job = _job(num_nodes=3, gpus_per_node=2, profile=load_profile(K8S / "overlays/prod/profile.yaml"))
    m = k8s_jobs.pytorchjob_manifest(job)
    assert kubernetes_schemas.errors(m) == []
    assert (m["apiVersion"], m["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert m["spec"]["nprocPerNode"] == "2" and m["spec"]["runPolicy"]["backoffLimit"] == 3
    replicas = m["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for spec in replicas.values():
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch" and container["command"] == job.command
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert container["resources"]["requests"]["cpu"] == "16"
        mounts = {v["mountPath"] for v in container["volumeMounts"]}
        assert {"/mnt/mtlflow/data", "/mnt/mtlflow/checkpoints", "/dev/shm"} == mounts
        assert spec["template"]["spec"]["tolerations"] == job.profile.tolerations_manifest()
        # the replica's pod template is a core PodTemplateSpec: validate it as a Pod
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **spec["template"]["metadata"]},
               "spec": spec["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    single = k8s_jobs.pytorchjob_manifest(_job(num_nodes=1))
    assert set(single["spec"]["pytorchReplicaSpecs"]) == {"Master"}


#: an OpenShift-style profile: no UID, GID or fsGroup (the restricted-v2 SCC assigns them from the namespace's range)
PLATFORM_IDS = ClusterProfile(name="openshift", namespace="mtlflow")


def trainjob_pod(objs, manifest):
    """The pod a TrainJob's nodes get: the overlay's runtime pod template with the job's runtime patch merged."""
    (runtime,) = by_kind(objs, "TrainingRuntime").values()
    template = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    patch, = manifest["spec"]["runtimePatches"]
    patched = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return pod_security.merged(template, patched)["spec"]


def test_the_restricted_check_finds_what_the_standard_forbids():
    """The checker can fail: each forbidden setting is found, and a compliant pod passes."""
    compliant = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                                  "capabilities": {"drop": ["ALL"]}}}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "x"}}]}
    assert pod_security.violations(compliant) == []
    broken = pod_security.merged(compliant, {
        "hostNetwork": True, "securityContext": {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}},
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"],
                                                                                             "drop": []}}}]})
    assert pod_security.violations(broken) == [
        "hostNetwork is true", "volume h is a hostPath", "volume h has a type outside the restricted set: ['hostPath']",
        "the pod's seccompProfile is Unconfined", "the pod runs as UID 0", "container c is privileged",
        "container c adds ['SYS_ADMIN']", "container c adds capabilities other than NET_BIND_SERVICE: ['SYS_ADMIN']",
        "container c does not drop ALL capabilities",
        "container c has no RuntimeDefault or Localhost seccompProfile (neither it nor the pod)"]
    old_runtime = pod_security.merged(compliant, {"securityContext": {"seccompProfile": {}},
                                                  "containers": [{"name": "c", "securityContext": {}}]})
    old_runtime["containers"][0]["securityContext"] = {}
    del old_runtime["securityContext"]["seccompProfile"]
    assert pod_security.violations(old_runtime) == [
        "container c does not drop ALL capabilities",
        "container c does not set allowPrivilegeEscalation: false",
        "container c has no RuntimeDefault or Localhost seccompProfile (neither it nor the pod)"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_training_pods_meet_the_restricted_pod_security_standard(builds, env):
    """Issue 30, item 7: the rendered runtime, every TrainJob's pod (runtime + patch) and every PyTorchJob pod pass
    the restricted Pod Security Standard, for the overlay's profile and for one that leaves the IDs to the platform
    (OpenShift restricted-v2); without IDs in the profile no pod pins a UID, GID or fsGroup."""
    objs = builds[env]
    assert pod_security.violations(runtime_pod(objs)) == []
    for profile in (load_profile(K8S / "overlays" / env / "profile.yaml"), PLATFORM_IDS):
        trainjob = k8s_jobs.trainjob_manifest(_job(profile=profile))
        assert kubernetes_schemas.errors(trainjob) == []
        pod = trainjob_pod(objs, trainjob)
        assert pod_security.violations(pod) == [], profile.name
        pytorchjob = k8s_jobs.pytorchjob_manifest(_job(profile=profile, num_nodes=2))
        for replica in pytorchjob["spec"]["pytorchReplicaSpecs"].values():
            assert pod_security.violations(replica["template"]["spec"]) == [], profile.name
        pinned = {k: v for k, v in pod["securityContext"].items() if k in ("runAsUser", "runAsGroup", "fsGroup")}
        if profile is PLATFORM_IDS:
            assert pinned == {}
        else:
            assert pinned == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}


def test_run_as_user_is_optional_and_a_root_uid_is_refused():
    assert ClusterProfile.model_validate({"security": {}}).security.run_as_user is None
    with pytest.raises(ValueError, match="run_as_user"):
        ClusterProfile.model_validate({"security": {"run_as_user": 0}})


def test_trainjob_pods_get_no_istio_sidecar_unless_the_profile_asks(builds):
    """Issue 30, item 4: Istio's sidecar breaks torchrun's rendezvous; the runtime and every TrainJob/PyTorchJob pod
    carry sidecar.istio.io/inject: "false", and the profile's trainjob.istio_sidecar turns it back on."""
    for objs in builds.values():
        (runtime,) = by_kind(objs, "TrainingRuntime").values()
        template = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        assert template["metadata"]["labels"][k8s_jobs.ISTIO_INJECT] == "false"
        for sidecar in (False, True):
            profile = ClusterProfile.model_validate({"trainjob": {"istio_sidecar": sidecar}})
            manifest = k8s_jobs.trainjob_manifest(_job(profile=profile))
            assert kubernetes_schemas.errors(manifest) == []
            patched = pod_security.merged(template, manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"][
                "template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"])
            assert patched["metadata"]["labels"][k8s_jobs.ISTIO_INJECT] == str(sidecar).lower()
            for replica in k8s_jobs.pytorchjob_manifest(_job(profile=profile))["spec"]["pytorchReplicaSpecs"].values():
                assert replica["template"]["metadata"]["labels"][k8s_jobs.ISTIO_INJECT] == str(sidecar).lower()


def test_trainjob_rank_0_pushes_to_the_pushgateway():
    """Issue 30, item 8: the job's command carries --pushgateway, which `mtlflow train` (the real parser) reads;
    under torchrun only rank 0 exports (cmd_train's is_main_process guard); without a gateway nothing is added."""
    from mtlflow.cli import build_parser

    gateway = "http://pushgateway.monitoring.svc:9091"
    command = k8s_jobs.train_command("/d", "/mnt/mtlflow/checkpoints/runs/k", SPEC, 2, {"batch_size": 8}, gateway)
    manifest = k8s_jobs.trainjob_manifest(_job(command=command))
    assert kubernetes_schemas.errors(manifest) == []
    trainer_command = manifest["spec"]["trainer"]["command"]
    assert trainer_command[:4] == ["torchrun", "-m", "mtlflow", "train"]
    args = build_parser().parse_args(trainer_command[3:])
    assert args.pushgateway == gateway and args.out == "/mnt/mtlflow/checkpoints/runs/k"
    assert args.pipeline_run is None  # no pipeline run given: no grouping label
    assert "--pushgateway" not in k8s_jobs.train_command("/d", "/o", SPEC, 2, {"batch_size": 8})
    # issue 30, item 9: the pipeline run's name reaches rank 0's grouping key, for the exit handler to delete it
    named = k8s_jobs.train_command("/d", "/o", SPEC, 2, {"batch_size": 8}, gateway, pipeline_run="sweep-1")
    assert build_parser().parse_args(named[3:]).pipeline_run == "sweep-1"


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_overlay_namespaces_are_enabled_for_multi_user_pipelines(builds, env):
    """Issue 30, item 6: KFP's profile controller provides the kfp-launcher ConfigMap and the object-store Secret
    only in namespaces labelled pipelines.kubeflow.org/enabled=true; each overlay's namespace (the one its profile
    names, where the pipeline pods and TrainJobs run) carries the label."""
    (namespace,) = by_kind(builds[env], "Namespace").values()
    assert namespace["metadata"]["name"] == load_profile(K8S / "overlays" / env / "profile.yaml").namespace
    assert namespace["metadata"]["labels"]["pipelines.kubeflow.org/enabled"] == "true"
    # what the driver reads there is granted to the pipeline account by name
    (role,) = by_kind(builds[env], "Role").values()
    granted = {name for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert {"kfp-launcher", "mlpipeline-minio-artifact"} <= granted
