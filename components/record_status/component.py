"""record_status: the exit handler of every pipeline -- records how the run ended, always."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_status(status: dsl.PipelineTaskFinalStatus, pipeline: str, job_name: str, status_dir: str,
                  pushgateway: str = "", scrape_grace_seconds: float = 60.0) -> str:
    """Write ``<status_dir>/<job_name>.json`` with the final state (SUCCEEDED/FAILED/...), the error
    and the time; runs after the pipeline's tasks whether they succeeded or not. Returns the path.

    With ``pushgateway`` (else ``$MTLFLOW_PUSHGATEWAY``; neither: off) the final state is also pushed to
    Prometheus (``mtlflow_pipeline_last_run_succeeded`` and friends, grouped by pipeline and run); then the
    training groups of this pipeline run (grouping key ``pipeline_run=<job_name>``: every training task's,
    a TrainJob's rank 0's; a killed one's would report running for ever) are deleted once
    ``scrape_grace_seconds`` have passed since their last push, so Prometheus keeps their final values; other
    runs' groups and this run's status group stay. Last, the gateway's stale groups are deleted: training
    groups not pushed to for 6 h and pipeline-level ones after 7 days (:mod:`mtlflow.ops.observability.groups`)."""
    from mtlflow.jobs import pipeline_steps
    from mtlflow.ops.observability import resolve_pushgateway
    from mtlflow.ops.observability.groups import delete_pipeline_run_groups, expire_stale_groups

    path = pipeline_steps.record_status(status_dir, pipeline, job_name, status.state, status.error_code,
                                        status.error_message, status.pipeline_task_name,
                                        status.pipeline_job_resource_name, pushgateway)
    gateway = resolve_pushgateway(pushgateway)
    if gateway:
        for group in delete_pipeline_run_groups(gateway, job_name, scrape_grace=scrape_grace_seconds):
            print(f"deleted the training group {dict(group.grouping_key)} of this pipeline run")
        for group in expire_stale_groups(gateway):
            print(f"deleted the stale Pushgateway group {group.job} {dict(group.grouping_key)}")
    return path
