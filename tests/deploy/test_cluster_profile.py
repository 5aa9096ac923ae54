"""The cluster profile (mtlflow.config.cluster) applied at compile time: `mtlflow pipeline compile
--profile k8s/overlays/<env>/profile.yaml` gives the training tasks the node selector and tolerations of
that overlay's GPU pool (prod: the dedicated=ml-training taint), every task the profile's user and
image pull Secrets, and the distributed launcher the profile its TrainJobs carry (validated against the
Trainer CRD schema). The example profiles must match their overlays."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_submit_client import kfp_api  # noqa: F401 -- the loopback KFP API server fixture

import kubernetes_schemas
from mtlflow.cli import main
from mtlflow.config.cluster import ClusterProfile, load_profile
from mtlflow.config.pipeline import from_struct
from mtlflow.ops import k8s_jobs

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "k8s" / "overlays"
DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoSchedule"}


def overlay(env: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAYS / env)], capture_output=True, text=True, check=True,
                         timeout=60)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def runtime_pod(objs: list[dict]) -> dict:
    (runtime,) = [o for o in objs if o["kind"] == "TrainingRuntime"]
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def compiled(pipeline: str, env: str, tmp_path: Path) -> tuple[dict, dict]:
    out = tmp_path / f"{pipeline}-{env}.yaml"
    assert main(["pipeline", "compile", "--pipeline", pipeline, "--out", str(out),
                 "--profile", str(OVERLAYS / env / "profile.yaml")]) == 0
    ir, platform = yaml.safe_load_all(out.read_text())
    return ir, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def as_set(tolerations):
    return {tuple(sorted(t.items())) for t in tolerations}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ir")
    return {env: compiled("benchmark_sweep", env, tmp) for env in ("dev", "prod")}


def test_prod_training_tasks_tolerate_the_dedicated_taint_and_select_the_prod_pool(sweeps):
    prod_pod = runtime_pod(overlay("prod"))
    ir, executors = sweeps["prod"]
    train = [name for name in executors if name.startswith("exec-train")]
    assert train
    for name in train:
        assert DEDICATED in executors[name]["tolerations"]
        assert as_set(executors[name]["tolerations"]) == as_set(prod_pod["tolerations"])
        assert executors[name]["nodeSelector"]["labels"] == prod_pod["nodeSelector"]
        resources = ir["deploymentSpec"]["executors"][name]["container"]["resources"]
        assert (resources["resourceCpuRequest"], resources["resourceMemoryLimit"]) == ("8", "128Gi")
        assert (resources["accelerator"]["resourceType"], resources["accelerator"]["resourceCount"]) == \
            ("nvidia.com/gpu", "1")


def test_every_prod_task_runs_as_the_image_user_with_the_pull_secret(sweeps):
    ir, executors = sweeps["prod"]
    assert set(executors) == set(ir["deploymentSpec"]["executors"])
    for name, spec in executors.items():
        assert spec["securityContext"] == {"runAsUser": "1000", "runAsGroup": "1000", "runAsNonRoot": True}, name
        assert [s["secretName"] for s in spec["imagePullSecret"]] == ["mtlflow-registry"], name


def test_dev_profile_differs_and_matches_the_dev_overlay(sweeps):
    dev_pod = runtime_pod(overlay("dev"))
    _, executors = sweeps["dev"]
    spec = executors["exec-train"]
    assert spec["nodeSelector"]["labels"] == dev_pod["nodeSelector"]
    assert as_set(spec["tolerations"]) == as_set(dev_pod["tolerations"])
    assert DEDICATED not in spec["tolerations"] and "imagePullSecret" not in spec
    assert spec["nodeSelector"] != sweeps["prod"][1]["exec-train"]["nodeSelector"]


def test_the_launcher_builds_valid_trainjobs_from_the_compiled_profile(tmp_path):
    """The profile compiled into distributed_train reaches the launcher as a constant; the TrainJob it
    builds from that constant passes the Trainer v2.3.0 schema and schedules on the prod pool."""
    ir, _ = compiled("distributed_train", "prod", tmp_path)
    tasks = {}
    for comp in ir["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    launch = tasks["launch-trainjob"]
    constant = launch["inputs"]["parameters"]["profile"]["runtimeValue"]["constant"]
    profile = ClusterProfile.model_validate(from_struct(constant))
    assert profile == load_profile(OVERLAYS / "prod" / "profile.yaml")
    for gpus in (1, 8):
        job = k8s_jobs.DistributedTraining(name="mtlflow-fairgrad-s0-0123456789abcdef", namespace=profile.namespace,
                                           image="reg/mtlflow:1", command=["torchrun", "-m", "mtlflow", "train"],
                                           num_nodes=2, gpus_per_node=gpus, profile=profile)
        manifest = k8s_jobs.trainjob_manifest(job)
        assert kubernetes_schemas.errors(manifest) == []
        pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
            "template"]["spec"]["template"]["spec"]
        assert DEDICATED in pod["tolerations"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_trainjobs_using_the_whole_gpu_quota_fit_its_cpu_and_memory(env):
    (quota,) = [o for o in overlay(env) if o["kind"] == "ResourceQuota"]
    hard = quota["spec"]["hard"]
    profile = load_profile(OVERLAYS / env / "profile.yaml")
    gpus = int(hard["requests.nvidia.com/gpu"])
    units = {"Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    to_bytes = lambda q: int(q[:-2]) * units[q[-2:]]  # noqa: E731
    cpu = profile.trainjob.cpu(gpus)
    assert (float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) <= float(hard["requests.cpu"])
    assert to_bytes(profile.trainjob.memory(gpus)) <= to_bytes(hard["requests.memory"])


def test_submit_compiles_for_the_profile_and_runs_as_its_service_account(kfp_api, capsys):  # noqa: F811
    """`submit --profile` uploads the pipeline compiled for that cluster (against the loopback KFP API of
    test_submit_client: no KFP server can run here) and runs it as the profile's ServiceAccount."""
    host, api = kfp_api
    assert main(["pipeline", "submit", "--host", host, "--profile", str(OVERLAYS / "prod" / "profile.yaml"),
                 "--param", "method=famo", "--param", "epochs=2"]) == 0
    (upload,) = [r for r in api.requests if r["path"].endswith("/pipelines/upload")]
    _, platform = yaml.safe_load_all(upload["body"]["uploadfile"])
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert DEDICATED in executors["exec-train"]["tolerations"]
    assert api.requests[-1]["body"]["service_account"] == "mtlflow-pipeline"


def test_a_bad_profile_is_one_line_and_nothing_is_written(tmp_path, capsys):
    bad = tmp_path / "profile.yaml"
    bad.write_text("tolerations:\n  - {key: dedicated, operator: Maybe}\n")
    out = tmp_path / "out.yaml"
    assert main(["pipeline", "compile", "--profile", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"cluster profile {bad}: tolerations.0.operator:" in err
    assert "Exists" in err and not out.exists()
    bad.write_text("node_selectors: {a: b}\n")
    assert main(["pipeline", "compile", "--profile", str(bad), "--out", str(out)]) == 2
    assert "node_selectors: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["pipeline", "compile", "--profile", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert "cluster profile not found" in capsys.readouterr().err


def test_the_readme_and_guide_cluster_commands_parse_and_name_existing_files():
    """The cluster commands of the README and the cluster guide use real options, overlays and profiles."""
    import re
    import shlex

    from mtlflow.cli import build_parser

    checked = 0
    for doc in (ROOT / "README.md", ROOT / "docs" / "guides" / "kubeflow.md"):
        text = re.sub(r"\\\n\s*", " ", doc.read_text())
        for line in re.findall(r"^(?:mtlflow pipeline (?:compile|submit|schedule)|kubectl apply -k) .*$", text, re.M):
            argv = shlex.split(line.split("  #")[0])
            if argv[0] == "kubectl":
                assert (ROOT / argv[-1] / "kustomization.yaml").is_file(), line
                continue
            args = build_parser().parse_args(argv[1:])
            assert args.profile and (ROOT / args.profile).is_file(), line
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("env, per_loop", [("dev", 1), ("prod", 4)])
def test_sweep_parallelism_fits_the_gpu_quota(env, per_loop, sweeps):
    """Issue 30, item 10: both loops of the sweep train at once; with parallelism 4 each, dev's quota of 2 GPUs would
    be asked for 8 GPU pods. The profile's gpu_quota is the overlay's, and caps each loop so both fit it."""
    (quota,) = [o for o in overlay(env) if o["kind"] == "ResourceQuota"]
    profile = load_profile(OVERLAYS / env / "profile.yaml")
    assert profile.gpu_quota == int(quota["spec"]["hard"][f"requests.{profile.accelerator.type}"])
    ir, _ = sweeps[env]
    loops = [t for c in [ir["root"], *ir["components"].values()] for t in c.get("dag", {}).get("tasks", {}).values()
             if "iteratorPolicy" in t]
    assert [t["iteratorPolicy"]["parallelismLimit"] for t in loops] == [per_loop, per_loop]
    assert len(loops) * per_loop * profile.accelerator.count <= profile.gpu_quota
