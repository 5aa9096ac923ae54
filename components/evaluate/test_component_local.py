"""evaluate under kfp.local's SubprocessRunner, on a real trained run and its dataset imported as artifacts:
the metrics it writes equal an in-process evaluation's (mtlflow.jobs.evaluate)."""

import json
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow import jobs
from mtlflow.components.evaluate.component import evaluate

pytestmark = pytest.mark.integration


def test_evaluate_runs_under_the_local_runner(local_runner, tiny_runs, tiny_dataset):
    data, _ = tiny_dataset
    run = tiny_runs["ls"]["run"]

    @dsl.pipeline(name="evaluate-locally")
    def evaluate_locally():
        dataset = dsl.importer(artifact_uri=data.uri, artifact_class=dsl.Dataset, metadata=dict(data.metadata))
        trained = dsl.importer(artifact_uri=run.uri, artifact_class=dsl.Artifact)
        evaluate(data=dataset.output, run=trained.output, split="test")

    evaluate_locally()
    (written,) = local_runner.rglob("evaluate/evaluation")
    expected = jobs.evaluate(run.path, data.path, split="test")["metrics"]
    metrics = json.loads(Path(written).read_text())["metrics"]
    assert set(metrics) == set(expected) == {"left", "right"}
    for task, values in expected.items():
        assert metrics[task] == pytest.approx(values, rel=1e-6)
