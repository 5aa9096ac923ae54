"""train: one method, one seed (or one single-task reference) on a prepared Dataset."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train(data: dsl.Input[dsl.Dataset], run_spec: str, epochs: int, train_options: dict,
          run: dsl.Output[dsl.Artifact], model: dsl.Output[dsl.Model], metrics: dsl.Output[dsl.Metrics],
          report: dsl.Output[dsl.HTML], summary: dsl.Output[dsl.Markdown],
          checkpoint_root: str = "", pushgateway: str = "", pipeline_name: str = "", run_id: str = "",
          teleport: str = "", teleport_options: dict = {}):
    """Train the run described by ``run_spec`` (JSON from plan_runs/plan_references/plan_run).

    Refuses to train when the data's SHA-256 content hash or DVC hash differs from the ones recorded
    by prepare_data. With ``checkpoint_root`` (a PVC on the cluster) the run directory lives at
    ``<checkpoint_root>/<run key>`` -- the key hashes the spec, the data version, the epochs, the
    options and ``run_id`` (the pipeline run's id) -- and training resumes from the checkpoint there,
    so a retried or preempted task continues where it stopped and another pipeline run starts afresh; the finished run is then copied to the ``run`` artifact (without the
    checkpoint). Writes the run directory as ``run``, the weights as ``model``, the selected final
    test metrics as ``metrics``, the run's HTML report (metrics, learning curves, telemetry) as
    ``report`` and a Markdown summary as ``summary``.

    ``teleport`` (``cost``) wraps the method in COST's symmetry teleportation with ``teleport_options``.

    With ``pushgateway`` (else ``$MTLFLOW_PUSHGATEWAY`` of the pod; neither: off) the epoch telemetry is
    pushed to that Prometheus Pushgateway, labelled with ``pipeline_name``; a push failure only logs a
    warning.
    """
    import json
    import shutil
    from pathlib import Path

    from mtlflow import jobs
    from mtlflow.config.pipeline import from_struct, run_key
    from mtlflow.core import atomic
    from mtlflow.ops import dvc as dvc_io
    from mtlflow.ops.observability import training_exporters
    from mtlflow.ops.observability.run_report import run_markdown, run_report_html

    spec = json.loads(run_spec)
    train_options = from_struct(train_options)
    if teleport:  # COST etc. (mtlflow.teleport): part of the run, so also of its run key and label
        train_options = {**train_options, "teleport": teleport, "teleport_options": from_struct(dict(teleport_options))}
    content_hash = data.metadata.get("content_hash")
    if data.metadata.get("dvc_hash"):
        dvc_io.verify_directory(data.path, data.metadata["dvc_hash"])
    work_dir = Path(run.path)
    if checkpoint_root:
        work_dir = Path(checkpoint_root) / run_key(run_spec, content_hash or "", epochs, train_options, run_id)
        print(f"run directory {work_dir} (resumes from its checkpoint if one exists)")
    with training_exporters(pushgateway=pushgateway or None, pipeline=pipeline_name or "kfp") as callbacks:
        result = jobs.train(data.path, work_dir, method=spec["method"], seed=int(spec["seed"]),
                            hparams=spec.get("hparams", {}), tasks=spec.get("tasks"), epochs=epochs,
                            expected_hash=content_hash, resume=bool(checkpoint_root), progress=False,
                            callbacks=callbacks, **train_options)
    if work_dir != Path(run.path):
        shutil.copytree(work_dir, run.path, ignore=shutil.ignore_patterns("checkpoint.pt", ".mtlflow.lock"), dirs_exist_ok=True)
    shutil.copyfile(f"{run.path}/model.pt", model.path)
    label = jobs.run_label(jobs.read_run(run.path)["run"])
    for artifact in (run, model):
        artifact.metadata.update({"method": spec["method"], "label": label, "seed": int(spec["seed"]),
                                  "tasks": spec.get("tasks") or data.metadata.get("tasks"),
                                  "data_hash": content_hash, "dvc_hash": data.metadata.get("dvc_hash")})
    final = result["final"]["test"]
    for task, values in final.items():
        for name, value in values.items():
            metrics.log_metric(f"test.{task}.{name}", float(value))
    with open(metrics.path, "w") as fh:
        json.dump(final, fh)
    atomic.write_text(report.path, run_report_html(run.path))
    atomic.write_text(summary.path, run_markdown(run.path))
