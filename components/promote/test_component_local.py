"""compare_to_champion and promote under kfp.local's SubprocessRunner, wired as the retrain pipeline wires
them (dsl.If on the gate's output): on an empty model store the gate promotes, and promote makes the imported
run the store's champion."""

import json
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.promote.component import compare_to_champion, promote
from mtlflow.ops import model_store

pytestmark = pytest.mark.integration


def test_gate_and_promote_run_under_the_local_runner(local_runner, tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    run = tiny_runs["ls"]["run"]
    store = tmp_path / "models"

    @dsl.pipeline(name="promote-locally")
    def promote_locally(model_store_path: str):
        dataset = dsl.importer(artifact_uri=data.uri, artifact_class=dsl.Dataset, metadata=dict(data.metadata))
        trained = dsl.importer(artifact_uri=run.uri, artifact_class=dsl.Artifact)
        scored = evaluate(data=dataset.output, run=trained.output, split="test")
        gate = compare_to_champion(run=trained.output, data=dataset.output, model_store=model_store_path,
                                   min_improvement=0.0)
        with dsl.If(gate.outputs["Output"] == True):  # noqa: E712 (a kfp condition, not a Python comparison)
            promote(run=trained.output, evaluation=scored.outputs["evaluation"], decision=gate.outputs["decision"],
                    data=dataset.output, model_store=model_store_path)

    promote_locally(model_store_path=str(store))
    (decision,) = local_runner.rglob("compare-to-champion/decision")
    record = json.loads(Path(decision).read_text())
    assert record["promote"] is True and record["champion"] is None
    champion = model_store.read_champion(store, data.metadata["benchmark"])
    assert champion is not None and champion["data_hash"] == data.metadata["content_hash"]
    assert (Path(champion["path"]) / "model.pt").read_bytes() == (Path(run.path) / "model.pt").read_bytes()
