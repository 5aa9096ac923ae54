"""evaluate: metrics of a trained run on a split of its prepared data.

The aggregate's paired comparisons over test examples do not read this output: each method's run artifact
already carries its test evaluation with every example's error (``test_evaluation.json`` and
``test_evaluation.per_example.npz``, kept by the ``train`` step), so the ``aggregate`` step that collects the
runs has them (docs/guides/reading-the-report.md).
"""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(data: dsl.Input[dsl.Dataset], run: dsl.Input[dsl.Artifact], split: str,
             evaluation: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics],
             confusion: dsl.Output[dsl.ClassificationMetrics], summary: dsl.Output[dsl.Markdown],
             confusion_task: str = ""):
    """Evaluate ``run``'s final model on ``split``; fails if the data version differs.

    Writes the metrics (``evaluation``, scalars in ``metrics``), the confusion matrices of every
    classification task (``evaluation.json`` and the ``confusion`` file), and a Markdown summary with
    the metrics and the matrices. The Kubeflow UI draws one matrix per ClassificationMetrics artifact:
    ``confusion_task``'s, by default the first classification task's.

    Args:
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        run: the run directory (run.json, metrics.json, model.pt, report)
        split: ``val`` or ``test``
        evaluation: evaluation JSON (metrics, confusion matrices)
        metrics: the split's metrics, shown in the Kubeflow UI
        confusion: the confusion matrix the Kubeflow UI draws
        summary: Markdown summary (metrics and matrices)
        confusion_task: classification task whose confusion matrix the UI shows (default: the first)
    """
    import json

    from mtlflow.jobs import pipeline_steps

    result = pipeline_steps.evaluate(run.path, data.path, split, evaluation.path, confusion.path, summary.path,
                                     confusion_task)
    evaluation.metadata.update(result["metadata"])
    for name, value in pipeline_steps.flat_metrics(split, result["metrics"]).items():
        metrics.log_metric(name, value)
    with open(metrics.path, "w") as fh:
        fh.write(json.dumps(result["metrics"]))
    if result["confusion"]:
        shown = result["confusion"]
        confusion.log_confusion_matrix(shown["categories"], shown["matrix"])
        confusion.metadata.update({"task": shown["task"], "split": split})
