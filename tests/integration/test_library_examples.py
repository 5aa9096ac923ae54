"""The library-mode examples (examples/library/) run as a user runs them, in a fresh interpreter, and learn."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples" / "library"


def run_example(script: str, *args: str) -> subprocess.CompletedProcess:
    # one intra-op thread: the problem is tiny and the machine is shared
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def epoch_losses(stdout: str) -> list[float]:
    return [float(value) for value in re.findall(r"^epoch \d+ loss ([0-9.]+)", stdout, flags=re.MULTILINE)]


@pytest.mark.parametrize("method", ["upgrad", "famo"])
def test_plain_loop_example_learns(method):
    losses = epoch_losses(run_example("plain_loop.py", "--method", method, "--epochs", "4").stdout)
    assert len(losses) == 4
    assert losses[-1] < 0.6 * losses[0]


def test_lightning_manual_optimisation_example_learns_and_resumes_from_its_checkpoint():
    pytest.importorskip("lightning", reason="lightning is a development dependency (requirements-dev.txt)")
    stdout = run_example("lightning_manual.py", "--method", "uw", "--epochs", "3").stdout
    losses = epoch_losses(stdout)
    assert len(losses) == 4  # 3 epochs, then one more after resuming
    assert losses[-1] < losses[2] < 0.7 * losses[0]
    assert "resumed at step 24 and trained one more epoch" in stdout  # 3 epochs of 8 steps, from the checkpoint
