"""The trainer's forward pass enters no autocast context when ``amp`` is off (it costs a small model's
step ~1 %), yet keeps what the disabled context did: an enclosing bf16 autocast is switched off inside
it, and ``amp=bf16`` still runs the pass in bfloat16."""

from __future__ import annotations

import pytest
import torch

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.engine.trainer import Trainer


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    jobs.prepare("toy", folder / "data")
    return jobs.load_prepared(folder / "data")


def trainer_and_batch(toy, tmp_path, amp: str) -> tuple[Trainer, list]:
    """A trainer on the toy problem with a linear trunk (an op autocast casts) and one batch, in float32
    (autocast leaves float64 alone)."""
    bench, data = toy
    run = Trainer(bench, data, RunConfig(method="ls", epochs=1, batch_size=4, amp=amp), tmp_path / amp,
                  progress=False)
    run.model.trunk = torch.nn.Linear(1, 2)  # the toy's inputs [B, 1] -> its point z [B, 2]
    run.model.float()
    inputs, targets = next(iter(run._loader(1)))
    return run, [inputs.float(), [t.float() for t in targets]]


def test_amp_off_runs_in_float32_even_inside_an_enclosing_autocast(toy, tmp_path):
    run, batch = trainer_and_batch(toy, tmp_path, "none")
    assert run.forward_pass(batch).features.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # the caller's autocast is on, the run's amp is off: the trainer switches it off for its pass
        assert torch.is_autocast_enabled("cpu")
        assert run.forward_pass(batch).features.dtype == torch.float32


def test_amp_bf16_runs_the_pass_in_bfloat16(toy, tmp_path):
    run, batch = trainer_and_batch(toy, tmp_path, "bf16")
    assert run.forward_pass(batch).features.dtype == torch.bfloat16
