import json
from pathlib import Path

from kfp import dsl

from components.evaluate.component import evaluate


def test_evaluate_matches_training_metrics(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    run = tiny_runs["ls"]["run"]
    evaluation = dsl.Artifact(uri=str(tmp_path / "evaluation.json"))
    metrics = dsl.Metrics(uri=str(tmp_path / "metrics.json"))
    evaluate.python_func(data=data, run=run, split="test", evaluation=evaluation, metrics=metrics)
    result = json.loads(Path(evaluation.path).read_text())
    trained = json.loads((Path(run.path) / "metrics.json").read_text())["final"]["test"]
    for task in ("left", "right"):
        assert abs(result["metrics"][task]["acc"] - trained[task]["acc"]) < 1e-12
        assert metrics.metadata[f"test.{task}.acc"] == result["metrics"][task]["acc"]
    assert evaluation.metadata["data_hash"] == data.metadata["content_hash"]
