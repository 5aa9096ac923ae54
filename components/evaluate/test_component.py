import json
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow import jobs
from mtlflow.components.evaluate.component import evaluate
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import pipeline_steps
from mtlflow.metrics.evaluation import read_examples


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


def test_a_sweep_run_keeps_its_per_example_test_errors_and_the_aggregate_pairs_them(tiny_runs, tiny_dataset,
                                                                                    tmp_path):
    """The train step keeps each method run's test evaluation with every example's error in the run artifact
    (what the aggregate reads); its metrics are the evaluate component's, and the aggregate's comparisons of
    two methods pair over those examples."""

    data, _ = tiny_dataset
    for name in ("ls", "mgda"):
        run_dir = Path(tiny_runs[name]["run"].path)
        kept = json.loads((run_dir / jobs.split_evaluation_name("test")).read_text())
        assert kept["split"] == "test" and kept["per_example"]["examples"] == 64
        errors = read_examples(run_dir / kept["per_example"]["file"])
        out = _outputs(tmp_path / name)
        (tmp_path / name).mkdir()
        evaluate.python_func(data=data, run=tiny_runs[name]["run"], split="test", **out)
        evaluated = json.loads(Path(out["evaluation"].path).read_text())["metrics"]
        for task in ("left", "right"):
            assert kept["metrics"][task] == evaluated[task]
            assert 1 - errors[task]["error"].mean() == pytest.approx(evaluated[task]["acc"], abs=1e-12)
    runs = [jobs.read_run(tiny_runs[name]["run"].path) for name in ("ls", "mgda")]
    paired = jobs.summarise(runs, [], paper_references=False).methods["mgda"].versus["ls"].paired
    assert paired.available and paired.n == 64 and paired.seeds == (1, 1)
    # the aggregate step hands the paired verdict to the Kubeflow UI with the verdict over seeds

    outcome = pipeline_steps.aggregate([tiny_runs[n]["run"].path for n in ("ls", "mgda")], [], ["ls", "mgda"],
                                       str(tmp_path / "results"), str(tmp_path / "report.html"),
                                       str(tmp_path / "summary.md"))
    assert outcome["metadata"]["paired_verdicts_vs_ls"] == {"mgda": paired.combined.verdict}
