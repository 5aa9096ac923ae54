"""plan_claim under kfp.local's SubprocessRunner: the seeds it hands the loop equal the in-process plan's
(tests/integration/test_reproduce_pipeline.py runs the whole pipeline, reproduce_seed and combine_claim too)."""

import pytest

from mtlflow.components.reproduce.component import plan_claim
from mtlflow.experiments import claim_pipeline

pytestmark = pytest.mark.integration


def test_plan_claim_runs_under_the_local_runner(local_runner):
    task = plan_claim(claim="asmg-synthetic", scale="ci", seeds=[])
    # a List[int] output crosses kfp as a protobuf list: its numbers come back as floats
    assert [int(seed) for seed in task.output] == claim_pipeline.plan("asmg-synthetic", "ci")
    assert all(float(seed).is_integer() for seed in task.output)
