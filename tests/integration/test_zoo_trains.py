"""Every registered method trains through the real trainer, without NaN, and resumes exactly.

Parametrised over ``mtlflow.methods.available()``, so a method added to the package is covered
without editing this file:

* the CAGrad toy problem (start point (0, 0), 100 Adam steps): the run completes, the losses are
  finite and the point moves towards the Pareto set or both objectives decrease;
* tiny MultiMNIST (256 images, 3 steps per epoch): a 1-epoch run has finite losses and metrics, and
  1 epoch + ``resume`` to 2 epochs gives exactly the model, metrics and method state of 2 epochs in
  one go.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mtlflow import jobs, methods
from mtlflow.benchmarks.toy import START_POINTS, distance_to_pareto_set, toy_losses

ALL_METHODS = methods.available()
TOY_START = 1
#: lower bounds of the toy objectives (scale 0.1), for methods built on log-losses or loss ratios
TOY_MIN_LOSSES = [-21.0 * 0.1, -21.0]
#: shorter schedules so that a 2-epoch run exercises the method's state (nadir, loss windows)
MULTIMNIST_HPARAMS: dict[str, dict[str, Any]] = {
    "stch": {"warmup_epochs": 0},
    "dwa": {"window": "iterations", "iteration_window": 2},
    # the annealed schedule follows the progress through the horizon planned at the run's start, which
    # a resume keeps (extending a 1-epoch run to 2 epochs does not re-plan it); a 2-epoch run in one go
    # plans another horizon, so only the deterministic rays are the same in both
    "palora": {"schedule": "deterministic"},
}
#: method state that records the run's plan, not its progress (kept across a resume by design)
PLANNED_STATE = {"palora": {"total_steps"}}
#: methods that need layers to adapt: the toy model is the point itself
TOY_INAPPLICABLE = {"palora": "its adapters go on Conv2d/Linear layers; the toy model has none"}
RUN = {"batch_size": 32, "max_steps_per_epoch": 3, "progress": False}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def toy_hparams(name: str) -> dict[str, Any]:
    return {"min_losses": TOY_MIN_LOSSES} if "min_losses" in methods.get(name).hparams else {}


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "start1"
    jobs.prepare("toy", out, start=TOY_START, steps_per_epoch=100)
    return out


@pytest.mark.parametrize("name", ALL_METHODS)
def test_method_trains_on_toy(name: str, toy_data: Path, tmp_path: Path) -> None:
    if name in TOY_INAPPLICABLE:
        pytest.skip(f"{name}: {TOY_INAPPLICABLE[name]}")
    run = tmp_path / "run"
    jobs.train(toy_data, run, method=name, hparams=toy_hparams(name), epochs=1, lr=0.05, progress=False)
    assert read_json(run / "run.json")["status"] == "completed"
    x = torch.load(run / "model.pt", weights_only=False)["state_dict"]["trunk.x"]
    start = torch.tensor(START_POINTS[TOY_START], dtype=torch.float64)
    assert torch.isfinite(x).all()
    moved_closer = float(distance_to_pareto_set(x)) < float(distance_to_pareto_set(start))
    both_decreased = bool(torch.all(toy_losses(x) < toy_losses(start)))
    assert moved_closer or both_decreased, (name, x.tolist())
    epoch = read_json(run / "metrics.json")["epochs"][0]
    assert all(math.isfinite(v) for v in epoch["train_loss"].values())


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Exact, recursive equality of checkpointed method states."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", ALL_METHODS)
def test_method_trains_on_multimnist_and_resumes_exactly(name: str, multimnist_small: Path, tmp_path: Path) -> None:
    opts = dict(method=name, hparams=MULTIMNIST_HPARAMS.get(name, {}), **RUN)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    jobs.train(multimnist_small, straight, epochs=2, **opts)
    jobs.train(multimnist_small, resumed, epochs=1, **opts)
    first = read_json(resumed / "metrics.json")["epochs"][0]
    assert all(math.isfinite(v) for v in first["train_loss"].values()), first["train_loss"]
    for split in ("val", "test"):
        for task_metrics in first["splits"][split].values():
            assert all(math.isfinite(v) for v in task_metrics.values())
    jobs.train(multimnist_small, resumed, epochs=2, resume=True, **opts)

    model_a = torch.load(straight / "model.pt", weights_only=False)["state_dict"]
    model_b = torch.load(resumed / "model.pt", weights_only=False)["state_dict"]
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key
    metrics_a, metrics_b = read_json(straight / "metrics.json"), read_json(resumed / "metrics.json")
    assert metrics_a["final"] == metrics_b["final"]
    for ea, eb in zip(metrics_a["epochs"], metrics_b["epochs"], strict=True):
        assert ea["train_loss"] == eb["train_loss"]
        assert ea.get("method_weights_mean") == eb.get("method_weights_mean")
    ckpt_a = torch.load(straight / "checkpoint.pt", weights_only=False)
    ckpt_b = torch.load(resumed / "checkpoint.pt", weights_only=False)
    planned = PLANNED_STATE.get(name, set())
    assert_same({k: v for k, v in ckpt_a["method"].items() if k not in planned},
                {k: v for k, v in ckpt_b["method"].items() if k not in planned}, name)
