"""NORMAL is built in its base model's dtype (issue 29, item 3): the float64 benchmarks (toy, asmg-synthetic)
wrap a float64 backbone, and a float32 ODE field or float32 task positions made their first forward end in
"mat1 and mat2 must have the same dtype". The float32 benchmarks keep a float32 NORMAL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtlflow import benchmarks, jobs
from mtlflow.models.architectures import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("name,config", [("toy", {"steps_per_epoch": 4}), ("asmg-synthetic", {})])
def test_normal_on_a_float64_benchmark_is_float64_and_trains(name: str, config: dict, tmp_path: Path) -> None:
    bench = benchmarks.build(name, **config)
    base_dtype = next(p.dtype for p in bench.make_model().parameters() if p.is_floating_point())
    assert base_dtype == torch.float64
    data = tmp_path / "data"
    jobs.prepare(name, data, **config)
    splits = bench.read_splits(data)
    model = build_model(bench, [t.name for t in bench.tasks], "normal", {}, probe=splits["train"])
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    loader = bench.make_loader(splits["train"], batch_size=2, shuffle=False, generator=torch.Generator().manual_seed(0))
    inputs, targets = bench.unpack(next(iter(loader)))
    outputs = model(inputs)
    losses = torch.stack([task.loss(out, target)
                          for task, out, target in zip(bench.tasks, outputs, targets, strict=True)])
    assert losses.dtype == torch.float64
    losses.sum().backward()
    assert all(p.grad is None or (p.grad.dtype == torch.float64 and torch.isfinite(p.grad).all())
               for p in model.parameters())
    # the trainer end to end, as `mtlflow train --architecture normal` runs it
    run = tmp_path / "run"
    jobs.train(data, run, method="ls", epochs=1, batch_size=2, max_steps_per_epoch=2, progress=False,
               architecture="normal")
    saved = torch.load(run / "model.pt", weights_only=False)
    assert saved["architecture"]["name"] == "normal"
    assert {v.dtype for v in saved["state_dict"].values() if v.is_floating_point()} == {torch.float64}


def test_normal_on_a_float32_benchmark_stays_float32(multimnist_small: Path) -> None:
    bench, data = jobs.load_prepared(multimnist_small)
    model = build_model(bench, [t.name for t in bench.tasks], "normal", {}, probe=data.splits["train"])
    assert {p.dtype for p in model.parameters()} == {torch.float32}
