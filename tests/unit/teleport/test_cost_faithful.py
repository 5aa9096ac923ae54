"""COST against the paper on models with BatchNorm and dropout (issue 12, items 2, 3, 7), through the
trainer: an identity teleport is the base method's step bit for bit (BatchNorm updated once), the
adapter problem is deterministic under dropout (L_t = 0 at Δθ = 0), and the epoch's conflict and
trigger ratios are those of every step of the epoch, counted by hand."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.engine.trainer import Trainer
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.lenet import LeNetTrunk, classification_head

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(names, dropout: bool) -> MultiTaskModel:
    """MultiMNIST's LeNet with a BatchNorm (and optionally a Dropout(0.5), as the Office ResNet) trunk end."""
    torch.manual_seed(0)
    extra = [nn.Dropout(0.5)] if dropout else []
    trunk = nn.Sequential(LeNetTrunk(), nn.BatchNorm1d(128), *extra)
    return MultiTaskModel(trunk, [classification_head(128, 10) for _ in names], list(names))


def _trainer(data_dir, tmp_path, name, dropout=False, method="fairgrad", teleport=None, steps=2, **options):
    bench, data = jobs.load_prepared(data_dir)
    bench.make_model = lambda names=None: _model(bench.task_names if names is None else names, dropout)
    config = RunConfig(method=method, batch_size=32, max_steps_per_epoch=steps, epochs=1, seed=3,
                         hparams=jobs.resolved_hparams(bench, method, {}), teleport=teleport,
                         teleport_options=options if teleport else {})
    trainer = Trainer(bench, data, config, tmp_path / name, progress=False)
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
        cb.on_epoch_start(trainer, 1)
    return trainer


def _state(trainer) -> dict[str, torch.Tensor]:
    return {**{n: p.detach().clone() for n, p in trainer.model.named_parameters()},
            **{n: b.clone() for n, b in trainer.model.named_buffers()}}


def test_identity_teleport_updates_batchnorm_once_and_is_the_base_step_bit_for_bit(multimnist_small, tmp_path):
    # "w/o L_g" (Table 4) from Δθ = 0: L_t = 0 and its gradient is 0, so the teleport is the identity
    cost = _trainer(multimnist_small, tmp_path, "cost", teleport="cost", trigger="always", max_per_epoch=5,
                    use_sharpness=False, htr=False, steps=3)
    base = _trainer(multimnist_small, tmp_path, "base")
    batches = list(enumerate(itertools.islice(cost._loader(1), 2)))
    for step, batch in batches:
        cost.train_step(batch, 1)
        base.train_step(batch, 1)
        assert len(cost.callbacks[0]._events) == step + 1  # every step teleported
        tracked = [b for n, b in cost.model.named_buffers() if n.endswith("num_batches_tracked")]
        assert [int(t) for t in tracked] == [step + 1]
        ours, theirs = _state(cost), _state(base)
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), name
    assert cost.callbacks[0]._events[0]["displacement_norm"] == 0.0


def test_paper_variant_teleport_is_deterministic_under_dropout(multimnist_small, tmp_path):
    """Train mode as the paper, but dropout off inside the teleport: L_t at Δθ = 0 is exactly 0 and L_g at
    δ = 1e-9 is of the order δ·‖∇L‖, not dropout noise (0.002-0.04 on the Office ResNet)."""
    trainer = _trainer(multimnist_small, tmp_path, "drop", dropout=True, teleport="cost", trigger="always",
                       steps=1, radius=1e-9, perturbations=3)
    assert trainer.callbacks[0].resolved.eval_mode is False
    trainer.train_step(next(iter(trainer._loader(1))), 1)
    (event,) = trainer.callbacks[0]._events
    assert event["invariance_first"] == 0.0
    assert event["sharpness_first"] < 1e-6
    # the trainer's own model keeps dropout active (only the teleport's copy is deterministic)
    assert trainer.model.training and trainer.model.trunk[2].training


class ConflictCounter(Callback):
    """Counts by hand, on every step, the dominated conflict (Eq. 3): the smallest-gradient task's
    gradient has a negative inner product with the mean gradient."""

    name = "counter"

    def __init__(self):
        self.steps = self.dominated = 0

    def after_gradients(self, trainer, state):
        grads = state.grads.double()
        smallest = int(grads.norm(dim=1).argmin())
        self.steps += 1
        self.dominated += int(float(grads[smallest] @ grads.mean(dim=0)) < 0)
        return False


@pytest.mark.parametrize("method", ["ls", "fairgrad"])
def test_epoch_ratios_describe_every_step_of_the_epoch(multimnist_small, tmp_path, method):
    trainer = _trainer(multimnist_small, tmp_path, method, method=method, teleport="cost", trigger="always",
                       max_per_epoch=1, steps=1, perturbations=1, lr=1e-2)
    counter = ConflictCounter()
    trainer.callbacks.append(counter)
    record: dict = {}
    for batch in itertools.islice(trainer._loader(1), 5):
        trainer.train_step(batch, 1)
    cost = trainer.callbacks[0]
    cost.on_epoch_end(trainer, record)
    summary = record["cost"]
    assert counter.steps == 5
    assert summary["teleports"] == 1
    assert summary["checked_steps"] == 5 and summary["trigger_steps"] == 5 and summary["trigger_ratio"] == 1.0
    assert summary["dominated_conflict_ratio"] == counter.dominated / 5
