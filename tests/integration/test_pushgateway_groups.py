"""Stale Pushgateway groups are deleted (issue 30, item 9), on a real Debian prometheus-pushgateway of this
module's own (the session's gateway holds other tests' groups, which an expiry must not touch): a killed run's
training group, which would report ``mtlflow_train_running 1`` for ever, goes after 6 h without a push; the
pipeline-level groups after 7 days; other jobs' groups never; the exit handler (record_status) does it."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import pytest
from kfp import dsl
from prometheus_client import CollectorRegistry, Gauge, pushadd_to_gateway
from prometheus_support import GATEWAY_BINARY, ensure_prometheus_binaries, free_port

from mtlflow.ops.observability import catalog, groups

pytestmark = pytest.mark.integration

TRAINING = {"pipeline": "benchmark_sweep", "benchmark": "multimnist", "method": "mgda", "seed": "0", "tasks": "all",
            "run": "mgda-s0-0123456789abcdef"}
STATUS = {"pipeline": "benchmark_sweep", "run": "nightly-1"}
OTHER = {"instance": "batch-exporter"}


@pytest.fixture
def gateway(tmp_path):
    ensure_prometheus_binaries()
    port = free_port()
    # a persistence file of the test's own: Debian's build persists to /var/lib/prometheus by default
    proc = subprocess.Popen([GATEWAY_BINARY, f"--web.listen-address=127.0.0.1:{port}",
                             f"--persistence.file={tmp_path / 'pushgateway.data'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            if urllib.request.urlopen(f"{url}/-/ready", timeout=1).status == 200:
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("the Pushgateway did not become ready")
            time.sleep(0.05)
    yield url
    os.kill(proc.pid, 15)
    proc.wait(timeout=10)


def push(url: str, job: str, key: dict, name: str, value: float) -> None:
    registry = CollectorRegistry()
    Gauge(name, "test", registry=registry).set(value)
    pushadd_to_gateway(url, job=job, registry=registry, grouping_key=key, timeout=5)


def keys(url: str) -> set[tuple[str, tuple]]:
    return {(g.job, tuple(sorted(g.grouping_key.items()))) for g in groups.list_groups(url)}


def test_stale_groups_are_deleted_by_age_and_job(gateway):
    push(gateway, catalog.TRAIN_JOB, TRAINING, "mtlflow_train_running", 1)  # a run killed while training
    push(gateway, catalog.PIPELINE_JOB, STATUS, "mtlflow_pipeline_last_run_succeeded", 1)
    push(gateway, "someone_else", OTHER, "batch_last_success", 1)
    listed = {g.job: g for g in groups.list_groups(gateway)}
    assert dict(listed[catalog.TRAIN_JOB].grouping_key) == TRAINING
    assert abs(listed[catalog.TRAIN_JOB].pushed_unix - time.time()) < 60
    everything = keys(gateway)
    assert len(everything) == 3

    assert groups.expire_stale_groups(gateway, now=time.time() + 5 * 3600) == []  # a live run pushes each epoch
    assert keys(gateway) == everything
    deleted = groups.expire_stale_groups(gateway, now=time.time() + groups.TRAINING_GROUP_MAX_AGE + 60)
    assert [(g.job, dict(g.grouping_key)) for g in deleted] == [(catalog.TRAIN_JOB, TRAINING)]
    assert "mtlflow_train_running" not in urllib.request.urlopen(f"{gateway}/metrics").read().decode()
    deleted = groups.expire_stale_groups(gateway, now=time.time() + groups.PIPELINE_GROUP_MAX_AGE + 60)
    assert [(g.job, dict(g.grouping_key)) for g in deleted] == [(catalog.PIPELINE_JOB, STATUS)]
    assert keys(gateway) == {("someone_else", tuple(sorted(OTHER.items())))}


def test_the_exit_handler_expires_a_killed_runs_group(gateway, tmp_path, monkeypatch):
    from mtlflow.components.record_status.component import record_status

    push(gateway, catalog.TRAIN_JOB, TRAINING, "mtlflow_train_running", 1)
    later = time.time() + groups.TRAINING_GROUP_MAX_AGE + 60  # the exit handler of a run 6 h later
    monkeypatch.setattr(groups.time, "time", lambda: later)
    status = dsl.PipelineTaskFinalStatus(state="SUCCEEDED", pipeline_job_resource_name="r",
                                         pipeline_task_name="exit-handler-1", error_code=None, error_message=None)
    record_status.python_func(status=status, pipeline="benchmark_sweep", job_name="nightly-2",
                              status_dir=str(tmp_path), pushgateway=gateway)
    # the killed run's group is gone; the status this exit handler pushed stays
    assert keys(gateway) == {(catalog.PIPELINE_JOB, (("pipeline", "benchmark_sweep"), ("run", "nightly-2")))}
