"""Every pipeline compiles; the IR carries the project image, the GPU request, the loop limit and no runtime pip."""

from __future__ import annotations

import yaml

from mtlflow.components.image import IMAGE
from mtlflow.pipelines import runner
from mtlflow.pipelines.main import PARALLELISM


def _ir(path):
    return next(yaml.safe_load_all(path.read_text()))


def test_every_pipeline_compiles(tmp_path):
    for name in runner.pipelines():
        ir = _ir(runner.compile_pipeline(tmp_path / f"{name}.yaml", pipeline=name))
        assert ir["pipelineInfo"]["name"].startswith("mtlflow")


def test_main_pipeline_ir(tmp_path):
    ir = _ir(runner.compile_pipeline(tmp_path / "main.yaml", pipeline="main"))
    assert ir["pipelineInfo"]["name"] == "mtlflow-benchmark-sweep"
    executors = ir["deploymentSpec"]["executors"]
    for spec in executors.values():
        container = spec["container"]
        assert container["image"] == IMAGE
        assert "pip install" not in " ".join(container.get("command", []) + container.get("args", []))
    gpu = {name: spec["container"]["resources"]["accelerator"] for name, spec in executors.items()
           if "accelerator" in spec["container"].get("resources", {})}
    assert set(gpu) == {"exec-train", "exec-train-2"}
    for acc in gpu.values():
        assert acc["resourceType"] == "nvidia.com/gpu" and int(acc["resourceCount"]) == 1
    loops = [t for c in ir["components"].values() for t in c.get("dag", {}).get("tasks", {}).values()
             if "iteratorPolicy" in t]
    assert len(loops) == 2
    assert all(t["iteratorPolicy"]["parallelismLimit"] == PARALLELISM for t in loops)
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert params["methods"]["defaultValue"] == ["ls", "mgda", "famo", "fairgrad"]
