"""The trainer's finite-loss check before every update: each non-finite task is named, against hand-made
losses in float32, bf16 and float64."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mtlflow.core.errors import NonFiniteLossError
from mtlflow.engine.trainer import Trainer


@pytest.mark.parametrize("losses, named", [
    ([1.0, float("inf")], "b=inf"),
    ([float("-inf"), float("inf")], "a=-inf, b=inf"),  # a NaN sum: both are named
    ([float("nan"), 2.0], "a=nan"),
])
def test_the_finite_loss_check_names_each_non_finite_task(losses, named):
    view = SimpleNamespace(tasks=[SimpleNamespace(name="a"), SimpleNamespace(name="b")], global_step=7)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        with pytest.raises(NonFiniteLossError, match=rf"non-finite loss \({named}\) at epoch 2, step 7"):
            Trainer._check_finite(view, torch.tensor(losses, dtype=dtype), 2)


def test_the_finite_loss_check_passes_finite_losses_and_reports_a_float64_overflow():
    view = SimpleNamespace(tasks=[SimpleNamespace(name="a"), SimpleNamespace(name="b")], global_step=0)
    largest32 = torch.finfo(torch.float32).max
    Trainer._check_finite(view, torch.tensor([largest32, largest32]), 1)  # float32's largest: finite, no error
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(their float64 sum overflows\)"):
        Trainer._check_finite(view, torch.tensor([1e308, 1e308], dtype=torch.float64), 1)
