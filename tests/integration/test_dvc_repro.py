"""The project's dvc.yaml on a tiny params.yaml in a throw-away git+DVC repository:
`dvc exp run -S dvc.experiment_method=fairgrad` runs prepare -> train -> evaluate -> aggregate plus the
research stage for the chosen method; then `dvc repro` is a no-op, and the prepared data survives a
push to a local remote, a wiped cache and workspace, and a pull."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DVC_NO_ANALYTICS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args, cwd):
    return subprocess.run(args, cwd=cwd, env=_env(), check=True, capture_output=True, text=True)


def _dvc(cwd, *args):
    return _run([sys.executable, "-m", "dvc", *args], cwd)


@pytest.mark.slow
def test_dvc_exp_run_repro_push_pull_tiny(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert "experiment_method" in params["dvc"] and "methods" in params
    params.update(data_options={"n_train": 300, "n_val": 100, "n_test": 100}, methods=["ls"], epochs=1,
                  train_options={"batch_size": 100})
    params["dvc"]["experiment_method"] = "ls"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], repo)
    _run(["git", "config", "user.email", "ci@example.com"], repo)
    _run(["git", "config", "user.name", "ci"], repo)
    _dvc(repo, "init", "-q")
    _dvc(repo, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "tiny mtlflow project"], repo)

    _dvc(repo, "exp", "run", "-S", "dvc.experiment_method=fairgrad")
    assert yaml.safe_load((repo / "params.yaml").read_text())["dvc"]["experiment_method"] == "fairgrad"
    experiment = json.loads((repo / "metrics" / "experiment.json").read_text())
    assert "delta_m" in experiment and "test.left.acc" in experiment
    assert (repo / "runs" / "experiment" / "fairgrad-s0" / "model.pt").is_file()
    assert "fairgrad" in _dvc(repo, "exp", "show", "--md").stdout
    # the sweep: train -> evaluate -> aggregate
    summary = json.loads((repo / "metrics" / "summary.json").read_text())
    assert set(summary) == {"ls"} and "delta_m" in summary["ls"]
    evaluated = json.loads((repo / "metrics" / "evaluate.json").read_text())["ls-s0"]
    assert evaluated == json.loads((repo / "metrics" / "train" / "ls-s0.json").read_text())
    assert (repo / "reports" / "latest" / "report.html").is_file()
    assert "up to date" in _dvc(repo, "repro").stdout

    # data versioning: push, wipe the cache and the workspace copy, pull, verify
    manifest = json.loads((repo / "data" / "prepared" / "manifest.json").read_text())
    _dvc(repo, "push")
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "data" / "prepared")
    _dvc(repo, "pull", "prepare")
    from mtlflow import jobs

    _, restored = jobs.load_prepared(repo / "data" / "prepared", expected_hash=manifest["content_hash"])
    assert restored.content_hash == manifest["content_hash"]
    assert "prepare" not in _dvc(repo, "status", "prepare").stdout
