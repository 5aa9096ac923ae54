"""Pushgateway groups are deleted (issue 30, item 9), on a real Debian prometheus-pushgateway of this module's
own (the session's gateway holds other tests' groups, which an expiry must not touch): a pipeline run's exit
handler (record_status) deletes the training groups of its own run -- pushed by the train component and by the
command line a TrainJob's rank 0 runs -- and no other run's; a killed run's training group, which would report
``mtlflow_train_running 1`` for ever, goes after 6 h without a push; the pipeline-level groups after 7 days;
other jobs' groups never."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest
from kfp import dsl
from prometheus_client import CollectorRegistry, Gauge, pushadd_to_gateway

from mtlflow.ops.observability import catalog, groups
from prometheus_support import GATEWAY_BINARY, ensure_prometheus_binaries, free_port

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


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    """The analytic toy problem through the prepare_data component: a training takes well under a second."""
    from mtlflow.components.prepare_data.component import prepare_data

    data = dsl.Dataset(uri=str(tmp_path_factory.mktemp("artifacts") / "data"))
    prepare_data.python_func(benchmark="toy", data_options={"steps_per_epoch": 5}, data=data)
    return data


def training_groups(url: str) -> list[tuple[str, str]]:
    """(pipeline_run, run) of every training group on the gateway (pipeline_run "" when it has none): A's and
    B's train tasks of the same inputs share a run key, their pipeline_run tells them apart."""
    return sorted((g.grouping_key.get(catalog.PIPELINE_RUN_LABEL, ""), g.grouping_key["run"])
                  for g in groups.list_groups(url) if g.job == catalog.TRAIN_JOB)


def test_the_exit_handler_deletes_exactly_its_own_pipeline_runs_training_groups(gateway, toy_data, tmp_path):
    """Pipeline runs A and B each push training groups -- A from two train tasks (one a single-task reference)
    and from a TrainJob's rank 0 (``mtlflow train --pipeline-run``), B from one train task -- next to a
    command-line run's and both runs' status groups. A's exit handler deletes A's three training groups only."""
    from mtlflow.cli import main
    from mtlflow.components.conftest import train_artifacts
    from mtlflow.components.record_status.component import record_status
    from mtlflow.components.train.component import train

    def train_task(pipeline_run: str, spec: dict, name: str) -> None:
        train.python_func(data=toy_data, run_spec=json.dumps(spec), epochs=1, train_options={"max_steps_per_epoch": 2},
                          pushgateway=gateway, pipeline_name="benchmark_sweep", pipeline_run=pipeline_run,
                          **train_artifacts(tmp_path, name))

    train_task("sweep-a", {"method": "ls", "seed": 0, "hparams": {}}, "a-ls")
    train_task("sweep-a", {"method": "ls", "seed": 0, "hparams": {}, "tasks": ["f1"]}, "a-ref")
    train_task("sweep-b", {"method": "ls", "seed": 0, "hparams": {}}, "b-ls")
    for pipeline_run, out in (("sweep-a", "a-rank0"), ("", "cli")):  # a TrainJob's rank 0 of A; a run of one's own
        flags = ["--pipeline-run", pipeline_run] if pipeline_run else []
        assert main(["train", "--data", toy_data.path, "--method", "mgda", "--epochs", "1", "--max-steps-per-epoch",
                     "2", "--no-progress", "--pushgateway", gateway, *flags, "--out", str(tmp_path / out)]) == 0
    push(gateway, catalog.PIPELINE_JOB, {"pipeline": "benchmark_sweep", "run": "sweep-b"},
         "mtlflow_pipeline_last_run_succeeded", 1)
    before = training_groups(gateway)
    assert [owner for owner, _ in before] == ["", "sweep-a", "sweep-a", "sweep-a", "sweep-b"]
    # the gateway adds the grouping key's pipeline_run to every series of the group, for Prometheus to see
    exposed = urllib.request.urlopen(f"{gateway}/metrics").read().decode()
    assert exposed.count('mtlflow_train_running{') == 5 and exposed.count('pipeline_run="sweep-a"') > 3

    status = dsl.PipelineTaskFinalStatus(state="FAILED", pipeline_job_resource_name="runs/a",
                                         pipeline_task_name="exit-handler-1", error_code=1, error_message="x")
    record_status.python_func(status=status, pipeline="benchmark_sweep", job_name="sweep-a", status_dir=str(tmp_path),
                              pushgateway=gateway, scrape_grace_seconds=0)
    assert training_groups(gateway) == [group for group in before if group[0] != "sweep-a"]
    statuses = {g.grouping_key["run"] for g in groups.list_groups(gateway) if g.job == catalog.PIPELINE_JOB}
    assert statuses == {"sweep-a", "sweep-b"}  # the failed-run alert reads A's status group: it stays


def test_a_finished_runs_group_outlives_its_last_push_by_the_scrape_grace(gateway):
    """Deleted no sooner than ``scrape_grace`` seconds after its last push (measured by the gateway), so the final
    values are scraped; the wait is for the youngest group only and never longer than the grace."""
    push(gateway, catalog.TRAIN_JOB, {**TRAINING, catalog.PIPELINE_RUN_LABEL: "sweep-c"}, "mtlflow_train_running", 0)
    pushed = groups.list_groups(gateway)[0].pushed_unix
    waits: list[float] = []
    deleted = groups.delete_pipeline_run_groups(gateway, "sweep-c", scrape_grace=30, sleep=waits.append)
    assert len(deleted) == 1 and keys(gateway) == set()
    assert len(waits) == 1 and 0 < waits[0] <= 30
    assert pushed + 30 - time.time() <= waits[0] <= pushed + 30 - time.time() + 5  # the grace left at the time

    push(gateway, catalog.TRAIN_JOB, {**TRAINING, catalog.PIPELINE_RUN_LABEL: "sweep-c"}, "mtlflow_train_running", 0)
    waits.clear()
    later = time.time() + 31
    assert len(groups.delete_pipeline_run_groups(gateway, "sweep-c", scrape_grace=30, sleep=waits.append,
                                                 now=later)) == 1
    assert waits == []
