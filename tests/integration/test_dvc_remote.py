"""Data versioning against a real local DVC remote: push a prepared dataset, wipe the cache and every
workspace copy, pull the version back by its DVC hash, verify it, and train on it through the train
component (which re-checks both hashes recorded by prepare_data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow.benchmarks.base import read_manifest
from mtlflow.cli import main
from mtlflow.components.conftest import train_artifacts
from mtlflow.components.train.component import train
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.ops import dvc as dvc_io


def test_push_wipe_pull_verify_train(multimnist_small, tmp_path, capsys):
    workspace = tmp_path / "workspace" / "data"
    shutil.copytree(multimnist_small, workspace)
    remote, cache = tmp_path / "remote", tmp_path / "cache"

    assert main(["data", "push", "--data", str(workspace), "--remote", str(remote)]) == 0
    pushed = json.loads(capsys.readouterr().out)
    version = pushed["dvc_hash"]
    assert version == dvc_io.directory_md5(workspace) and pushed["nfiles"] == 5 and pushed["git_revision"]
    content_hash = read_manifest(workspace)["content_hash"]

    # a first pull fills the cache; then the cache and every workspace copy are wiped
    dvc_io.pull_dataset(version, str(remote), tmp_path / "first", cache_dir=cache)
    assert any(cache.rglob("*")), "the pull should have filled the DVC cache"
    for path in (workspace.parent, tmp_path / "first", cache):
        shutil.rmtree(path)

    assert main(["data", "pull", version, "--remote", str(remote), "--out", str(tmp_path / "pulled"),
                 "--cache-dir", str(cache)]) == 0
    pulled = Path(json.loads(capsys.readouterr().out)["out"])
    dvc_io.verify_directory(pulled, version)
    assert read_manifest(pulled)["content_hash"] == content_hash

    data = dsl.Dataset(uri=str(pulled), metadata={"content_hash": content_hash, "dvc_hash": version,
                                                   "dvc_remote": str(remote), "tasks": ["left", "right"]})
    arts = train_artifacts(tmp_path, "pulled")
    train.python_func(data=data, run_spec=json.dumps({"method": "ls", "seed": 0, "hparams": {}}), epochs=1,
                      train_options={"batch_size": 64, "max_steps_per_epoch": 2}, **arts)
    run = json.loads((Path(arts["run"].path) / "run.json").read_text())
    assert run["status"] == "completed" and run["data_hash"] == content_hash

    # a changed byte is another data version: verification and training refuse it
    (pulled / "manifest.json").write_text((pulled / "manifest.json").read_text() + " ")
    with pytest.raises(DataError, match="not the recorded data version"):
        dvc_io.verify_directory(pulled, version)
    with pytest.raises(DataError, match="not the recorded data version"):
        train.python_func(data=data, run_spec=json.dumps({"method": "ls", "seed": 0}), epochs=1,
                          train_options={}, **train_artifacts(tmp_path, "tampered"))


def test_missing_or_malformed_versions_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "remote").mkdir()
    with pytest.raises(DataError, match="failed") as missing:
        dvc_io.pull_dataset("0" * 32 + ".dir", str(tmp_path / "remote"), tmp_path / "out")
    assert "\n" not in str(missing.value) and not (tmp_path / "out").exists()
    with pytest.raises(InvalidParameterError, match="not a DVC directory hash"):
        dvc_io.pull_dataset("abc", str(tmp_path / "remote"), tmp_path / "out")
    assert main(["data", "pull", "abc", "--remote", str(tmp_path / "remote"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_remote_comes_from_the_environment_and_s3_gets_the_minio_endpoint(monkeypatch):
    monkeypatch.delenv(dvc_io.REMOTE_ENV, raising=False)
    assert dvc_io.resolve_remote("", "/mnt/mtlflow/data/dvc-remote") == "/mnt/mtlflow/data/dvc-remote"
    assert dvc_io.resolve_remote("", None) is None
    monkeypatch.setenv(dvc_io.REMOTE_ENV, "s3://bucket/dvc")
    assert dvc_io.resolve_remote("", "/default") == "s3://bucket/dvc"
    assert dvc_io.resolve_remote("/explicit", "/default") == "/explicit"
    monkeypatch.setenv(dvc_io.ENDPOINT_ENV, "http://minio:9000")
    assert dvc_io.remote_config("s3://bucket/dvc") == {"url": "s3://bucket/dvc", "endpointurl": "http://minio:9000"}
    assert dvc_io.remote_config("/local/dir") == {"url": "/local/dir"}
