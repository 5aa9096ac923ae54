"""`dvc repro` of the project's dvc.yaml on a tiny params.yaml, in a throw-away git+DVC repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DVC_NO_ANALYTICS"] = "1"
    return env


def _run(args, cwd):
    return subprocess.run(args, cwd=cwd, env=_env(), check=True, capture_output=True, text=True)


@pytest.mark.slow
def test_dvc_repro_tiny(tmp_path):
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["options"] = {"n_train": 300, "n_val": 100, "n_test": 100}
    params["train"].update(methods=["ls", "fairgrad"], epochs=1, options={"batch_size": 100})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], tmp_path)
    _run([sys.executable, "-m", "dvc", "init", "-q"], tmp_path)
    _run([sys.executable, "-m", "dvc", "repro"], tmp_path)
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert set(summary) == {"ls", "fairgrad(alpha=1.0)"}
    assert all("delta_m" in v for v in summary.values())
    assert (tmp_path / "reports" / "latest" / "report.html").is_file()
    shown = _run([sys.executable, "-m", "dvc", "metrics", "show", "--json"], tmp_path).stdout
    assert "metrics/train/ls-s0.json" in shown
    again = _run([sys.executable, "-m", "dvc", "repro"], tmp_path).stdout
    assert "up to date" in again
