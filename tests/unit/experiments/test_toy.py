"""The CAGrad toy problem: formulas, distance to the Pareto set, and training through the jobs API."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mtlflow import jobs
from mtlflow.benchmarks.toy import PARETO_X2, START_POINTS, distance_to_pareto_set, toy_losses


def reference_losses(x1: float, x2: float, scale: float) -> tuple[float, float]:
    """The objectives written out in numpy from the formulas of CAGrad's toy problem."""
    lower = 5e-6
    f1a = np.log(max(abs(0.5 * (-x1 - 7) - np.tanh(-x2)), lower)) + 6
    f2a = np.log(max(abs(0.5 * (-x1 + 3) + np.tanh(-x2) + 2), lower)) + 6
    f1b = ((-x1 + 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    f2b = ((-x1 - 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    c1 = max(np.tanh(0.5 * x2), 0.0)
    c2 = max(np.tanh(-0.5 * x2), 0.0)
    return scale * (c1 * f1a + c2 * f1b), c1 * f2a + c2 * f2b


# a point where the first log term is clamped to LOWER: 0.5(-x1 - 7) = tanh(-1)
CLAMPED = (-7.0 + 2.0 * math.tanh(1.0), 1.0)
POINTS = [*START_POINTS, (1.0, PARETO_X2), (-3.0, 2.0), (4.0, -12.0), CLAMPED]


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_toy_losses_match_formulas(scale: float) -> None:
    x = torch.tensor(POINTS, dtype=torch.float64)
    got = toy_losses(x, scale)  # batched [N, 2]
    assert got.shape == (len(POINTS), 2)
    expected = np.array([reference_losses(a, b, scale) for a, b in POINTS])
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    # and one point at a time
    for (a, b), row in zip(POINTS, expected, strict=True):
        np.testing.assert_allclose(toy_losses(torch.tensor([a, b], dtype=torch.float64), scale).numpy(), row,
                                   rtol=1e-12, atol=1e-12)


def test_toy_losses_hand_values() -> None:
    # x2 = 0: both gates are 0, so both objectives vanish
    assert toy_losses(torch.tensor([3.0, 0.0], dtype=torch.float64)).tolist() == [0.0, 0.0]
    # clamped log: f1a = log(5e-6) + 6 and c1 = tanh(0.5)
    value = toy_losses(torch.tensor(CLAMPED, dtype=torch.float64), scale=1.0)[0]
    assert float(value) == pytest.approx(math.tanh(0.5) * (math.log(5e-6) + 6), rel=1e-9)


def test_distance_to_pareto_set() -> None:
    x = torch.tensor([[0.0, PARETO_X2], [-7.0, PARETO_X2], [10.0, PARETO_X2], [-7.0, 0.0], [10.0, PARETO_X2 + 4.0],
                      [-10.0, PARETO_X2 - 4.0]], dtype=torch.float64)
    # on the segment: 0; past its end by 3: 3; straight above the end: |x2 - PARETO_X2|; 3-4-5 triangles
    expected = [0.0, 0.0, 3.0, -PARETO_X2, 5.0, 5.0]
    np.testing.assert_allclose(distance_to_pareto_set(x).numpy(), expected, atol=1e-12)


def test_mgda_on_toy_moves_towards_pareto_set(tmp_path: Path) -> None:
    start = 3  # (-7.5, -0.5)
    data = tmp_path / "toy"
    jobs.prepare("toy", data, start=start, steps_per_epoch=500)
    result = jobs.train(data, tmp_path / "run", method="mgda", epochs=2, lr=0.01, progress=False)
    assert result["epochs"] == 2
    blob = torch.load(tmp_path / "run" / "model.pt", weights_only=False)
    x = blob["state_dict"]["trunk.x"]
    before = float(distance_to_pareto_set(torch.tensor(START_POINTS[start], dtype=torch.float64)))
    after = float(distance_to_pareto_set(x))
    assert before == pytest.approx(7.871, abs=1e-3)
    assert after < 0.25 * before, (x.tolist(), before, after)
    # both objectives decreased from the start, and the recorded final values are those of x
    f_start = toy_losses(torch.tensor(START_POINTS[start], dtype=torch.float64))
    f_end = toy_losses(x)
    assert torch.all(f_end < f_start)
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]["test"]
    assert final["f1"]["value"] == pytest.approx(float(f_end[0]), rel=1e-9)
    assert final["f2"]["value"] == pytest.approx(float(f_end[1]), rel=1e-9)


def test_toy_start_point_origin_has_nonzero_gradient() -> None:
    x = torch.tensor(START_POINTS[1], dtype=torch.float64, requires_grad=True)
    assert START_POINTS[1] == (0.0, 0.0)
    losses = toy_losses(x)
    for i in range(2):
        (grad,) = torch.autograd.grad(losses[i], x, retain_graph=True)
        assert float(grad.norm()) > 0, f"objective {i + 1} has zero gradient at (0, 0)"


def test_famo_trains_on_toy(tmp_path: Path) -> None:
    data = tmp_path / "toy"
    jobs.prepare("toy", data, start=4, steps_per_epoch=20)  # (9, -1): f1 < 0 at the start
    jobs.train(data, tmp_path / "run", method="famo", epochs=1, lr=0.01, progress=False)
