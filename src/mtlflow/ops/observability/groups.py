"""Pushgateway groups that no run updates any more: listing mtlflow's groups with the time of their last push,
deleting a finished pipeline run's training groups, and deleting the stale ones.

A Pushgateway keeps every group until it is deleted, so without this the groups grow with every training
run and a run that was killed (OOM, preemption, a cancelled pipeline run) keeps ``mtlflow_train_running 1``
for ever. The exit handler of every pipeline (``record_status``) calls both:

* :func:`delete_pipeline_run_groups` deletes the training groups of its own pipeline run -- those whose
  grouping key carries ``pipeline_run=<the run's name>`` (``catalog.PIPELINE_RUN_LABEL``: pushed by every
  ``train`` task and by rank 0 of a TrainJob) -- once each has been on the gateway for a scrape interval
  after its last push, so Prometheus has scraped its final values; other runs' groups, the pipeline status
  group (the failed-run alert reads it), the comparison and gate groups stay;
* :func:`expire_stale_groups` deletes the training groups not pushed to for ``max_age_seconds`` -- a live run
  pushes at least at every epoch's end; this catches runs that no exit handler covers (command line, a
  pipeline whose exit handler never ran) -- and the pipeline-level groups (status, comparison, gate) after a
  longer age.

Like the pushes, neither fails the caller: an unreachable gateway logs one warning.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from mtlflow.ops.observability import catalog
from mtlflow.ops.observability.prometheus import DEFAULT_PUSH_TIMEOUT

log = logging.getLogger("mtlflow.ops.observability.groups")

#: a training group not pushed to for this long belongs to a run that is gone (a live one pushes every epoch;
#: the stalled-training alert stops at the same age)
TRAINING_GROUP_MAX_AGE = 6 * 3600
#: status, comparison and gate groups: kept for a week, so the failed-run alert can compare with past runs
PIPELINE_GROUP_MAX_AGE = 7 * 24 * 3600
#: a finished run's training group stays this long after its last push before the exit handler deletes it:
#: two scrape intervals of k8s/monitoring (30 s), so one missed scrape still leaves one that sees the final values
SCRAPE_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class Group:
    """One Pushgateway group: its job, grouping key (the other labels) and last push (Unix seconds)."""

    job: str
    grouping_key: Mapping[str, str]
    pushed_unix: float


def _url(gateway: str) -> str:
    return gateway if "://" in gateway else f"http://{gateway}"


def list_groups(gateway: str, timeout: float = DEFAULT_PUSH_TIMEOUT) -> list[Group]:
    """Every group of the gateway (``/api/v1/metrics``)."""
    with urllib.request.urlopen(f"{_url(gateway).rstrip('/')}/api/v1/metrics", timeout=timeout) as response:
        data = json.loads(response.read())["data"]
    groups = []
    for entry in data:
        labels = dict(entry["labels"])
        job = labels.pop("job")
        pushed = entry.get("push_time_seconds", {}).get("metrics") or [{"value": "0"}]
        groups.append(Group(job, labels, float(pushed[0]["value"])))
    return groups


def delete_group(gateway: str, group: Group, timeout: float = DEFAULT_PUSH_TIMEOUT) -> None:
    from prometheus_client import delete_from_gateway

    delete_from_gateway(_url(gateway), job=group.job, grouping_key=dict(group.grouping_key), timeout=timeout)


def expire_stale_groups(gateway: str, training_max_age: float = TRAINING_GROUP_MAX_AGE,
                        pipeline_max_age: float = PIPELINE_GROUP_MAX_AGE, now: float | None = None,
                        timeout: float = DEFAULT_PUSH_TIMEOUT) -> list[Group]:
    """Delete mtlflow's groups last pushed longer ago than their maximum age (training groups
    ``training_max_age``, pipeline-level ones ``pipeline_max_age``); other jobs' groups are left alone.
    Returns the deleted groups; a gateway that cannot be reached logs one warning and deletes nothing."""
    max_age = {catalog.TRAIN_JOB: training_max_age, catalog.AGGREGATE_JOB: pipeline_max_age,
               catalog.PIPELINE_JOB: pipeline_max_age, catalog.GATE_JOB: pipeline_max_age}
    now = time.time() if now is None else now
    deleted: list[Group] = []
    try:
        for group in list_groups(gateway, timeout):
            if group.job in max_age and now - group.pushed_unix > max_age[group.job]:
                delete_group(gateway, group, timeout)
                deleted.append(group)
    except Exception as exc:  # monitoring housekeeping must never fail a pipeline's exit handler
        log.warning("could not expire stale groups on the Pushgateway %s (%s: %s)", gateway, type(exc).__name__, exc)
    return deleted


def delete_pipeline_run_groups(gateway: str, pipeline_run: str, scrape_grace: float = SCRAPE_GRACE_SECONDS,
                               now: float | None = None, timeout: float = DEFAULT_PUSH_TIMEOUT,
                               sleep=time.sleep) -> list[Group]:
    """Delete the training groups of pipeline run ``pipeline_run`` (grouping key ``pipeline_run`` equal to it),
    each no sooner than ``scrape_grace`` seconds after its last push (this waits for the youngest, at most
    ``scrape_grace``). Returns the deleted groups; an unreachable gateway logs one warning and deletes nothing."""
    if not pipeline_run:
        raise ValueError("delete_pipeline_run_groups needs the pipeline run's name")
    deleted: list[Group] = []
    try:
        own = [g for g in list_groups(gateway, timeout)
               if g.job == catalog.TRAIN_JOB and g.grouping_key.get(catalog.PIPELINE_RUN_LABEL) == pipeline_run]
        if own:
            wait = max(g.pushed_unix for g in own) + scrape_grace - (time.time() if now is None else now)
            if wait > 0:
                sleep(min(wait, scrape_grace))
        for group in own:
            delete_group(gateway, group, timeout)
            deleted.append(group)
    except Exception as exc:  # monitoring housekeeping must never fail a pipeline's exit handler
        log.warning("could not delete the training groups of pipeline run %s on the Pushgateway %s (%s: %s)",
                    pipeline_run, gateway, type(exc).__name__, exc)
    return deleted
