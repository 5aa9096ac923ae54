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


def file_hashes(root: str | os.PathLike, exclude: tuple[str, ...] = (MANIFEST_NAME,)) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (hidden files and ``exclude`` skipped)."""
    root = Path(root)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.as_posix() in exclude or any(part.startswith(".") for part in rel.parts):
            continue
        out[rel.as_posix()] = file_sha256(path)
    return out


def combine_hashes(hashes: dict[str, str]) -> str:
    """One SHA-256 over sorted (path, file hash) pairs."""
    digest = hashlib.sha256()
    for rel in sorted(hashes):
        digest.update(f"{rel}\0{hashes[rel]}\n".encode())
    return digest.hexdigest()


def directory_hash(root: str | os.PathLike, exclude: tuple[str, ...] = (MANIFEST_NAME,)) -> str:
    """SHA-256 over the relative paths and contents of every file under ``root``, sorted."""
    return combine_hashes(file_hashes(root, exclude))
