"""Content hashes of data directories, recorded with every prepared dataset and every result."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Files that describe a dataset rather than being part of it.
MANIFEST_NAME = "manifest.json"


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def directory_hash(root: str | os.PathLike, exclude: tuple[str, ...] = (MANIFEST_NAME,)) -> str:
    """SHA-256 over the relative paths and contents of every file under ``root``, sorted."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in exclude or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(file_sha256(path).encode())
        digest.update(b"\n")
    return digest.hexdigest()
