"""run.json never keeps saying "running" because the disk is full (issue 29, item 8): the final status is
rewritten in place when there is no room for the atomic write's temporary copy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtlflow.core.errors import StorageError
from mtlflow.engine import rundir


def test_the_final_status_reaches_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    point = tmp_path / "fs"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(point)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root")
    try:
        monkeypatch.setattr(rundir, "run_info", lambda record, outcome: {"method": "ls"})
        record = SimpleNamespace(dist=SimpleNamespace(is_main=True), out_dir=point)
        rundir.write_run_json(record, "running")
        with open(point / "filler", "wb", buffering=0) as fh:
            with pytest.raises(OSError):
                while True:
                    fh.write(b"\0" * 4096)
        rundir.write_run_json(record, "failed", error="StorageError: no space")
        assert json.loads((point / "run.json").read_text()) == {"method": "ls", "status": "failed",
                                                                 "error": "StorageError: no space"}
        with pytest.raises(StorageError, match="no space left"):  # only a final status is rewritten in place
            rundir.write_run_json(record, "running")
        (point / "other").mkdir()  # no record to rewrite: the write's own error is the answer
        with pytest.raises(StorageError, match="no space left"):
            rundir.write_run_json(SimpleNamespace(dist=record.dist, out_dir=point / "other"), "failed")
    finally:
        subprocess.run(["umount", "--lazy", str(point)], check=False)  # lazy: even if a file is still open
