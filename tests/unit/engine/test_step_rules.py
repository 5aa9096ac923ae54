"""The step's rules exist once (`mtlflow.engine.step`): the ×K factor, the clipping, the optimizer step
between the hooks; the trainer's step, the steps of the methods that own theirs (MOML, FORUM, PaLoRA)
and the toy runner all go through them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.engine import step as step_rules
from mtlflow.engine.trainer import Trainer


@pytest.mark.parametrize("natural_scale,n_tasks,rescale,expected", [
    ("mean", 3, True, 3.0), ("mean", 3, False, 1.0), ("sum", 3, True, 1.0), ("mean", 1, True, 1.0)])
def test_update_scale_is_k_for_convex_combinations_only(natural_scale, n_tasks, rescale, expected):
    assert step_rules.update_scale(natural_scale, n_tasks, rescale) == expected


class Recorder(Callback):
    """Records the hook order and the gradients the optimizer is about to apply."""

    def __init__(self, log: list):
        self.log = log
        self.grads: list[list[torch.Tensor]] = []

    def before_optimizer_step(self, trainer, state) -> None:
        self.log.append("callback.before")
        self.grads.append([p.grad.clone() for p in trainer.model.parameters()])

    def after_optimizer_step(self, trainer, state) -> None:
        self.log.append("callback.after")


def test_optimizer_step_clips_globally_then_the_shared_part_then_steps_between_the_hooks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    shared = list(model[0].parameters())
    grads = [torch.randn_like(p) * 5 for p in model.parameters()]
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()
    log: list[str] = []
    method = SimpleNamespace(shared_grad_max_norm=lambda: 0.1,
                             after_optimizer_step=lambda ctx: log.append(f"method.after:{ctx}"))

    class LoggingSGD(torch.optim.SGD):
        def step(self, closure=None):
            log.append("optimizer.step")
            return super().step(closure)

    before = [p.detach().clone() for p in model.parameters()]
    recorder = Recorder(log)
    view = SimpleNamespace(model=model, shared=shared, method=method, callbacks=[recorder],
                           config=SimpleNamespace(clip_grad_norm=0.5), optimizer=LoggingSGD(model.parameters(), lr=1.0))
    step_rules.optimizer_step(view, state=SimpleNamespace(), ctx="ctx")

    assert log == ["callback.before", "optimizer.step", "method.after:ctx", "callback.after"]
    # independently: scale all gradients to norm 0.5, then the shared ones to norm 0.1
    total = torch.sqrt(sum((g ** 2).sum() for g in grads))
    expected = [g * min(1.0, 0.5 / float(total)) for g in grads]
    shared_norm = torch.sqrt(sum((g ** 2).sum() for g in expected[:2]))
    expected[:2] = [g * min(1.0, 0.1 / float(shared_norm)) for g in expected[:2]]
    for seen, want, p, p0 in zip(recorder.grads[0], expected, model.parameters(), before, strict=True):
        torch.testing.assert_close(seen, want)
        torch.testing.assert_close(p.detach(), p0 - want)  # SGD, lr 1


@pytest.mark.parametrize("method", ["moml", "forum", "palora", "ls"])
def test_every_step_goes_through_the_rules_also_when_a_method_owns_it(method, multimnist_small, tmp_path):
    """The callbacks see each optimizer step once and clip_grad_norm bounds it: ‖Δθ‖ = lr · clip for SGD."""
    bench, data = jobs.load_prepared(multimnist_small)
    log: list[str] = []
    recorder = Recorder(log)
    config = RunConfig(method=method, epochs=1, batch_size=8, optimizer="sgd", lr=0.1, clip_grad_norm=1e-3,
                       hparams=jobs.resolved_hparams(bench, method, {}))
    trainer = Trainer(bench, data, config, tmp_path / method, callbacks=[recorder], progress=False)
    batch = next(iter(trainer._loader(1)))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train_step(batch, 1)
    assert log == ["callback.before", "callback.after"]
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum()
                           for p, b in zip(trainer.model.parameters(), before, strict=True)))
    assert float(moved) == pytest.approx(0.1 * 1e-3, rel=1e-3)
