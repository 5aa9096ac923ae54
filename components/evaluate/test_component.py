import json
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow.components.evaluate.component import evaluate
from mtlflow.core.errors import InvalidParameterError


def _outputs(tmp_path):
    return dict(evaluation=dsl.Artifact(uri=str(tmp_path / "evaluation.json")),
                metrics=dsl.Metrics(uri=str(tmp_path / "metrics.json")),
                confusion=dsl.ClassificationMetrics(uri=str(tmp_path / "confusion.json")),
                summary=dsl.Markdown(uri=str(tmp_path / "summary.md")))


def test_evaluate_matches_training_metrics(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    run = tiny_runs["ls"]["run"]
    out = _outputs(tmp_path)
    evaluate.python_func(data=data, run=run, split="test", **out)
    result = json.loads(Path(out["evaluation"].path).read_text())
    trained = json.loads((Path(run.path) / "metrics.json").read_text())["final"]["test"]
    for task in ("left", "right"):
        assert abs(result["metrics"][task]["acc"] - trained[task]["acc"]) < 1e-12
        assert out["metrics"].metadata[f"test.{task}.acc"] == result["metrics"][task]["acc"]
    assert out["evaluation"].metadata["data_hash"] == data.metadata["content_hash"]


def test_confusion_matrices_agree_with_accuracy_and_reach_the_ui(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    out = _outputs(tmp_path)
    evaluate.python_func(data=data, run=tiny_runs["mgda"]["run"], split="test", confusion_task="right", **out)
    result = json.loads(Path(out["evaluation"].path).read_text())
    for task in ("left", "right"):
        cm = result["confusion_matrices"][task]
        assert cm["kind"] == "multiclass" and cm["categories"] == [str(d) for d in range(10)]
        total = sum(map(sum, cm["matrix"]))
        assert total == 64  # every test sample once (rows: true digit, columns: predicted digit)
        assert sum(cm["matrix"][i][i] for i in range(10)) / total == pytest.approx(result["metrics"][task]["acc"])
    # the Kubeflow UI reads the chosen task's matrix from the ClassificationMetrics metadata
    ui = out["confusion"].metadata["confusionMatrix"]
    assert out["confusion"].metadata["task"] == "right"
    assert [s["displayName"] for s in ui["annotationSpecs"]] == [str(d) for d in range(10)]
    assert [r["row"] for r in ui["rows"]] == result["confusion_matrices"]["right"]["matrix"]
    assert json.loads(Path(out["confusion"].path).read_text()) == result["confusion_matrices"]
    summary = Path(out["summary"].path).read_text()
    assert "## Confusion matrix: left" in summary and "## Confusion matrix: right" in summary
    assert f"{result['metrics']['left']['acc']:.4g}" in summary


def test_unknown_confusion_task_is_rejected(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    with pytest.raises(InvalidParameterError, match="valid: left, right"):
        evaluate.python_func(data=data, run=tiny_runs["ls"]["run"], split="test", confusion_task="middle",
                             **_outputs(tmp_path))
