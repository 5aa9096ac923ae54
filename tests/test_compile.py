"""Every pipeline compiles; the IR carries the GPU request, the loop limit and no runtime pip."""

from __future__ import annotations

import yaml

from components.image import IMAGE
from pipelines import runner
from pipelines.main import PARALLELISM


def _executors(ir):
    return ir["deploymentSpec"]["executors"]


def test_every_pipeline_compiles(tmp_path):
    for name in runner.pipelines():
        out = runner.compile_pipeline(tmp_path / f"{name}.yaml", pipeline=name)
        ir = yaml.safe_load(out.read_text())
        assert ir["pipelineInfo"]["name"].startswith("mtlflow")


def test_main_pipeline_ir(tmp_path):
    ir = yaml.safe_load(runner.compile_pipeline(tmp_path / "main.yaml").read_text())
    executors = _executors(ir)
    for name, spec in executors.items():
        container = spec["container"]
        assert container["image"] == IMAGE
        assert "pip install" not in " ".join(container.get("command", []) + container.get("args", []))
    gpu = {name: spec["container"]["resources"]["accelerator"] for name, spec in executors.items()
           if "accelerator" in spec["container"].get("resources", {})}
    assert set(gpu) == {"exec-train", "exec-train-2"}
    for acc in gpu.values():
        assert acc["resourceType"] == "nvidia.com/gpu" and int(acc["resourceCount"]) == 1
    loops = [c for c in ir["root"]["dag"]["tasks"].values() if "iteratorPolicy" in c]
    assert len(loops) == 2
    assert all(c["iteratorPolicy"]["parallelismLimit"] == PARALLELISM for c in loops)
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert params["methods"]["defaultValue"] == ["ls", "mgda", "famo", "fairgrad"]
