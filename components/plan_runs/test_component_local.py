"""The plan components under kfp.local's SubprocessRunner: their outputs cross kfp's executor (a list of
strings, a string) and equal the specs mtlflow.config.pipeline plans in-process."""

import json

import pytest

from mtlflow.components.plan_runs.component import plan_references, plan_run, plan_runs
from mtlflow.config import pipeline as plans

pytestmark = pytest.mark.integration


def test_plans_run_under_the_local_runner(local_runner):
    runs = plan_runs(methods=["ls", "mgda"], seeds=[0, 1], method_hparams={"mgda": {}})
    assert [json.loads(s) for s in runs.output] == [json.loads(s) for s in plans.plan_runs(["ls", "mgda"], [0, 1],
                                                                                            {"mgda": {}})]
    refs = plan_references(tasks=["left", "right"], seeds=[0])
    assert [json.loads(s) for s in refs.output] == [json.loads(s) for s in plans.plan_references(["left", "right"],
                                                                                                 [0])]
    one = plan_run(method="ls", seed=3, hparams={})
    assert json.loads(one.output) == json.loads(plans.plan_run("ls", 3, {}))
