"""``shared_parameters()`` means "shared by every task" (issue 12, item 1), checked independently: a
parameter is shared iff every task's output has a non-zero gradient with respect to it on a random batch, and
task i's parameters are exactly those only task i's output depends on. COST's and PaLoRA's adapter targets follow.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mtlflow import benchmarks
from mtlflow.models.architectures import build_model
from mtlflow.models.base import MultiTaskModel
from mtlflow.teleport.adapters import adapter_targets


def _reachability(model: MultiTaskModel, inputs: Any) -> list[set[int]]:
    """For every task, the ids of the parameters its output depends on (a non-zero gradient)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    reached = []
    for pred in model(inputs):
        grads = torch.autograd.grad(pred.float().square().sum(), params, allow_unused=True, retain_graph=True)
        # non-zero rather than merely reachable: stacking the task features links every slice in the graph
        reached.append({id(p) for p, g in zip(params, grads, strict=True) if g is not None and bool(g.abs().sum() > 0)})
    return reached


def _check(model: MultiTaskModel, inputs: Any) -> None:
    reached = _reachability(model, inputs)
    names = {id(p): n for n, p in model.named_parameters()}
    expected_shared = set.intersection(*reached)
    shared = {id(p) for p in model.shared_parameters()}
    assert sorted(names[i] for i in shared) == sorted(names[i] for i in expected_shared)
    for i, own in enumerate(reached):
        task = {id(p) for p in model.task_parameters(i)}
        assert sorted(names[p] for p in task) == sorted(names[p] for p in own - expected_shared), f"task {i}"
    # every trainable parameter is accounted for exactly once
    every = [id(p) for p in model.shared_parameters()] + [id(p) for i in range(len(model.heads))
                                                          for p in model.task_parameters(i)]
    assert len(every) == len(set(every)) == sum(1 for p in model.parameters() if p.requires_grad)


def _scene(name: str, kind: str) -> tuple[MultiTaskModel, torch.Tensor]:
    bench = benchmarks.get(name)(model=kind, width_divisor=16)
    return bench.make_model(), torch.randn(2, 3, 32, 32)


SCENES: dict[str, Callable[[], tuple[MultiTaskModel, torch.Tensor]]] = {
    "cityscapes-mtan": lambda: _scene("cityscapes", "mtan"),
    "nyuv2-mtan": lambda: _scene("nyuv2", "mtan"),
    "nyuv2-segnet": lambda: _scene("nyuv2", "segnet"),
}


@pytest.mark.parametrize("case", sorted(SCENES))
def test_shared_means_reached_by_every_task_on_scene_models(case: str) -> None:
    torch.manual_seed(0)
    model, inputs = SCENES[case]()
    _check(model, inputs)


def test_mtan_attention_masks_are_task_parameters_not_adapter_targets() -> None:
    torch.manual_seed(0)
    model, _ = SCENES["nyuv2-mtan"]()
    targets = adapter_targets(model, model.shared_parameters())
    assert targets and not [t for t in targets if "_masks" in t]
    from mtlflow.pareto.adapters import select_layers

    assert not [t for t in select_layers(model, "trunk") if "_masks" in t]
    # shared layers of the MTAN: backbone + the conv blocks every branch runs through
    assert {t.split(".")[1] for t in targets} == {"backbone", "attention"}
    assert all(".enc_blocks." in t or ".dec_blocks." in t for t in targets if ".attention." in t)


@pytest.mark.parametrize("architecture, options", [("hps", None), ("normal", None),
                                                   ("normal", {"replace_ode": "shared-layers"}),
                                                   ("normal", {"replace_ode": "task-layers"})])
def test_shared_means_reached_by_every_task_on_multimnist(architecture: str, options: dict | None,
                                                          multimnist_small: Path) -> None:
    torch.manual_seed(0)
    bench = benchmarks.get("multimnist")()
    data = bench.load(multimnist_small)
    names = bench.task_names
    model = build_model(bench, names, architecture, options, probe=data.splits["train"])
    loader = bench.make_loader(data.splits["train"], 4, generator=torch.Generator().manual_seed(0))
    inputs, _ = bench.unpack(next(iter(loader)))
    _check(model, inputs)


def test_every_registered_benchmark_model_partitions_its_parameters() -> None:
    """Structural check on every benchmark's default model (no data needed): shared and task sets are
    disjoint and cover every trainable parameter."""
    built = []
    for name in benchmarks.available():
        if benchmarks.get(name).tasks_from:  # built from a user spec: see test_spec.py
            continue
        try:
            model = benchmarks.get(name)().make_model()
        except FileNotFoundError:  # a model that needs pretrained weights on disk
            continue
        built.append(name)
        ids = [id(p) for p in model.shared_parameters()] + [id(p) for i in range(len(model.heads))
                                                            for p in model.task_parameters(i)]
        assert len(ids) == len(set(ids)), name
        assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad}, name
    assert {"cityscapes", "nyuv2", "multimnist", "celeba", "qm9"} <= set(built)


@pytest.mark.parametrize("method", ["mgdaub", "fairgrad", "ls"])
def test_mtan_attention_masks_get_their_tasks_plain_gradient_in_every_gradient_mode(method: str,
                                                                                     tmp_path: Path) -> None:
    """Task i's masks get ∇L_i (computed here by autograd on a copy), whatever the method combines for the
    shared parameters (representation, Jacobian and loss modes)."""
    import copy
    import sys

    from mtlflow import jobs
    from mtlflow.config.run import RunConfig
    from mtlflow.core.callbacks import Callback
    from mtlflow.engine.trainer import Trainer

    sys.path.insert(0, str(Path(__file__).parent))
    from test_bench_fixtures import write_mtan

    write_mtan(tmp_path / "nyu", "label", 13, normals=True)
    jobs.prepare("nyuv2", tmp_path / "prepared", data_dir=str(tmp_path / "nyu"), width_divisor=8)
    bench, data = jobs.load_prepared(tmp_path / "prepared")
    config = RunConfig(method=method, batch_size=2, max_steps_per_epoch=1, epochs=1,
                         hparams=jobs.resolved_hparams(bench, method, {}))
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    batch = next(iter(trainer._loader(1)))
    twin = copy.deepcopy(trainer.model)
    twin.train()
    inputs, targets = trainer.inputs_targets(batch)
    losses = trainer.task_losses(twin(inputs), targets)
    expected = [torch.autograd.grad(loss, twin.trunk_task_parameters(i), retain_graph=True)
                for i, loss in enumerate(losses)]

    class Grads(Callback):
        name = "grads"

        def before_optimizer_step(self, trainer, state):
            self.got = [[p.grad.clone() for p in trainer.model.trunk_task_parameters(i)] for i in range(3)]

    probe = Grads()
    trainer.callbacks.append(probe)
    trainer.train_step(batch, 1)
    for i in range(3):
        for got, want in zip(probe.got[i], expected[i], strict=True):
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (method, i)
