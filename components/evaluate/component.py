"""evaluate: metrics of a trained run on a split of its prepared data."""

from kfp import dsl

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(data: dsl.Input[dsl.Dataset], run: dsl.Input[dsl.Artifact], split: str,
             evaluation: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics]):
    """Evaluate ``run``'s final model on ``split``; fails if the data version differs."""
    import json

    from mtlflow import jobs

    result = jobs.evaluate(run.path, data.path, split=split, out_file=evaluation.path)
    evaluation.metadata.update({"split": split, "method": result["method"], "data_hash": result["data_hash"]})
    for task, values in result["metrics"].items():
        for name, value in values.items():
            metrics.log_metric(f"{split}.{task}.{name}", float(value))
    with open(metrics.path, "w") as fh:
        json.dump(result["metrics"], fh)
