"""record_status: the exit handler of every pipeline -- records how the run ended, always."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_status(status: dsl.PipelineTaskFinalStatus, pipeline: str, job_name: str, status_dir: str,
                  pushgateway: str = "") -> str:
    """Write ``<status_dir>/<job_name>.json`` with the final state (SUCCEEDED/FAILED/...), the error
    and the time; runs after the pipeline's tasks whether they succeeded or not. Returns the path.

    With ``pushgateway`` (else ``$MTLFLOW_PUSHGATEWAY``; neither: off) the final state is also pushed to
    Prometheus (``mtlflow_pipeline_last_run_succeeded`` and friends, grouped by pipeline only)."""
    import json

    from mtlflow.ops import run_status
    from mtlflow.ops.observability import export_run_status

    path = run_status.record(status_dir, pipeline=pipeline, job_name=job_name, state=status.state,
                             error_code=status.error_code, error_message=status.error_message,
                             exit_handler_task=status.pipeline_task_name,
                             resource_name=status.pipeline_job_resource_name)
    finished = json.loads(path.read_text())["finished_unix"]
    export_run_status(pushgateway or None, pipeline=pipeline, run=job_name, state=status.state, finished_unix=finished)
    print(f"pipeline {pipeline} run {job_name} ended {status.state}; recorded in {path}")
    return str(path)
