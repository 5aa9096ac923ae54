"""evaluate: metrics of a trained run on a split of its prepared data."""

from kfp import dsl

from mtlflow.components.image import IMAGE


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
