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

    from mtlflow import jobs
    from mtlflow.core import atomic
    from mtlflow.core.errors import InvalidParameterError
    from mtlflow.ops.observability.run_report import evaluation_markdown

    result = jobs.evaluate(run.path, data.path, split=split, out_file=evaluation.path, confusion=True)
    evaluation.metadata.update({"split": split, "method": result["method"], "data_hash": result["data_hash"]})
    for task, values in result["metrics"].items():
        for name, value in values.items():
            metrics.log_metric(f"{split}.{task}.{name}", float(value))
    atomic.write_text(metrics.path, json.dumps(result["metrics"]))
    matrices = result["confusion_matrices"]
    if confusion_task and confusion_task not in matrices:
        raise InvalidParameterError(f"confusion_task {confusion_task!r} is not a classification task of this run; "
                                    f"valid: {', '.join(matrices) or 'none'}")
    shown = confusion_task or next(iter(matrices), "")
    if shown:
        confusion.log_confusion_matrix(matrices[shown]["categories"], matrices[shown]["matrix"])
        confusion.metadata.update({"task": shown, "split": split})
    atomic.write_text(confusion.path, json.dumps(matrices))
    atomic.write_text(summary.path, evaluation_markdown(result))
