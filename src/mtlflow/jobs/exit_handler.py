"""The exit handler behind the ``record_status`` component: record how a pipeline run ended, push it, and
clean the Prometheus Pushgateway of this run's training groups and of every stale group.
No kfp import here: the component passes the fields of its ``PipelineTaskFinalStatus``."""

from __future__ import annotations

from mtlflow.jobs import pipeline_steps
from mtlflow.ops.observability import resolve_pushgateway
from mtlflow.ops.observability.groups import SCRAPE_GRACE_SECONDS, delete_pipeline_run_groups, expire_stale_groups


def record_status(status_dir: str, pipeline: str, job_name: str, state: str, error_code: int | None,
                  error_message: str | None, exit_handler_task: str, resource_name: str, pushgateway: str = "",
                  scrape_grace_seconds: float = SCRAPE_GRACE_SECONDS) -> str:
    """Write ``<status_dir>/<job_name>.json`` and push the final state (:func:`pipeline_steps.record_status`);
    then, with a gateway (``pushgateway``, else ``$MTLFLOW_PUSHGATEWAY``), delete the training groups of this
    pipeline run (grouping key ``pipeline_run=<job_name>``) once ``scrape_grace_seconds`` have passed since
    their last push, and the gateway's stale groups (:mod:`mtlflow.ops.observability.groups`); each deleted
    group is printed. Returns the record's path."""
    path = pipeline_steps.record_status(status_dir, pipeline, job_name, state, error_code, error_message,
                                        exit_handler_task, resource_name, pushgateway)
    gateway = resolve_pushgateway(pushgateway)
    if gateway:
        for group in delete_pipeline_run_groups(gateway, job_name, scrape_grace=scrape_grace_seconds):
            print(f"deleted the training group {dict(group.grouping_key)} of this pipeline run")
        for group in expire_stale_groups(gateway):
            print(f"deleted the stale Pushgateway group {group.job} {dict(group.grouping_key)}")
    return path
