"""What the output-safety tests share: a snapshot of a tree (equal snapshots: nothing written or deleted) and
small tmpfs file systems for the full and read-only cases (root only; the tests skip with the reason otherwise)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def snapshot(*roots: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``roots`` with (is_dir, size, mtime): equal snapshots = nothing written or deleted."""
    out = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            out[str(path)] = (path.is_dir(), st.st_size if path.is_file() else 0, st.st_mtime_ns)
    return out


def tmpfs_mounts(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """For a fixture: ``mount(options)`` mounts a tmpfs under ``tmp_path`` (e.g. ``"size=16k"``, ``"ro,size=16k"``);
    every mount is removed afterwards."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): the read-only and "
                        "full file-system cases need root (or CAP_SYS_ADMIN)")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "--lazy", str(point)], check=False)  # lazy: even if a file is still open


def fill(point: Path) -> None:
    """Write under ``point`` until its file system is full."""
    with open(point / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:  # ENOSPC: full
            pass
