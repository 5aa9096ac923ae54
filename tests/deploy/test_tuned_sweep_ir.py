"""tuned_sweep compiles with both routes in its IR: ``tuner == optuna`` runs one tune_study task per study (a loop
over plan_tuning's studies, each on a GPU node with the checkpoints volume, its journal) and then compare_tuned;
``tuner == katib`` runs the Katib launcher (the same cluster setup as distributed_train's TrainJob launcher) and
retrains the best trials with the sweep's own train, evaluate and aggregate components. retrain's candidate comes
from tuned_run, which reads a tune.json on the checkpoints volume."""

from __future__ import annotations

import yaml

from mtlflow.config.pipeline import TunedSweepConfig
from mtlflow.pipelines import runner


def _ir(path):
    documents = list(yaml.safe_load_all(path.read_text()))
    return documents[0], (documents[1] if len(documents) > 1 else {})


def _tasks(ir, component):
    return ir["components"][component]["dag"]["tasks"] if component != "root" else ir["root"]["dag"]["tasks"]


def test_compile_all_includes_tuned_sweep(tmp_path):
    written = runner.compile_all(tmp_path)
    assert tmp_path / "tuned_sweep.yaml" in written


def test_tuned_sweep_ir_has_the_optuna_and_the_katib_routes(tmp_path):
    ir, platform = _ir(runner.compile_pipeline(tmp_path / "tuned.yaml", pipeline="tuned_sweep"))
    assert ir["pipelineInfo"]["name"] == "mtlflow-tuned-sweep"
    assert set(ir["root"]["inputDefinitions"]["parameters"]) == set(TunedSweepConfig.field_names())
    conditions = {}
    for component in ir["components"].values():
        for task in component.get("dag", {}).get("tasks", {}).values():
            if "triggerPolicy" in task:
                conditions[task["componentRef"]["name"]] = task["triggerPolicy"]["condition"]
    by_branch = {value: key for key, value in conditions.items()}
    optuna = next(c for c in by_branch if "'optuna'" in c)
    katib = next(c for c in by_branch if "'katib'" in c)
    assert "tuner" in optuna and "tuner" in katib
    local = _tasks(ir, by_branch[optuna])
    assert {"tuning-arguments", "plan-tuning", "compare-tuned"} <= set(local)
    loop = next(t for t in local.values() if "parameterIterator" in t)
    assert loop["parameterIterator"]["items"]["inputParameter"].endswith("plan-tuning-Output")
    assert "tune-study" in _tasks(ir, loop["componentRef"]["name"])
    collected = local["compare-tuned"]["inputs"]["parameters"]["studies"]["taskOutputParameter"]
    assert collected["outputParameterKey"].endswith("tune-study-Output")  # waits for every study
    cluster = _tasks(ir, by_branch[katib])
    assert {"launch-katib", "plan-tuned-runs", "aggregate"} <= set(cluster)
    katib_options = cluster["launch-katib"]["inputs"]["parameters"]["train_options"]["taskOutputParameter"]
    assert katib_options["producerTask"] == "trial-options"  # the pipeline's epochs among the trials' options
    loops = [t for t in cluster.values() if "parameterIterator" in t]
    assert sorted(t["parameterIterator"]["items"]["inputParameter"] for t in loops) == [
        "pipelinechannel--plan-tuned-runs-references", "pipelinechannel--plan-tuned-runs-runs"]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    study = next(v for k, v in executors.items() if k.startswith("exec-tune-study"))
    assert [m["mountPath"] for m in study["pvcMount"]] == ["/mnt/mtlflow/checkpoints"]
    launcher = next(v for k, v in executors.items() if k.startswith("exec-launch-katib"))
    assert {m["mountPath"] for m in launcher["pvcMount"]} == {"/mnt/mtlflow/data", "/mnt/mtlflow/checkpoints"}
    gpus = {k for k, v in ir["deploymentSpec"]["executors"].items()
            if v["container"].get("resources", {}).get("accelerator")}
    assert {"exec-tune-study", "exec-compare-tuned", "exec-train"} <= gpus
    assert "exec-launch-katib" not in gpus and "exec-plan-tuning" not in gpus


def test_retrain_takes_its_candidate_from_tuned_run(tmp_path):
    ir, platform = _ir(runner.compile_pipeline(tmp_path / "retrain.yaml", pipeline="retrain"))
    tasks = next(c["dag"]["tasks"] for c in ir["components"].values() if "train" in c.get("dag", {}).get("tasks", {}))
    inputs = tasks["train"]["inputs"]["parameters"]
    assert inputs["run_spec"]["taskOutputParameter"] == {"producerTask": "tuned-run", "outputParameterKey": "run_spec"}
    assert inputs["train_options"]["taskOutputParameter"]["outputParameterKey"] == "options"
    assert tasks["tuned-run"]["inputs"]["parameters"]["tuned"]["componentInputParameter"] == "pipelinechannel--tuned"
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert [m["mountPath"] for m in executors["exec-tuned-run"]["pvcMount"]] == ["/mnt/mtlflow/checkpoints"]
