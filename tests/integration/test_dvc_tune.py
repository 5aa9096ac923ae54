"""What DVC makes of the tune stage of this project's tuning/dvc.yaml and params.yaml (in a scratch git + DVC repository,
without running it): `dvc stage list` lists it with its output, `dvc dag` puts it after prepare, and it depends
on params.yaml's tune section and the sweep's budget."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _run(args, cwd) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_dvc_reads_the_tune_stage(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    _run(["git", "init", "-q"], repo)
    _run([sys.executable, "-m", "dvc", "init", "-q"], repo)
    (repo / "tuning").mkdir()
    for name in ("dvc.yaml", "params.yaml", ".dvcignore", "tuning/dvc.yaml"):
        shutil.copy(ROOT / name, repo / name)
    # the default pipeline never runs the search: it is not among ../dvc.yaml's stages
    assert "tune" not in _run([sys.executable, "-m", "dvc", "stage", "list"], repo).split()
    listed = _run([sys.executable, "-m", "dvc", "stage", "list", "tuning/dvc.yaml"], repo)
    assert any(line.split()[:2] == ["tuning/dvc.yaml:tune", "Outputs"] and "runs/tune" in line
               for line in listed.splitlines())
    dag = _run([sys.executable, "-m", "dvc", "dag", "--dot", "tuning/dvc.yaml:tune"], repo)
    assert '"prepare" -> "tuning/dvc.yaml:tune"' in dag and '"source" -> "prepare"' in dag
    stage = yaml.safe_load((ROOT / "tuning" / "dvc.yaml").read_text())["stages"]["tune"]
    assert stage["wdir"] == ".."
    assert stage["params"] == ["tune", "epochs", "train_options"]
    section = yaml.safe_load((ROOT / "params.yaml").read_text())["tune"]
    assert set(section) == {"methods", "budget_trials", "seed", "retrain_seeds"}
