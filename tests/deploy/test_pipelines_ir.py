"""The compiled IR of every pipeline (`mtlflow pipeline compile --all`): GPU and CPU/memory requests,
retries, PVC mounts, the DVC Secret as environment variables, GPU scheduling, loop parallelism, the
exit handler, the promotion condition, and caching off for steps with side effects."""

from __future__ import annotations

import pytest
import yaml

from mtlflow.cli import main
from mtlflow.config.cluster import ClusterProfile
from mtlflow.ops.storage import CLUSTER_ROOT
from mtlflow.pipelines import cluster
from mtlflow.pipelines.benchmark_sweep import PARALLELISM


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    assert main(["pipeline", "compile", "--all", "--out-dir", str(out)]) == 0
    docs = {p.stem: list(yaml.safe_load_all(p.read_text())) for p in out.glob("*.yaml")}
    assert set(docs) == {"benchmark_sweep", "retrain", "distributed_train", "tuned_sweep"}
    return {name: {"ir": d[0], "k8s": d[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]}
            for name, d in docs.items()}


def tasks(ir):
    """Every task of every DAG (root, exit handler, loops, conditions) by task name."""
    found = dict(ir["root"]["dag"]["tasks"])
    for comp in ir["components"].values():
        found.update(comp.get("dag", {}).get("tasks", {}))
    return found


def caching(task):
    return task.get("cachingOptions", {}).get("enableCache", False)


def test_training_requests_gpu_cpu_memory_and_retries(compiled):
    for name in ("benchmark_sweep", "retrain"):
        ir = compiled[name]["ir"]
        for executor in [e for e in ir["deploymentSpec"]["executors"] if e.startswith("exec-train")]:
            res = ir["deploymentSpec"]["executors"][executor]["container"]["resources"]
            assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"
            train = ClusterProfile().resources["train"]  # compiled without --profile: the default profile
            assert res["resourceCpuRequest"] == train.cpu_request
            assert res["resourceMemoryLimit"] == train.memory_limit
        train_tasks = [t for n, t in tasks(ir).items() if t["componentRef"]["name"].startswith("comp-train")]
        assert train_tasks
        for task in train_tasks:
            assert task["retryPolicy"]["maxRetryCount"] == cluster.TRAIN_RETRIES["num_retries"]
            assert task["retryPolicy"]["backoffDuration"] == "60s"


def test_training_checkpoints_to_the_pvc_and_schedules_on_gpu_nodes(compiled):
    for name in ("benchmark_sweep", "retrain"):
        ir, k8s = compiled[name]["ir"], compiled[name]["k8s"]
        for executor in [e for e in k8s if e.startswith("exec-train")]:
            spec = k8s[executor]
            assert spec["pvcMount"] == [{"constant": "mtlflow-checkpoints", "mountPath": f"{CLUSTER_ROOT}/checkpoints",
                                         "pvcNameParameter": {"runtimeValue": {"constant": "mtlflow-checkpoints"}}}]
            assert spec["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
            assert spec["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
            assert spec["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
        roots = {t["inputs"]["parameters"]["checkpoint_root"]["runtimeValue"]["constant"]
                 for t in tasks(ir).values() if t["componentRef"]["name"].startswith("comp-train")}
        assert roots == {f"{CLUSTER_ROOT}/checkpoints/runs"}


#: KFP's placeholders of the pipeline run (id, name, resource name, create time, ...): a run-specific input
RUN_PLACEHOLDER = "{{$.pipeline_job_"


def _constants(task):
    return [p.get("runtimeValue", {}).get("constant") for p in task.get("inputs", {}).get("parameters", {}).values()]


@pytest.mark.parametrize("name", ["benchmark_sweep", "retrain"])
def test_cached_tasks_are_keyed_by_their_inputs_and_the_data_step_is_not_cached(compiled, name):
    """KFP reuses a succeeded task whose inputs are the same: a cached task must not take a value that
    changes with every pipeline run, or it is never reused. ``train`` takes the run's name (the grouping key
    its exit handler deletes its Pushgateway groups by, issue 30 item 9) and is not cached: its reuse across
    runs is the run key's on the checkpoints volume."""
    all_tasks = tasks(compiled[name]["ir"])
    cached = {n: t for n, t in all_tasks.items() if caching(t)}
    assert {n: c for n, t in cached.items() for c in _constants(t) if RUN_PLACEHOLDER in str(c)} == {}
    assert set(all_tasks["train"]["inputs"]["parameters"]) == {"run_spec", "epochs", "train_options",
                                                               "checkpoint_root", "pushgateway", "pipeline_name",
                                                               "pipeline_run"}
    # the training groups carry the same run name as the exit handler's job_name
    run_name = all_tasks["record-status"]["inputs"]["parameters"]["job_name"]["runtimeValue"]["constant"]
    assert all_tasks["train"]["inputs"]["parameters"]["pipeline_run"]["runtimeValue"]["constant"] == run_name == \
        "{{$.pipeline_job_name}}"
    assert set(all_tasks["train"]["inputs"]["artifacts"]) == {"data"}
    # the DVC remote comes from a Secret that no cache key sees, and pushing is a side effect: never cached
    assert not caching(all_tasks["prepare-data"])
    # the steps that take the run's name push it to the Pushgateway and record it: never cached
    takes_run = {n for n, t in all_tasks.items() if any(RUN_PLACEHOLDER in str(c) for c in _constants(t))}
    assert {"record-status", "train"} <= takes_run and not any(caching(all_tasks[n]) for n in takes_run)
    if name == "benchmark_sweep":
        assert all_tasks["aggregate"]["inputs"]["parameters"]["run_name"]["runtimeValue"]["constant"] == \
            "{{$.pipeline_job_name}}"


def test_data_step_gets_the_dvc_secret_as_env_and_the_data_volume(compiled):
    for parts in compiled.values():
        spec = parts["k8s"]["exec-prepare-data"]
        (secret,) = spec["secretAsEnv"]
        assert secret["secretName"] == cluster.DVC_SECRET and secret["optional"] is True
        assert {e["envVar"] for e in secret["keyToEnv"]} == {"MTLFLOW_DVC_REMOTE", "AWS_ACCESS_KEY_ID",
                                                             "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}
        assert [m["constant"] for m in spec["pvcMount"]] == ["mtlflow-data"]
        # no credential ever appears as a literal in the IR
        text = yaml.safe_dump(parts["ir"])
        assert "secret_access_key:" not in text and "AWS_SECRET_ACCESS_KEY" not in text


def test_sweep_loops_are_limited_and_wrapped_by_the_status_exit_handler(compiled):
    ir = compiled["benchmark_sweep"]["ir"]
    loops = [t for t in tasks(ir).values() if "iteratorPolicy" in t]
    assert len(loops) == 2 and {t["iteratorPolicy"]["parallelismLimit"] for t in loops} == {PARALLELISM}
    for parts in compiled.values():
        root = parts["ir"]["root"]["dag"]["tasks"]
        status = root["record-status"]
        assert status["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
        assert status["inputs"]["parameters"]["status"]["taskFinalStatus"]["producerTask"] == "exit-handler-1"
        assert not caching(status)
        assert [m["constant"] for m in parts["k8s"]["exec-record-status"]["pvcMount"]] == ["mtlflow-checkpoints"]


def test_retrain_promotes_only_if_better_and_never_from_cache(compiled):
    ir, k8s = compiled["retrain"]["ir"], compiled["retrain"]["k8s"]
    all_tasks = tasks(ir)
    condition = all_tasks["condition-2"]
    assert condition["triggerPolicy"]["condition"] == \
        "inputs.parameter_values['pipelinechannel--compare-to-champion-Output'] == true"
    assert not caching(all_tasks["compare-to-champion"]) and not caching(all_tasks["promote"])
    assert not caching(all_tasks["train"]) and not caching(all_tasks["prepare-data"])
    for executor in ("exec-compare-to-champion", "exec-promote"):
        assert [m["mountPath"] for m in k8s[executor]["pvcMount"]] == [f"{CLUSTER_ROOT}/models"]
    assert all_tasks["promote"]["inputs"]["parameters"]["model_store"]["runtimeValue"]["constant"] == \
        f"{CLUSTER_ROOT}/models"


def test_distributed_pipeline_launches_a_job_with_both_volumes(compiled):
    ir, k8s = compiled["distributed_train"]["ir"], compiled["distributed_train"]["k8s"]
    launch = tasks(ir)["launch-trainjob"]
    assert launch["retryPolicy"]["maxRetryCount"] == cluster.TRAIN_RETRIES["num_retries"]
    assert launch["inputs"]["parameters"]["image"]["runtimeValue"]["constant"] == \
        ir["deploymentSpec"]["executors"]["exec-launch-trainjob"]["container"]["image"]
    assert sorted(m["constant"] for m in k8s["exec-launch-trainjob"]["pvcMount"]) == ["mtlflow-checkpoints",
                                                                                     "mtlflow-data"]
    assert launch["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    # rank 0's training group carries the run's name, which the exit handler deletes it by (issue 30, item 9)
    status = tasks(ir)["record-status"]["inputs"]["parameters"]["job_name"]["runtimeValue"]["constant"]
    assert launch["inputs"]["parameters"]["pipeline_run"]["runtimeValue"]["constant"] == status == \
        "{{$.pipeline_job_name}}"
    # the launcher itself needs no GPU: the TrainJob's nodes request them
    assert "accelerator" not in ir["deploymentSpec"]["executors"]["exec-launch-trainjob"]["container"]["resources"]


def test_compile_one_pipeline_by_alias(tmp_path, capsys):
    assert main(["pipeline", "compile", "--pipeline", "main", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "benchmark_sweep.yaml").is_file()
    assert main(["pipeline", "compile", "--pipeline", "nope", "--out-dir", str(tmp_path)]) == 2
    assert "valid pipelines: benchmark_sweep, distributed_train, main, retrain" in capsys.readouterr().err
