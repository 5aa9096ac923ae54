"""A training process killed mid-epoch (SIGKILL, no chance to clean up) resumes from its last
checkpoint with `mtlflow train ... --resume` -- what a retried or preempted pipeline task does -- and
reaches exactly the final metrics of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mtlflow import jobs

EPOCHS = 3


def train_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mtlflow", "train", "--data", str(data), "--out", str(out), "--method", "famo",
            "--epochs", str(EPOCHS), "--batch-size", "50", "--seed", "7", "--device", "cpu", "--no-progress", *extra]


#: early stopping after one epoch without a better validation score, the best epoch's weights exported: the
#: resumed run must stop at the same epoch and export the same epoch's weights (kept in the checkpoint)
EARLY_STOPPING = ("--patience", "1", "--min-steps-per-epoch", "12")


@pytest.mark.slow
@pytest.mark.parametrize("budget", [(), EARLY_STOPPING], ids=["fixed-epochs", "early-stopping"])
def test_sigkilled_training_resumes_to_the_same_final_metrics(tmp_path, budget):
    data = tmp_path / "data"
    jobs.prepare("multimnist", data, n_train=600, n_val=100, n_test=100)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    reference = subprocess.Popen(train_cmd(data, tmp_path / "uninterrupted", *budget), env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim_dir = tmp_path / "killed"
    victim = subprocess.Popen(train_cmd(data, victim_dir, *budget), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (victim_dir / "checkpoint.pt").exists():
        assert victim.poll() is None, "training ended before writing its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint after 240 s"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL

    killed_at = torch.load(victim_dir / "checkpoint.pt", weights_only=False)["epoch"]
    assert 1 <= killed_at < EPOCHS, "the kill must land before the run finished"
    assert json.loads((victim_dir / "run.json").read_text())["status"] == "running"
    assert not (victim_dir / "model.pt").exists()

    resumed = subprocess.run(train_cmd(data, victim_dir, *budget, "--resume"), env=env, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert reference.wait(timeout=300) == 0, reference.stderr.read()

    a = json.loads((tmp_path / "uninterrupted" / "metrics.json").read_text())
    b = json.loads((victim_dir / "metrics.json").read_text())
    assert b["final"] == a["final"]
    assert [e["splits"] for e in b["epochs"]] == [e["splits"] for e in a["epochs"]]
    assert b["training"] == a["training"]
    assert b["selection"]["rule"] == ("best-val" if budget else "last")
    assert len(b["epochs"]) == EPOCHS if not budget else len(b["epochs"]) == len(a["epochs"])
    weights_a = torch.load(tmp_path / "uninterrupted" / "model.pt", weights_only=False)["state_dict"]
    weights_b = torch.load(victim_dir / "model.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
