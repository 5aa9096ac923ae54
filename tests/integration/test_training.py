"""The trainer through ``mtlflow.jobs.train``: learning, exact resume, run outputs and failure modes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN
from mtlflow import jobs
from mtlflow.core.errors import DataError, InvalidParameterError, NonFiniteLossError


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def model_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=False)["state_dict"]


# -- (a) it learns --------------------------------------------------------------------------------

@pytest.mark.slow
def test_ls_multimnist_reaches_85_percent_on_both_tasks(multimnist_data: Path, tmp_path: Path) -> None:
    # 10k overlaid training images, 4 epochs: ~0.90 test accuracy per task (measured), < 20 s on 2 cores
    result = jobs.train(multimnist_data, tmp_path / "run", method="ls", epochs=4, batch_size=128, progress=False)
    final = result["final"]["test"]
    assert final["left"]["acc"] >= 0.85, final
    assert final["right"]["acc"] >= 0.85, final
    # chance level is 0.1: the first epoch must already be far above it and the loss must fall
    epochs = read_json(tmp_path / "run" / "metrics.json")["epochs"]
    first, last = epochs[0]["train_loss"], epochs[-1]["train_loss"]
    assert last["left"] < first["left"] and last["right"] < first["right"]


# -- (b) resume is exact --------------------------------------------------------------------------

@pytest.mark.parametrize("method,hparams", [("ls", {}), ("famo", {}), ("mgda", {}), ("fairgrad", {"alpha": 2.0})])
def test_resume_matches_uninterrupted_run(method: str, hparams: dict, multimnist_small: Path, tmp_path: Path) -> None:
    opts = dict(method=method, hparams=hparams, batch_size=32, max_steps_per_epoch=3, progress=False)
    run_a, run_b = tmp_path / "A", tmp_path / "B"
    jobs.train(multimnist_small, run_a, epochs=3, **opts)
    # "killed" after epoch 2: the 2-epoch run leaves checkpoint.pt of epoch 2 (epochs is not part of
    # the configuration fingerprint), then the same command with --resume finishes epoch 3
    jobs.train(multimnist_small, run_b, epochs=2, **opts)
    assert torch.load(run_b / "checkpoint.pt", weights_only=False)["epoch"] == 2
    result = jobs.train(multimnist_small, run_b, epochs=3, resume=True, **opts)
    assert result["epochs"] == 3

    state_a, state_b = model_state(run_a), model_state(run_b)
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key
    metrics_a, metrics_b = read_json(run_a / "metrics.json"), read_json(run_b / "metrics.json")
    assert metrics_a["final"] == metrics_b["final"]
    assert [e["epoch"] for e in metrics_b["epochs"]] == [1, 2, 3]
    for ea, eb in zip(metrics_a["epochs"], metrics_b["epochs"], strict=True):
        assert ea["splits"] == eb["splits"]
        assert ea["train_loss"] == eb["train_loss"]
        assert ea.get("method_weights_mean") == eb.get("method_weights_mean")
    ckpt_a = torch.load(run_a / "checkpoint.pt", weights_only=False)
    ckpt_b = torch.load(run_b / "checkpoint.pt", weights_only=False)
    assert ckpt_a["global_step"] == ckpt_b["global_step"] == 9
    if method == "famo":  # the method's own state continued exactly too
        assert torch.equal(ckpt_a["method"]["logits"], ckpt_b["method"]["logits"])
        assert not torch.equal(ckpt_a["method"]["logits"], torch.zeros(2))


def test_resume_with_a_different_configuration_is_rejected(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, epochs=1, lr=1e-3, **TINY_RUN)
    with pytest.raises(InvalidParameterError, match="different configuration"):
        jobs.train(multimnist_small, run, epochs=2, lr=2e-3, resume=True, **TINY_RUN)
    with pytest.raises(InvalidParameterError, match="different configuration"):
        jobs.train(multimnist_small, run, epochs=2, method="famo", resume=True, **TINY_RUN)
    # the checkpoint was not touched
    assert torch.load(run / "checkpoint.pt", weights_only=False)["epoch"] == 1


def test_resume_on_other_data_is_rejected(multimnist_small: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-data"
    jobs.prepare("multimnist", other, n_train=256, n_val=64, n_test=64, seed=1)
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, epochs=1, **TINY_RUN)
    with pytest.raises(DataError, match="other data"):
        jobs.train(other, run, epochs=2, resume=True, **TINY_RUN)


# -- (c) run outputs ------------------------------------------------------------------------------

def test_run_writes_run_json_and_metrics(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, method="mgda", epochs=2, **TINY_RUN)
    info = read_json(run / "run.json")
    assert info["status"] == "completed"
    assert info["benchmark"] == "multimnist" and info["kind"] == "multi-task"
    assert info["tasks"] == ["left", "right"]
    assert info["config"]["method"] == "mgda" and info["config"]["epochs"] == 2
    manifest = read_json(multimnist_small / "manifest.json")
    assert info["data_hash"] == manifest["content_hash"]

    metrics = read_json(run / "metrics.json")
    assert metrics["selection"]["rule"] == "last"
    assert metrics["selection"]["split_used_for_selection"] is None
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for epoch in metrics["epochs"]:
        assert set(epoch["train_loss"]) == {"left", "right"}
        assert all(v > 0 for v in epoch["train_loss"].values())
        assert epoch["step_seconds_median"] > 0
        assert epoch["peak_memory_bytes"] > 0
        assert epoch["steps"] == 2
        for split in ("val", "test"):
            for task in ("left", "right"):
                assert 0.0 <= epoch["splits"][split][task]["acc"] <= 1.0
        assert "solver_seconds_median" in epoch  # gradient method
        weights = epoch["method_weights_mean"]
        assert sum(weights.values()) == pytest.approx(1.0)  # MGDA weights lie on the simplex
    assert metrics["final"] == {s: metrics["epochs"][-1]["splits"][s] for s in ("val", "test")}
    for name in ("checkpoint.pt", "model.pt"):
        assert (run / name).is_file()


def test_single_task_run_is_marked_single_task(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, tasks=["right"], epochs=1, **TINY_RUN)
    info = read_json(run / "run.json")
    assert info["kind"] == "single-task" and info["tasks"] == ["right"]
    assert set(read_json(run / "metrics.json")["final"]["test"]) == {"right"}


# -- (d) non-finite losses ------------------------------------------------------------------------

def test_nan_loss_raises_and_marks_run_failed(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match="non-finite loss"):
        jobs.train(multimnist_small, run, epochs=1, lr=1e30, batch_size=32, max_steps_per_epoch=5,
                   progress=False)
    info = read_json(run / "run.json")
    assert info["status"] == "failed"
    assert "NonFiniteLossError" in info["error"]
    assert not (run / "model.pt").exists()


def test_nan_task_loss_is_reported_by_name(multimnist_small: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from mtlflow.engine.trainer import Trainer

    original = Trainer.task_losses

    def poisoned(self, preds, targets):
        losses = original(self, preds, targets)
        return [losses[0], losses[1] * float("nan")]

    monkeypatch.setattr(Trainer, "task_losses", poisoned)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"right=nan") as exc:
        jobs.train(multimnist_small, run, method="mgda", epochs=1, **TINY_RUN)
    assert "left" not in str(exc.value)
    assert read_json(run / "run.json")["status"] == "failed"


# -- (f) selection rule ---------------------------------------------------------------------------

def test_select_last_k_is_mean_of_last_epochs(multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    jobs.train(multimnist_small, run, epochs=3, select="last-k:2", **TINY_RUN)
    metrics = read_json(run / "metrics.json")
    assert metrics["selection"]["rule"] == "last-k:2"
    e2, e3 = metrics["epochs"][1]["splits"], metrics["epochs"][2]["splits"]
    for split in ("val", "test"):
        for task in ("left", "right"):
            for name in ("acc", "loss"):
                expected = statistics.fmean([e2[split][task][name], e3[split][task][name]])
                assert metrics["final"][split][task][name] == pytest.approx(expected, rel=1e-12)
    # epochs 2 and 3 differ, so the mean is not just the last epoch
    assert e2["test"]["left"]["loss"] != e3["test"]["left"]["loss"]


@pytest.mark.parametrize("rule", ["best", "last-k:0", "last-k:x"])
def test_invalid_selection_rule_is_rejected(rule: str, multimnist_small: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="selection rule"):
        jobs.train(multimnist_small, tmp_path / "run", epochs=1, select=rule, **TINY_RUN)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [{"epochs": 0}, {"lr": -1.0}, {"optimizer": "lbfgs"}, {"batch_size": 0},
                                       {"max_steps_per_epoch": 0}, {"bogus": 1}])
def test_invalid_training_options_are_rejected(overrides: dict, multimnist_small: Path, tmp_path: Path) -> None:
    opts = {**TINY_RUN, "epochs": 1, **overrides}
    with pytest.raises(InvalidParameterError):
        jobs.train(multimnist_small, tmp_path / "run", **opts)
    assert not (tmp_path / "run").exists()
