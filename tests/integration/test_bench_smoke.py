"""``mtlflow bench`` on a tiny model: writes JSON and Markdown with the expected columns (no timing
targets are asserted here; the command measures, docs/research/toy-and-bench.md reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtlflow.cli import main
from mtlflow.experiments.bench import ENGINE_ROWS, CelebACNN, SyntheticCelebA

METHOD_KEYS = {"tasks", "method", "grad_wrt", "family", "cost", "requires", "status", "step_seconds_median",
               "engine_seconds_median", "solver_seconds_per_step", "solver_seconds_median", "peak_memory_bytes",
               "gradient_mode", "grad_backend", "ratio_to_ls", "solver_fraction", "hparams", "step_seconds_mean"}


def test_celeba_cnn_is_the_nine_layer_network() -> None:
    model = SyntheticCelebA(n_tasks=40).make_model()
    trunk = model.trunk
    assert isinstance(trunk, CelebACNN)
    convs = [m for m in trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in trunk.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs) == 7 and len(linears) == 2 and len(model.heads) == 40
    assert [c.out_channels for c in convs] == [64, 128, 128, 256, 256, 512, 512]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in trunk.modules()) == 3
    out = model(torch.zeros(2, 3, 64, 64))
    assert len(out) == 40 and out[0].shape == (2, 1)


def test_tiny_bench_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--methods", "mgda,mgdaub,famo", "--tasks", "2,3", "--width", "2", "--image-size", "16",
                 "--batch-size", "4", "--steps", "1", "--warmup", "1", "--grad-wrt", "parameters,representation",
                 "--threads", "1", "--hp", "famo.gamma=0", "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "bench.json").read_text())
    assert summary["setting"]["task_counts"] == [2, 3] and summary["setting"]["auto_backend"] == "loop"
    rows = summary["methods"]
    # LS is always measured first in every K (the ratios refer to it); MGDA also in representation mode
    assert [(r["tasks"], r["method"], r["grad_wrt"]) for r in rows] == [
        (k, m, w) for k in (2, 3) for m, w in [("ls", "parameters"), ("mgda", "parameters"),
                                                ("mgda", "representation"), ("mgdaub", "representation"),
                                                ("famo", "parameters")]]
    for r in rows:
        assert set(r) == METHOD_KEYS, set(r) ^ METHOD_KEYS
        assert r["status"] == "ok", r
        assert r["step_seconds_median"] > 0 and r["peak_memory_bytes"] > 0
    modes = {(r["method"], r["grad_wrt"]): r["gradient_mode"] for r in rows}
    assert modes == {("ls", "parameters"): "losses", ("mgda", "parameters"): "jacobian",
                     ("mgda", "representation"): "representation", ("mgdaub", "representation"): "representation",
                     ("famo", "parameters"): "losses"}
    assert all(r["ratio_to_ls"] == pytest.approx(1.0) for r in rows if r["method"] == "ls")
    assert {r["method"]: r["hparams"] for r in rows}["famo"] == {"gamma": 0}
    assert all(r["solver_seconds_per_step"] > 0 for r in rows if r["method"].startswith("mgda"))
    assert set(summary["engine"]) == {"2", "3"}
    for k_rows in summary["engine"].values():
        assert list(k_rows) == list(ENGINE_ROWS)
        for name, r in k_rows.items():
            assert r["status"] == "ok", (name, r)
            assert r["seconds_median"] > 0 and r["ratio_to_plain_loop"] > 0
    assert {t["target"] for t in summary["targets"]} >= {
        "O(1) step <= 1.05x LS", "O(K) solver <= 10% of the step", "representation mode <= 1.3x LS",
        "engine (auto) <= plain K-loop", "engine (auto) faster than TorchJD autojac"}
    table = (out / "bench.md").read_text()
    assert ("| K | method | grad wrt | mode | cost | step ms | × LS | mean step ms | engine ms | solver ms/step | "
            "solver % | peak MB | status |") in table
    assert "| K | backend | ms | × plain loop | × single backward | status |" in table
    assert "| target | method | K | value | pass |" in table
    assert table.count("| 3 | mgda |") == 2 and table.count("| 3 | famo(gamma=0) |") == 1


def test_bench_rejects_bad_task_counts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--tasks", "2,zero", "--out", str(tmp_path / "b")]) == 2
    assert "--tasks must be a comma-separated list of positive integers" in capsys.readouterr().err
    assert main(["bench", "--methods", "ls", "--engine", "loop,warp", "--out", str(tmp_path / "c")]) == 2
    assert "unknown engine row(s) warp" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
