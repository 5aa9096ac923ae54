"""Atomic writes on a file system that refuses them (issue 29, item 8): a full or read-only file system is
one StorageError line naming the file, never a traceback (torch.save's RuntimeError included), and leaves
no temporary file behind."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from file_system_support import fill, tmpfs_mounts
from mtlflow.core import atomic
from mtlflow.core.errors import StorageError


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    yield from tmpfs_mounts(tmp_path)


WRITERS = {
    "write_json": lambda target: atomic.write_json(target, {"a": 1}),
    "torch_save": lambda target: atomic.torch_save({"w": torch.zeros(4096)}, target),
    "atomic_dir": lambda target: _write_dir(target),
}


def _write_dir(target: Path) -> None:
    with atomic.atomic_dir(target) as tmp:
        (tmp / "x.bin").write_bytes(b"\0" * 8192)


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("state", ["full", "read-only"])
def test_a_refused_write_is_one_storage_error_naming_the_file(writer: str, state: str, tmpfs) -> None:
    point = tmpfs("size=16k" if state == "full" else "ro,size=16k")
    if state == "full":
        fill(point)
    before = sorted(p.name for p in point.iterdir())
    target = point / "out"
    expected = "no space left on the device" if state == "full" else "the file system is read-only"
    with pytest.raises(StorageError, match=f"^cannot write {target}: {expected}; "):
        WRITERS[writer](target)
    assert sorted(p.name for p in point.iterdir()) == before, "a temporary file was left behind"


def test_other_os_errors_pass_unchanged(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        with atomic.atomic_path(tmp_path / "x"):
            open(tmp_path / "missing" / "y")


def test_rewrite_in_place_fits_where_a_temporary_copy_does_not(tmpfs) -> None:
    point = tmpfs("size=16k")
    target = point / "run.json"
    atomic.write_json(target, {"status": "running"})
    fill(point)
    with pytest.raises(StorageError):
        atomic.write_json(target, {"status": "failed", "error": "ENOSPC"})
    atomic.rewrite_json_in_place(target, {"status": "failed", "error": "ENOSPC"})
    assert json.loads(target.read_text()) == {"status": "failed", "error": "ENOSPC"}
