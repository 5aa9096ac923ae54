"""A method written as one class outside mtlflow (the example plug-in package's unit-gradient sum,
examples/plugin_package/churn_plugin/methods.py, named by its import path) gets what the built-in methods
get: its family's contract (`method_contracts.GramianContract`, the same properties every built-in Gramian
weighting is held to), and training through the trainer on every kind of gradient backend and under COST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from method_contracts import GramianContract
from method_helpers import jacobian, positive_losses

from mtlflow import jobs, methods

PACKAGE = Path(__file__).resolve().parents[3] / "examples" / "plugin_package"
METHOD = "churn_plugin.methods:UnitGradientSum"


@pytest.fixture(autouse=True)
def example_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGE))


class TestUnitGradientSum(GramianContract):
    name = METHOD
    refuses_non_finite = False  # the example returns NaN weights; the trainer names the method at that step

    def assert_defining_property(self, grads, losses, method, direction) -> None:
        torch.testing.assert_close(direction, (grads / grads.norm(dim=1, keepdim=True)).sum(0), rtol=1e-12, atol=0)


def test_the_direction_is_the_sum_of_the_unit_gradients() -> None:
    grads = jacobian(3, 4, 12) * torch.tensor([[1e-3], [1.0], [10.0], [1e3]], dtype=torch.float64)
    direction = methods.build(METHOD, 4).combine(grads, positive_losses(3, 4))
    torch.testing.assert_close(direction, (grads / grads.norm(dim=1, keepdim=True)).sum(0), rtol=1e-12, atol=0)


@pytest.fixture(scope="module")
def churn_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("churn") / "data"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PACKAGE))
        jobs.prepare("churn_plugin.tasks:Churn", out, rows=200)
    return out


@pytest.mark.parametrize("options", [{"grad_backend": "loop"}, {"grad_backend": "autogram"},
                                     {"grad_backend": "batched", "grad_wrt": "representation"},
                                     {"teleport": "cost"}], ids=["loop", "autogram", "representation", "cost"])
def test_it_trains_through_the_trainer(churn_data: Path, tmp_path: Path, options: dict) -> None:
    result = jobs.train(churn_data, tmp_path / "run", method=METHOD, epochs=1, max_steps_per_epoch=3, batch_size=32,
                        progress=False, **options)
    assert set(result["final"]["test"]) == {"churn", "spend"}
