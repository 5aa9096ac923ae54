"""record_status under kfp.local's SubprocessRunner as the exit handler it is in every pipeline: kfp fills its
PipelineTaskFinalStatus, and the record says the run SUCCEEDED."""

import json

import pytest
from kfp import dsl

from mtlflow.components.plan_runs.component import plan_run
from mtlflow.components.record_status.component import record_status

pytestmark = pytest.mark.integration


def test_record_status_runs_as_the_local_exit_handler(local_runner, tmp_path):
    status_dir = tmp_path / "status"

    @dsl.pipeline(name="exit-handler-locally")
    def exit_handler_locally(status_root: str):
        with dsl.ExitHandler(record_status(pipeline="exit-handler-locally", job_name="local-1",
                                           status_dir=status_root)):
            plan_run(method="ls", seed=0, hparams={})

    exit_handler_locally(status_root=str(status_dir))
    record = json.loads((status_dir / "local-1.json").read_text())
    assert record["state"] == "SUCCEEDED" and record["succeeded"] is True
    assert record["pipeline"] == "exit-handler-locally"
