"""aggregate under kfp.local's SubprocessRunner, over real trained runs collected from a ParallelFor (as the
sweep collects them): its results equal an in-process aggregation's (mtlflow.jobs.aggregate)."""

import json

import pytest
from kfp import dsl

from mtlflow import jobs
from mtlflow.components.aggregate.component import aggregate

pytestmark = pytest.mark.integration


def test_aggregate_runs_under_the_local_runner(local_runner, tiny_runs, tmp_path):
    methods = [tiny_runs[name]["run"].uri for name in ("ls", "mgda")]
    references = [tiny_runs[name]["run"].uri for name in ("ref-left", "ref-right")]

    @dsl.pipeline(name="aggregate-locally")
    def aggregate_locally(method_uris: list, reference_uris: list):
        with dsl.ParallelFor(method_uris) as uri:
            run = dsl.importer(artifact_uri=uri, artifact_class=dsl.Artifact)
        with dsl.ParallelFor(reference_uris) as uri:
            reference = dsl.importer(artifact_uri=uri, artifact_class=dsl.Artifact)
        aggregate(runs=dsl.Collected(run.output), references=dsl.Collected(reference.output),
                  method_set=["ls", "mgda"])

    aggregate_locally(method_uris=methods, reference_uris=references)
    (results,) = local_runner.rglob("aggregate/results")
    jobs.aggregate(methods, tmp_path / "in-process", reference_dirs=references, method_set=["ls", "mgda"])
    expected = json.loads((tmp_path / "in-process" / "results.json").read_text())
    written = json.loads((results / "results.json").read_text())
    assert set(written["methods"]) == {"ls", "mgda"}
    for method in ("ls", "mgda"):
        assert written["methods"][method]["delta_m"] == pytest.approx(expected["methods"][method]["delta_m"])
