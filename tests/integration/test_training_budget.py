"""Budgets that train, early stopping, the best validation epoch's weights, the convergence flag, the thread
count, and runs that diverge in their last step -- through the trainer and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtlflow import jobs

CLI = [sys.executable, "-m", "mtlflow"]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_early_stopping_selects_the_best_validation_epoch_and_exports_its_weights(multimnist_small: Path,
                                                                                  tmp_path: Path) -> None:
    run = tmp_path / "run"
    # 256 training rows: batch <= 256 // 16 = 16 (16 steps an epoch); at least 48 steps = 3 epochs; stop after 1
    # epoch without a better validation score
    result = jobs.train(multimnist_small, run, epochs=40, batch_size=64, lr=0.05, min_steps=48,
                        min_steps_per_epoch=16, patience=1, progress=False)
    info, metrics = read_json(run / "run.json"), read_json(run / "metrics.json")
    assert info["budget"]["batch_size"] == 16 and info["budget"]["steps_per_epoch"] == 16
    assert info["config"]["batch_size"] == 16 and info["budget"]["requested_batch_size"] == 64
    epochs = metrics["epochs"]
    scores = [e["val_score"] for e in epochs]
    best = scores.index(min(scores))
    training = info["training"]
    assert metrics["selection"] == {**metrics["selection"], "rule": "best-val", "split_used_for_selection": "val"}
    assert training["best_epoch"] == epochs[best]["epoch"] and training == result["training"] == metrics["training"]
    # it stopped exactly one epoch after its best, once the 48 steps were done, well before 40 epochs
    assert training["stopped_early"] and len(epochs) == max(best + 2, 3) < 40
    # its validation score stopped improving, but 64 val rows cannot rank epochs: never called converged
    assert not training["converged"] and training["convergence"].startswith("validation split too small")
    assert all(s >= scores[best] for s in scores[best + 1:])
    assert best < len(epochs) - 1, "the selected epoch is not the last one, so the test tells them apart"
    assert metrics["final"] == {split: epochs[best]["splits"][split] for split in ("val", "test")}
    # model.pt holds that epoch's weights: evaluating it gives that epoch's val metrics, not the last epoch's
    evaluation = jobs.evaluate(run, multimnist_small, split="val", out_file=tmp_path / "eval.json")
    for task, values in evaluation["metrics"].items():
        assert values["acc"] == epochs[best]["splits"]["val"][task]["acc"]
        assert values["loss"] == pytest.approx(epochs[best]["splits"]["val"][task]["loss"], rel=1e-5)
    assert evaluation["metrics"] != {t: epochs[-1]["splits"]["val"][t] for t in evaluation["metrics"]}


def test_the_cli_records_the_threads_and_says_a_short_run_did_not_converge(multimnist_small: Path,
                                                                           tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run([*CLI, "train", "--data", str(multimnist_small), "--out", str(run), "--epochs", "1",
                           "--batch-size", "64", "--max-steps-per-epoch", "2", "--threads", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = read_json(run / "run.json")
    assert info["threads"] == 1 and info["config"]["threads"] == 1
    assert info["converged"] is False and info["training"]["convergence"].startswith("not converged: train longer")
    assert "not converged: train longer" in proc.stderr.splitlines()[-1]
    assert json.loads(proc.stdout)["run_dir"] == str(run)  # stdout stays one JSON line


@pytest.mark.parametrize("method", ["ls", "fairgrad"])
def test_a_run_that_diverges_in_its_last_step_fails_with_exit_4(method: str, multimnist_small: Path,
                                                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run([*CLI, "train", "--data", str(multimnist_small), "--out", str(run), "--method", method,
                           "--epochs", "1", "--max-steps-per-epoch", "1", "--batch-size", "64", "--optimizer", "sgd",
                           "--lr", "1e38", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "non-finite evaluation after epoch 1 (val/left/loss=nan" in proc.stderr and "lower --lr" in proc.stderr
    info = read_json(run / "run.json")
    assert info["status"] == "failed" and "NonFiniteLossError" in info["error"]
    assert not (run / "model.pt").exists()


def test_evaluate_refuses_a_model_that_gives_non_finite_losses(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, epochs=1, batch_size=64, max_steps_per_epoch=1, progress=False)
    blob = torch.load(run / "model.pt", weights_only=False)
    blob["state_dict"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                          for k, v in blob["state_dict"].items()}
    torch.save(blob, run / "model.pt")
    proc = subprocess.run([*CLI, "evaluate", str(run), "--data", str(multimnist_small)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"non-finite evaluation of {run} (test/left/loss=nan" in proc.stderr
    assert not (run / "evaluation.json").exists()
