import json
import socket
from pathlib import Path

from kfp import dsl

from mtlflow.components.record_status.component import record_status


def test_failed_run_is_recorded_with_its_error(tmp_path):
    status = dsl.PipelineTaskFinalStatus(state="FAILED", pipeline_job_resource_name="runs/123",
                                         pipeline_task_name="exit-handler-1", error_code=9,
                                         error_message="train-2 failed: CUDA out of memory")
    path = record_status.python_func(status=status, pipeline="benchmark_sweep", job_name="sweep-2026/11/22",
                                     status_dir=str(tmp_path))
    record = json.loads(Path(path).read_text())
    assert Path(path).parent == tmp_path and "/" not in Path(path).name
    assert record["state"] == "FAILED" and record["succeeded"] is False
    assert record["error_message"] == "train-2 failed: CUDA out of memory" and record["error_code"] == 9
    latest = json.loads((tmp_path / "benchmark_sweep.latest.json").read_text())
    assert latest["record"] == path and latest["job"] == "sweep-2026/11/22"


def test_later_run_replaces_the_latest_pointer(tmp_path):
    for job, state in (("a", "FAILED"), ("b", "SUCCEEDED")):
        status = dsl.PipelineTaskFinalStatus(state=state, pipeline_job_resource_name=job,
                                             pipeline_task_name="exit-handler-1", error_code=None, error_message=None)
        record_status.python_func(status=status, pipeline="retrain", job_name=job, status_dir=str(tmp_path))
    assert json.loads((tmp_path / "retrain.latest.json").read_text())["state"] == "SUCCEEDED"
    assert json.loads((tmp_path / "a.json").read_text())["state"] == "FAILED"


def test_unreachable_pushgateway_only_warns(tmp_path, caplog):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status = dsl.PipelineTaskFinalStatus(state="SUCCEEDED", pipeline_job_resource_name="r",
                                         pipeline_task_name="exit-handler-1", error_code=None, error_message=None)
    path = record_status.python_func(status=status, pipeline="retrain", job_name="r1", status_dir=str(tmp_path),
                                     pushgateway=f"http://127.0.0.1:{port}")
    assert json.loads(Path(path).read_text())["state"] == "SUCCEEDED"
    warnings = [r for r in caplog.records if r.name == "mtlflow.ops.observability"]
    assert len(warnings) == 1 and str(port) in warnings[0].getMessage()
    # and one each for the deletion of this run's training groups and the expiry of stale ones, which failed
    # too and did not fail the step
    housekeeping = [r.getMessage() for r in caplog.records if r.name == "mtlflow.ops.observability.groups"]
    assert len(housekeeping) == 2
    assert "could not delete the training groups of pipeline run r1" in housekeeping[0]
    assert "could not expire stale groups" in housekeeping[1]
