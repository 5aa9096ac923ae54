"""plan_baselines and baseline called as Python functions on the tiny prepared data (images: the trivial baseline
only), their run-like directory compared by aggregate beside the methods, and the sweep's compiled IR feeding every
planned baseline into aggregate."""

import json
from pathlib import Path

import yaml
from kfp import dsl

from mtlflow.components.aggregate.component import aggregate
from mtlflow.components.baseline.component import baseline, plan_baselines
from mtlflow.pipelines import runner


def test_images_plan_the_trivial_baseline_whose_row_aggregate_pairs_with_every_method(tiny_dataset, tiny_runs,
                                                                                     tmp_path, monkeypatch):
    data, tasks = tiny_dataset
    assert plan_baselines.python_func(data=data) == ["trivial"]
    run, metrics = dsl.Artifact(uri=str(tmp_path / "trivial")), dsl.Metrics(uri=str(tmp_path / "metrics.json"))
    baseline.python_func(data=data, kind="trivial", run=run, metrics=metrics, cache_root=str(tmp_path / "cache"))
    assert json.loads((Path(run.path) / "run.json").read_text())["kind"] == "baseline"
    assert run.metadata["method"] == "baseline-trivial" and run.metadata["source"] == "fitted"
    assert list((tmp_path / "cache" / "baselines").glob("trivial-*"))  # cached by data hash under cache_root
    assert set(metrics.metadata) >= {f"{t}.acc" for t in tasks}
    results = dsl.Artifact(uri=str(tmp_path / "results"))
    aggregate.python_func(runs=[tiny_runs["ls"]["run"], tiny_runs["mgda"]["run"]], references=[],
                          method_set=["ls", "mgda"], results=results, report=dsl.HTML(uri=str(tmp_path / "r.html")),
                          metrics=dsl.Metrics(uri=str(tmp_path / "m.json")),
                          summary=dsl.Markdown(uri=str(tmp_path / "s.md")), baselines=[run])
    summary = json.loads((Path(results.path) / "results.json").read_text())
    assert set(summary["methods"]) == {"ls", "mgda"}
    row = summary["baselines"]["baseline-trivial"]
    assert row["mean"]["left"]["acc"] == metrics.metadata["left.acc"]
    assert all(row["versus"][m]["available"] for m in ("ls", "mgda"))


def test_the_sweep_fits_each_planned_baseline_and_aggregate_collects_them(tmp_path):
    ir = next(yaml.safe_load_all(runner.compile_pipeline(tmp_path / "sweep.yaml", pipeline="benchmark_sweep")
                                 .read_text()))
    components = ir["components"]
    loop = next(c["dag"] for c in components.values()
                if "baseline" in c.get("dag", {}).get("tasks", {}))
    fit = loop["tasks"]["baseline"]
    assert fit["inputs"]["parameters"]["kind"]["componentInputParameter"].startswith("pipelinechannel--plan-baselines")
    outer = next(c["dag"]["tasks"] for c in components.values() if "aggregate" in c.get("dag", {}).get("tasks", {}))
    fed = outer["aggregate"]["inputs"]["artifacts"]["baselines"]["taskOutputArtifact"]
    assert fed["outputArtifactKey"].endswith("run") and fed["producerTask"].startswith("for-loop")
