"""The compiled `reproduce` pipeline (`mtlflow reproduce CLAIM --pipeline --compile FILE`): the seed loop over the
plan's output, the seed tasks' resources from the cluster profile (a GPU, its node selector and tolerations with
`--device cuda`; the train CPU/memory and no accelerator on `cpu`), retries and the checkpoints PVC, the claim's
settings as the parameters' defaults, and `--host` submitting that package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_submit_client import kfp_api  # noqa: F401 -- the loopback KFP API server fixture

from mtlflow.cli import main
from mtlflow.config.cluster import ClusterProfile, load_profile
from mtlflow.ops.storage import CLUSTER_ROOT
from mtlflow.pipelines import cluster

PROD = Path(__file__).resolve().parents[2] / "k8s" / "overlays" / "prod" / "profile.yaml"
ARGS = ["reproduce", "asmg-synthetic", "--scale", "paper", "--seeds", "3,4", "--set", "iterations=500", "--pipeline"]


def compiled(tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    out = tmp_path / "reproduce.yaml"
    assert main([*ARGS, "--compile", str(out), *extra]) == 0
    ir, platform = yaml.safe_load_all(out.read_text())
    return ir, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def tasks(ir: dict) -> dict:
    found = dict(ir["root"]["dag"]["tasks"])
    for comp in ir["components"].values():
        found.update(comp.get("dag", {}).get("tasks", {}))
    return found


def resources(ir: dict, executor: str) -> dict:
    return ir["deploymentSpec"]["executors"][executor]["container"]["resources"]


def test_one_task_per_seed_of_the_plan_then_the_combination(tmp_path):
    ir, _ = compiled(tmp_path)
    found = tasks(ir)
    loop_name, loop = next((n, t) for n, t in found.items() if "parameterIterator" in t)
    assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--plan-claim-Output"
    body = ir["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
    assert list(body) == ["reproduce-seed"]
    assert body["reproduce-seed"]["inputs"]["parameters"]["seed"] == {
        "componentInputParameter": "pipelinechannel--plan-claim-Output-loop-item"}
    combine = found["combine-claim"]
    assert combine["inputs"]["artifacts"]["parts"]["taskOutputArtifact"]["producerTask"] == loop_name
    assert combine["inputs"]["parameters"]["seeds"]["taskOutputParameter"]["producerTask"] == "plan-claim"
    # a submitted run measures afresh: neither the seeds nor the combination come from KFP's cache
    assert not body["reproduce-seed"].get("cachingOptions", {}).get("enableCache")
    assert not combine.get("cachingOptions", {}).get("enableCache")
    # the claim's settings are the parameters' defaults, exactly (JSON, not a struct of doubles)
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert params["claim"]["defaultValue"] == "asmg-synthetic" and params["scale"]["defaultValue"] == "paper"
    assert params["seeds"]["defaultValue"] == [3, 4]
    assert json.loads(params["settings"]["defaultValue"]) == {"iterations": 500}
    assert params["command"]["defaultValue"] == "mtlflow " + " ".join([*ARGS, "--compile",
                                                                       str(tmp_path / "reproduce.yaml")])


def test_cuda_seed_tasks_ask_for_the_profile_gpu_node_and_retries(tmp_path):
    ir, executors = compiled(tmp_path, "--device", "cuda")
    seed = resources(ir, "exec-reproduce-seed")
    assert (seed["accelerator"]["resourceType"], seed["accelerator"]["resourceCount"]) == ("nvidia.com/gpu", "1")
    train = ClusterProfile().resources["train"]
    assert (seed["resourceCpuRequest"], seed["resourceMemoryLimit"]) == (train.cpu_request, train.memory_limit)
    spec = executors["exec-reproduce-seed"]
    assert spec["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert {m["mountPath"] for m in spec["pvcMount"]} == {f"{CLUSTER_ROOT}/checkpoints", f"{CLUSTER_ROOT}/data"}
    assert tasks(ir)["reproduce-seed"]["retryPolicy"]["maxRetryCount"] == cluster.TRAIN_RETRIES["num_retries"]
    assert tasks(ir)["reproduce-seed"]["inputs"]["parameters"]["device"]["runtimeValue"]["constant"] == "cuda"
    assert tasks(ir)["reproduce-seed"]["inputs"]["parameters"]["work_root"]["runtimeValue"]["constant"] == (
        f"{CLUSTER_ROOT}/checkpoints/claims")
    light = ClusterProfile().resources["light"]
    for executor in ("exec-plan-claim", "exec-combine-claim"):
        assert "accelerator" not in resources(ir, executor)
        assert resources(ir, executor)["resourceCpuRequest"] == light.cpu_request


def test_cpu_seed_tasks_get_the_train_resources_and_no_gpu(tmp_path):
    ir, executors = compiled(tmp_path)
    seed = resources(ir, "exec-reproduce-seed")
    assert "accelerator" not in seed
    assert seed["resourceCpuRequest"] == ClusterProfile().resources["train"].cpu_request
    assert "nodeSelector" not in executors["exec-reproduce-seed"]
    assert tasks(ir)["reproduce-seed"]["retryPolicy"]["maxRetryCount"] == cluster.TRAIN_RETRIES["num_retries"]


def test_the_prod_profile_reaches_the_seed_tasks(tmp_path):
    profile = load_profile(PROD)
    ir, executors = compiled(tmp_path, "--device", "cuda", "--profile", str(PROD))
    seed = resources(ir, "exec-reproduce-seed")
    assert seed["resourceCpuRequest"] == profile.resources["train"].cpu_request
    spec = executors["exec-reproduce-seed"]
    assert spec["nodeSelector"]["labels"] == profile.node_selector
    assert {"key": "dedicated", "operator": "Equal", "value": "ml-training", "effect": "NoSchedule"} in spec[
        "tolerations"]
    assert spec["imagePullSecret"] == [{"secretName": "mtlflow-registry",
                                        "secretNameParameter": {"runtimeValue": {"constant": "mtlflow-registry"}}}]


def test_host_submits_the_claim_pipeline_as_the_profile_account(kfp_api, capsys):  # noqa: F811
    host, api = kfp_api
    assert main([*ARGS, "--device", "cuda", "--host", host, "--profile", str(PROD)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (upload,) = [r for r in api.requests if r["path"].endswith("/pipelines/upload")]
    ir, platform = yaml.safe_load_all(upload["body"]["uploadfile"])
    assert ir["pipelineInfo"]["name"] == "mtlflow-reproduce" and info["pipeline_version"].startswith(
        "mtlflow-reproduce-")
    assert "ml-training" in json.dumps(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-reproduce-seed"]["tolerations"])
    run = api.requests[-1]["body"]
    assert run["service_account"] == "mtlflow-pipeline"


@pytest.mark.parametrize("argv, message", [
    (["--ledger"], "--pipeline runs one CLAIM; --ledger and --list take no pipeline"),
    (["--compile", "x.yaml", "--local"], "exactly one of --local, --compile FILE and --host URL"),
    ([], "exactly one of --local, --compile FILE and --host URL, got none"),
    (["--device", "tpu", "--local"], "--device must be one of cpu, cuda with --pipeline"),
])
def test_bad_pipeline_input_is_one_line(tmp_path, capsys, argv, message):
    assert main(["reproduce", "asmg-synthetic", "--pipeline", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "out").exists()
