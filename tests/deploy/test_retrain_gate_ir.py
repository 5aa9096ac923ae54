"""The compiled retrain pipeline evaluates the champion on the new data: its compare step takes the new
prepared Dataset (not the candidate's stored evaluation), and promote stores the gate's decision."""

from __future__ import annotations

import yaml

from mtlflow.pipelines import runner


def _compiled_retrain(tmp_path) -> dict:
    from kfp import compiler

    path = tmp_path / "retrain.yaml"
    compiler.Compiler().compile(runner.get_pipeline("retrain"), str(path))
    return next(yaml.safe_load_all(path.read_text()))


def _tasks(ir):
    found = dict(ir["root"]["dag"]["tasks"])
    for comp in ir["components"].values():
        found.update(comp.get("dag", {}).get("tasks", {}))
    return found


def test_compare_step_gets_the_new_data_and_hands_its_decision_to_promote(tmp_path):
    ir = _compiled_retrain(tmp_path)
    tasks = _tasks(ir)
    compare, promote = tasks["compare-to-champion"], tasks["promote"]
    artifacts = compare["inputs"]["artifacts"]
    # the new data version's Dataset, from the same prepare step the candidate was trained on
    data = artifacts["data"]["taskOutputArtifact"]
    assert data == tasks["train"]["inputs"]["artifacts"]["data"]["taskOutputArtifact"]
    assert tasks[data["producerTask"]]["componentRef"]["name"] == "comp-prepare-data"
    assert artifacts["run"]["taskOutputArtifact"]["producerTask"] == "train"
    assert "evaluation" not in artifacts  # nothing stored is compared: both models are evaluated inside
    component = ir["components"][compare["componentRef"]["name"]]
    assert set(component["outputDefinitions"]["artifacts"]) == {"decision", "metrics"}
    assert component["outputDefinitions"]["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert compare["inputs"]["parameters"]["pushgateway"]["componentInputParameter"].endswith("pushgateway")
    # inside the dsl.If the decision reaches promote as the condition's input channel
    assert promote["inputs"]["artifacts"]["decision"] == {
        "componentInputArtifact": "pipelinechannel--compare-to-champion-decision"}
    assert "min_improvement" not in promote["inputs"].get("parameters", {})
    executor = ir["deploymentSpec"]["executors"]["exec-compare-to-champion"]["container"]
    assert "pipeline_steps.compare_to_champion(run.path, data.path" in "\n".join(executor["command"])
