"""train: one method, one seed (or one single-task reference) on a prepared Dataset.

The work is :func:`mtlflow.jobs.pipeline_steps.train`, and whether the run converged comes from
:func:`mtlflow.jobs.step_outputs.convergence_outputs`; the component copies their results into its outputs.
"""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"
SERVICES = ("Prometheus Pushgateway (optional: the epoch telemetry)",)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train(data: dsl.Input[dsl.Dataset], run_spec: str, epochs: int, train_options: dict,
          run: dsl.Output[dsl.Artifact], model: dsl.Output[dsl.Model], metrics: dsl.Output[dsl.Metrics],
          report: dsl.Output[dsl.HTML], summary: dsl.Output[dsl.Markdown],
          checkpoint_root: str = "", pushgateway: str = "", pipeline_name: str = "", pipeline_run: str = ""):
    """Train the run described by ``run_spec`` (JSON from plan_runs/plan_references/plan_run).

    Refuses to train when the data's SHA-256 content hash or DVC hash differs from the ones recorded
    by prepare_data. With ``checkpoint_root`` (a PVC on the cluster) the run directory lives at
    ``<checkpoint_root>/<run key>`` -- the key hashes the task's inputs only (the spec, the data's
    content hash, the epochs and the options; no run id) -- so a finished run of the same inputs, from
    this or any earlier pipeline run, is reused without training; a run that stopped with an error is
    trained again from scratch; a retried or preempted task resumes from the checkpoint there. The
    run is then copied to the ``run`` artifact (without the checkpoint). Writes the run directory as
    ``run``, the weights as ``model``, the selected final test metrics as ``metrics``, the run's HTML
    report (metrics, learning curves, telemetry) as ``report`` and a Markdown summary as ``summary``.

    Whether the run converged (its validation score stopped improving before the budget ran out) is the
    logged metric ``converged`` (1 or 0) and the ``convergence`` metadata of ``run`` and ``model`` ("not
    converged: train longer ..." otherwise), from ``run.json``; a run that did not converge prints it to the log.

    ``train_options`` are RunConfig fields by name; with ``teleport: cost`` (and ``teleport_options``) COST
    wraps the method, except in single-task references.

    With ``pushgateway`` (else ``$MTLFLOW_PUSHGATEWAY`` of the pod; neither: off) the epoch telemetry is
    pushed to that Prometheus Pushgateway, labelled with ``pipeline_name`` and the run key (``run``), grouped
    also by ``pipeline_run`` (the pipeline run's name: the pipeline's exit handler deletes the group by it when
    the run ends); a push failure only logs a warning. A reused run pushes nothing.

    Args:
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        run_spec: one run as JSON: ``{"method", "seed", "hparams"[, "tasks", "reference"]}`` (from the plan
            components)
        epochs: training epochs
        train_options: RunConfig fields (``mtlflow config schema``), e.g. ``{batch_size: 256, device: auto,
            teleport: cost}``; a reference drops ``teleport`` and ``teleport_options``
        run: the run directory (run.json, metrics.json, model.pt, report)
        model: the trained weights (model.pt)
        metrics: the selected final test metrics (and ``converged``), shown in the Kubeflow UI
        report: the run's HTML report
        summary: the run's Markdown summary
        checkpoint_root: a PVC path: the run directory lives at ``<root>/<run key>``; a finished run there is
            reused, a failed one retrained, an interrupted one resumed
        pushgateway: Prometheus Pushgateway URL for telemetry (default ``$MTLFLOW_PUSHGATEWAY``; empty: off)
        pipeline_name: the ``pipeline`` label of the pushed metrics
        pipeline_run: the pipeline run's name, added to the Pushgateway grouping key (the exit handler deletes
            the group by it)
    """
    import json

    from mtlflow.jobs import pipeline_steps
    from mtlflow.jobs.step_outputs import convergence_outputs

    result = pipeline_steps.train(data.path, dict(data.metadata), run.path, model.path, report.path, summary.path,
                                  run_spec, epochs, train_options, checkpoint_root, pushgateway, pipeline_name,
                                  pipeline_run)
    training = convergence_outputs(run.path)
    for artifact in (run, model):
        artifact.metadata.update({**result["metadata"], **training["metadata"]})
    for name, value in {**pipeline_steps.flat_metrics("test", result["metrics"]), **training["metrics"]}.items():
        metrics.log_metric(name, value)
    if training["warning"]:
        print(f"mtlflow: warning: {training['warning']}")
    with open(metrics.path, "w") as fh:
        fh.write(json.dumps(result["metrics"]))
