"""``mtlflow toy``: closed-form toy gradients, a shortened run writing plot + tables, LS vs MGDA."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mtlflow.benchmarks.toy import START_POINTS, toy_losses
from mtlflow.cli import main
from mtlflow.experiments.trajectories import pareto_stationarity, toy_values_and_gradients


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_closed_form_gradients_match_autograd(scale: float) -> None:
    torch.manual_seed(0)
    points = torch.cat([torch.tensor(START_POINTS, dtype=torch.float64),
                        torch.tensor([[1.0, -8.3552], [-3.0, 2.0], [4.0, -12.0], [0.5, 0.0]], dtype=torch.float64),
                        torch.rand(40, 2, dtype=torch.float64) * 24 - 12])
    x = points.clone().requires_grad_(True)
    losses = toy_losses(x, scale)
    grads = torch.stack([torch.autograd.grad(losses[:, i].sum(), x, retain_graph=True)[0] for i in range(2)], dim=1)
    values, closed_form = toy_values_and_gradients(points.numpy(), scale)
    np.testing.assert_allclose(values, losses.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(closed_form, grads.numpy(), rtol=1e-10, atol=1e-12)


def test_pareto_stationarity_is_the_min_norm_combination() -> None:
    opposite = torch.tensor([[[1.0, 0.0], [-2.0, 0.0]]], dtype=torch.float64)  # 0 in the hull: stationary
    orthogonal = torch.tensor([[[3.0, 0.0], [0.0, 4.0]]], dtype=torch.float64)  # min-norm point 12/5
    assert pareto_stationarity(opposite).tolist() == pytest.approx([0.0], abs=1e-12)
    assert pareto_stationarity(orthogonal).tolist() == pytest.approx([2.4])


def test_short_toy_run_writes_plot_and_tables_and_ls_misses_the_front(tmp_path: Path) -> None:
    out = tmp_path / "toy"
    # 3000 Adam steps at lr 0.01 cover about the distance of the reference 35,000 steps at 1e-3
    assert main(["toy", "--methods", "ls,mgda", "--steps", "3000", "--lr", "0.01", "--out", str(out),
                 "--no-progress"]) == 0
    assert (out / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "toy.json").read_text())
    rows = {m["method"]: m for m in summary["methods"]}
    assert set(rows) == {"ls", "mgda"} and summary["steps"] == 3000 and summary["scale"] == 0.1
    for row in rows.values():
        assert row["status"] == "ok"
        assert len(row["final_points"]) == len(row["distances"]) == len(row["stationarity"]) == 5
        assert row["trajectory"][0] == [list(p) for p in START_POINTS]
        assert row["trajectory"][-1] == row["final_points"] and row["trace_steps"][-1] == 3000
    # the known picture: from (9, 9) LS settles in the valley of the upper half-plane, far from the
    # Pareto set, while MGDA heads for it
    far_start = START_POINTS.index((9.0, 9.0))
    assert rows["ls"]["distances"][far_start] > 5.0
    assert rows["mgda"]["distances"][far_start] < 2.0
    assert sum(rows["mgda"]["distances"]) < sum(rows["ls"]["distances"])
    table = (out / "toy.md").read_text()
    assert "| method | family | status | reached | max distance | max stationarity | seconds |" in table
    assert "| mgda | gradient-manipulation | ok |" in table
    assert table.count("| ls | (") == 5  # one per-start row each


def test_toy_rejects_unknown_methods_and_bad_hparams(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["toy", "--methods", "ls,nosuch", "--steps", "10", "--out", str(tmp_path / "a")]) == 2
    assert "unknown method 'nosuch'; valid methods:" in capsys.readouterr().err
    assert main(["toy", "--methods", "mgda", "--hp", "mgda.solver=simplex", "--steps", "10",
                 "--out", str(tmp_path / "b")]) == 2
    assert "solver='simplex' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("runner", ["run_method", "run_method_with_cost"])
@pytest.mark.parametrize("convention, expected", [("natural", 2.0), ("reference", 1.0)])
def test_the_toy_runner_scales_updates_by_the_methods_scale_convention(monkeypatch: pytest.MonkeyPatch, runner: str,
                                                                        convention: str, expected: float) -> None:
    """FAMO's weights sum to 1, so its update is ×K (K = 2) unless ``scale_convention=reference`` asks for
    the official code's plain Σ w_i g_i (Method.reference_scale = "sum")."""
    from mtlflow.experiments import trajectories

    seen: list[float] = []
    real_step = trajectories._step

    def recording_step(*args, **kwargs):
        seen.append(args[-1])
        return real_step(*args, **kwargs)

    monkeypatch.setattr(trajectories, "_step", recording_step)
    hparams = {} if convention == "natural" else {"scale_convention": "reference"}
    getattr(trajectories, runner)("famo", steps=2, hparams=hparams, starts=START_POINTS[:1])
    assert seen and set(seen) == {expected}
