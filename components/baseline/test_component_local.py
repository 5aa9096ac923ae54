"""plan_baselines and baseline under kfp.local's SubprocessRunner, as the sweep runs them: the planned kinds of
the tiny image data (the trivial one) fitted in a ParallelFor, the same numbers as an in-process fit."""

import json

import pytest
from kfp import dsl

from mtlflow.components.baseline.component import baseline, plan_baselines
from mtlflow.jobs.baselines import baseline as fit

pytestmark = pytest.mark.integration


def test_the_planned_baselines_run_under_the_local_runner(local_runner, tiny_dataset, tmp_path, monkeypatch):
    data, _ = tiny_dataset

    @dsl.pipeline(name="baselines-locally")
    def baselines_locally(data_uri: str, cache_root: str):
        prepared = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
        kinds = plan_baselines(data=prepared.output)
        with dsl.ParallelFor(kinds.output) as kind:
            baseline(data=prepared.output, kind=kind, cache_root=cache_root)

    baselines_locally(data_uri=data.uri, cache_root=str(tmp_path / "cache"))
    (written,) = [p.parent for p in local_runner.rglob("run.json")]
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "in-process-cache"))
    expected = fit(data.path, "trivial", tmp_path / "in-process")
    assert json.loads((written / "metrics.json").read_text())["final"] == expected["metrics"]
    assert expected["source"] == "fitted"
