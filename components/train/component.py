"""train: one method, one seed (or one single-task reference) on a prepared Dataset."""

from kfp import dsl

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train(data: dsl.Input[dsl.Dataset], run_spec: str, epochs: int, train_options: dict,
          run: dsl.Output[dsl.Artifact], model: dsl.Output[dsl.Model], metrics: dsl.Output[dsl.Metrics]):
    """Train the run described by ``run_spec`` (JSON from plan_runs/plan_references).

    Refuses to train when the data's content hash differs from the one recorded by prepare_data.
    Writes the run directory (run.json, metrics.json, checkpoint, model) as ``run``, the weights as
    ``model`` and the selected final test metrics as ``metrics``.
    """
    import json
    import shutil

    from mtlflow import jobs
    from mtlflow.pipeline_specs import from_struct

    spec = json.loads(run_spec)
    train_options = from_struct(train_options)
    result = jobs.train(data.path, run.path, method=spec["method"], seed=int(spec["seed"]),
                        hparams=spec.get("hparams", {}), tasks=spec.get("tasks"), epochs=epochs,
                        expected_hash=data.metadata.get("content_hash"), progress=False, **train_options)
    shutil.copyfile(f"{run.path}/model.pt", model.path)
    label = jobs.run_label(jobs.read_run(run.path)["run"])
    for artifact in (run, model):
        artifact.metadata.update({"method": spec["method"], "label": label, "seed": int(spec["seed"]),
                                  "tasks": spec.get("tasks") or data.metadata.get("tasks"),
                                  "data_hash": data.metadata.get("content_hash")})
    final = result["final"]["test"]
    for task, values in final.items():
        for name, value in values.items():
            metrics.log_metric(f"test.{task}.{name}", float(value))
    with open(metrics.path, "w") as fh:
        json.dump(final, fh)
