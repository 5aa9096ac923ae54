"""The K losses of a forward pass are stacked once: the finite check, the hooks and the update of a step
share one ``[K]`` tensor (each ``torch.stack`` is a graph node forward and backward, a measurable cost of a
small model's step), and a pass whose losses change is a new pass, so the shared tensor never goes stale."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.engine.trainer import Trainer
from mtlflow.grad_engine.backends import ForwardPass


def test_a_pass_stacks_its_losses_once_and_a_changed_pass_is_a_new_one():
    a, b = torch.tensor(1.0, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    forward = ForwardPass([a * 3, b * 5])
    with mock.patch.object(torch, "stack", wraps=torch.stack) as stack:
        first, second = forward.stacked, forward.stacked
    assert stack.call_count == 1 and first is second
    assert first.tolist() == [3.0, 10.0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        forward.losses = [a, b]  # type: ignore[misc]
    # what DDP does with the global-batch values: a new pass, with its own stacked losses
    changed = dataclasses.replace(forward, losses=[a * 7, b])
    assert changed.stacked.tolist() == [7.0, 2.0] and forward.stacked.tolist() == [3.0, 10.0]


@pytest.mark.parametrize("method", ["ls", "uw", "mgda"])
def test_a_training_step_stacks_the_losses_once(method, tmp_path):
    folder = tmp_path / "data"
    jobs.prepare("toy", folder)
    bench, data = jobs.load_prepared(folder)
    run = Trainer(bench, data, RunConfig(method=method, epochs=1, batch_size=4), tmp_path / "run", progress=False)
    batch = next(iter(run._loader(1)))
    before = [p.detach().clone() for p in run.model.parameters()]
    with mock.patch.object(torch, "stack", wraps=torch.stack) as stack:
        info = run.train_step(batch, 1)
    stacked_losses = [call for call in stack.call_args_list if len(call.args[0]) == len(run.tasks)
                      and all(t.dim() == 0 for t in call.args[0])]
    assert len(stacked_losses) == 1
    # the step still trained with those losses
    assert torch.equal(info["losses"], torch.stack(stacked_losses[0].args[0]).detach())
    assert any(not torch.equal(p, q) for p, q in zip(before, run.model.parameters(), strict=True))
