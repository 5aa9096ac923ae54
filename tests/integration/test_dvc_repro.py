"""The project's dvc.yaml on a tiny params.yaml in a throw-away git+DVC repository, with a task spec of a
real table (ClinTox molecules): `dvc exp run -S dvc.experiment_method=fairgrad` runs prepare -> train ->
evaluate -> aggregate plus the research stage for the chosen method; then `dvc repro` re-reads only the
data's source, the prepared data survives a push to a local remote, a wiped cache and workspace, and a
pull, and a new version of the table re-runs the pipeline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import realdata

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


def assert_only_the_source_stage_runs(output: str) -> None:
    """`dvc repro` with nothing changed: the source stage re-reads the inputs, every other stage is skipped."""
    ran = [line for line in output.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'source':"], output
    assert "Stage 'prepare' didn't change, skipping" in output


def init_repo(repo: Path, remote: Path) -> None:
    _run(["git", "init", "-q"], repo)
    _run(["git", "config", "user.email", "ci@example.com"], repo)
    _run(["git", "config", "user.name", "ci"], repo)
    _dvc(repo, "init", "-q")
    _dvc(repo, "remote", "add", "-d", "local", str(remote))
    _run(["git", "add", "-A"], repo)
    _run(["git", "commit", "-qm", "tiny mtlflow project"], repo)


def clintox_project(repo: Path, rows: int) -> pd.DataFrame:
    """A task spec of the first ``rows`` real ClinTox molecules (two binary tasks) and its params.yaml."""
    clintox = pd.read_csv(realdata("chem", "clintox.csv"))
    clintox.head(rows).to_csv(repo / "clintox.csv", index=False)
    (repo / "clintox.yaml").write_text(
        "name: clintox\nsource: {table: clintox.csv, smiles: smiles}\n"
        "tasks:\n  - {name: FDA_APPROVED, type: binary}\n  - {name: CT_TOX, type: binary}\n"
        "model: {hidden: [16]}\n")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert "experiment_method" in params["dvc"] and "methods" in params
    params.update(spec="clintox.yaml", data_options={}, methods=["ls"], epochs=1, train_options={"batch_size": 100},
                  method_hparams={})
    params["dvc"] = {"reference_tasks": ["FDA_APPROVED", "CT_TOX"], "experiment_method": "ls"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    return clintox


@pytest.mark.slow
def test_dvc_exp_run_repro_push_pull_and_a_new_table_version(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    clintox = clintox_project(repo, 300)
    init_repo(repo, tmp_path / "remote")

    _dvc(repo, "exp", "run", "-S", "dvc.experiment_method=fairgrad")
    assert yaml.safe_load((repo / "params.yaml").read_text())["dvc"]["experiment_method"] == "fairgrad"
    experiment = json.loads((repo / "metrics" / "experiment.json").read_text())
    assert "delta_m" in experiment and "test.CT_TOX.roc_auc" in experiment
    assert (repo / "runs" / "experiment" / "fairgrad-s0" / "model.pt").is_file()
    assert "fairgrad" in _dvc(repo, "exp", "show", "--md").stdout
    # the sweep: train -> evaluate -> aggregate, on the spec's data set
    summary = json.loads((repo / "metrics" / "summary.json").read_text())
    assert set(summary) == {"ls"} and "delta_m" in summary["ls"]
    evaluated = json.loads((repo / "metrics" / "evaluate.json").read_text())["ls-s0"]
    assert evaluated == json.loads((repo / "metrics" / "train" / "ls-s0.json").read_text())
    assert "mtlflow report: clintox" in (repo / "reports" / "latest" / "report.html").read_text()
    assert_only_the_source_stage_runs(_dvc(repo, "repro").stdout)

    # data versioning: push, wipe the cache and the workspace copy, pull, verify
    manifest = json.loads((repo / "data" / "prepared" / "manifest.json").read_text())
    assert manifest["label"] == "clintox" and manifest["source"]["rows"] == 300
    _dvc(repo, "push")
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "data" / "prepared")
    _dvc(repo, "pull", "prepare")
    from mtlflow import jobs

    _, restored = jobs.load_prepared(repo / "data" / "prepared", expected_hash=manifest["content_hash"])
    assert restored.content_hash == manifest["content_hash"]
    assert "prepare" not in _dvc(repo, "status", "prepare").stdout

    # a new version of the table: prepare and everything after it run again
    clintox.head(320).to_csv(repo / "clintox.csv", index=False)
    rerun = _dvc(repo, "repro").stdout
    assert "Running stage 'prepare'" in rerun and "Running stage 'aggregate'" in rerun
    second = json.loads((repo / "data" / "prepared" / "manifest.json").read_text())
    assert second["source"]["rows"] == 320 and second["content_hash"] != manifest["content_hash"]
