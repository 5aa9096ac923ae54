"""Pushgateway groups that no run updates any more: listing mtlflow's groups with the time of their last push,
and deleting the stale ones.

A Pushgateway keeps every group until it is deleted, so without this the groups grow with every training
run and a run that was killed (OOM, preemption, a cancelled pipeline run) keeps ``mtlflow_train_running 1``
for ever. :func:`expire_stale_groups` deletes the training groups not pushed to for ``max_age_seconds`` --
a live run pushes at least at every epoch's end -- and the pipeline-level groups (status, comparison, gate)
after a longer age; the exit handler of every pipeline calls it (``record_status``). Like the pushes, it
never fails the caller: an unreachable gateway logs one warning.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from dataclasses import dataclass
from typing import Mapping

from mtlflow.ops.observability import catalog
from mtlflow.ops.observability.prometheus import DEFAULT_PUSH_TIMEOUT

log = logging.getLogger("mtlflow.ops.observability.groups")

#: a training group not pushed to for this long belongs to a run that is gone (a live one pushes every epoch;
#: the stalled-training alert stops at the same age)
TRAINING_GROUP_MAX_AGE = 6 * 3600
#: status, comparison and gate groups: kept for a week, so the failed-run alert can compare with past runs
PIPELINE_GROUP_MAX_AGE = 7 * 24 * 3600


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
