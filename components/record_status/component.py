"""record_status: the exit handler of every pipeline -- records how the run ended, always."""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"
SERVICES = ("Prometheus Pushgateway (optional: the final state, and the deletion of this run's groups)",)


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
    groups not pushed to for 6 h and pipeline-level ones after 7 days (:mod:`mtlflow.ops.observability.groups`).

    Args:
        status: the pipeline's final status (set by the exit handler)
        pipeline: pipeline name
        job_name: job or run name
        status_dir: where status records are written
        pushgateway: Prometheus Pushgateway URL for telemetry (default ``$MTLFLOW_PUSHGATEWAY``; empty: off)
        scrape_grace_seconds: a training group of this run is deleted no sooner than this after its last push
            (two scrape intervals)

    Returns:
        the path of the status record
    """
    from mtlflow.jobs.exit_handler import record_status as record

    return record(status_dir, pipeline, job_name, status.state, status.error_code, status.error_message,
                  status.pipeline_task_name, status.pipeline_job_resource_name, pushgateway, scrape_grace_seconds)
