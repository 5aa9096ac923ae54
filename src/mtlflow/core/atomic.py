"""Atomic writes: every file is written to a temporary sibling and renamed into place.

A killed process therefore leaves either the previous file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from mtlflow.core.errors import DataError, InvalidParameterError, StorageError


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: what the file system answers when it cannot take a write at all (not a bug of the writer)
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EROFS: "the file system is read-only"}


@contextlib.contextmanager
def storage_errors(target: Path) -> Iterator[None]:
    """A full, over-quota or read-only file system while writing ``target`` as one
    :class:`~mtlflow.core.errors.StorageError` line naming the file and the fix; other errors pass."""
    try:
        yield
    except Exception as exc:
        cause = _storage_cause(exc)
        if cause is None:
            raise
        raise StorageError(f"cannot write {target}: {STORAGE_ERRNOS[cause]}; free space (or make it "
                           "writable) or choose an output on another file system") from None


def _storage_cause(exc: BaseException | None) -> int | None:
    """The errno of a storage OSError that ``exc`` is or was raised while handling (torch.save's zip writer
    answers a full disk with a RuntimeError raised on top of the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None


def _remove_temporary(path: Path) -> None:
    """Best-effort removal of a temporary file or folder: on a file system that just turned read-only it
    cannot go, and the next writer's clean-up (:func:`mtlflow.core.outputs.remove_orphaned_temp_files`)
    removes it."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; rename it onto ``target`` on success."""
    target = Path(target)
    with storage_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        with storage_errors(target):
            yield tmp_path
            if tmp_path.exists():
                os.chmod(tmp_path, 0o644)
            os.replace(tmp_path, target)
            _fsync_dir(target.parent)
    finally:
        _remove_temporary(tmp_path)


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def write_text(target: str | os.PathLike, text: str) -> None:
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike, obj: Any) -> None:
    write_text(target, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def rewrite_json_in_place(target: str | os.PathLike, obj: Any) -> None:
    """Overwrite the existing small JSON file ``target`` in place: NOT atomic, the last resort when the file
    system is full and has no room for a temporary copy (truncating frees the file's own blocks, which the
    new content then reuses). A run's final status is written this way rather than left saying "running"."""
    target = Path(target)
    with storage_errors(target), open(target, "r+b") as fh:
        fh.truncate(0)
        fh.write((json.dumps(obj, indent=2, default=_json_default) + "\n").encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def torch_save(obj: Any, target: str | os.PathLike) -> None:
    import torch  # noqa: PLC0415 -- the one torch user of core.atomic: the JSON/YAML writers stay free of torch

    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        # through a Python file, so that a full disk is an OSError (ENOSPC) and not torch's RuntimeError
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a temporary sibling and swap it onto ``target`` on success.

    An existing ``target`` is replaced only after the new content is complete.
    """
    target = Path(target)
    with storage_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        with storage_errors(target):
            yield tmp
            os.chmod(tmp, 0o755)
            if target.exists():
                # a unique ``.tmp`` name: if this process dies mid-swap, the next writer's clean-up finds it
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", suffix=".tmp", dir=target.parent))
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old)
            else:
                os.replace(tmp, target)
            _fsync_dir(target.parent)
    finally:
        _remove_temporary(tmp)


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Read JSON, turning a missing or corrupt file into a one-line :class:`DataError`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: expected {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{what} {path} is corrupt ({exc.msg if hasattr(exc, 'msg') else exc}); "
                        f"delete it and re-create it") from None


def read_yaml(path: str | os.PathLike, what: str = "YAML file") -> Any:
    """Read a YAML parameter file; every problem is one :class:`InvalidParameterError` line, a syntax
    error as ``FILE:LINE:COL: message`` (the position editors and CI annotations jump to)."""
    path = Path(path)
    if path.is_dir():
        raise InvalidParameterError(f"{what} {path} is a directory; give the YAML file inside it")
    if not path.is_file():
        raise InvalidParameterError(f"{what} not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"{what} {path} cannot be read ({exc}); give a UTF-8 YAML file") from None
    return parse_yaml(text, str(path), what)


def _unique_keys_loader() -> type:
    """PyYAML's SafeLoader refusing a mapping that names a key twice: plain ``safe_load`` keeps the last value
    without a word, so ``epochs: 5`` above ``epochs: 50`` silently loses one of them."""
    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged keys may be overridden
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if isinstance(key, (str, int, float, bool)) and key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} appears twice in one mapping (first at line {seen[key]}); "
                                        "keep one of them", key_node.start_mark)
                    if isinstance(key, (str, int, float, bool)):
                        seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def parse_yaml(text: str, name: str, what: str = "YAML file") -> Any:
    """The YAML document ``text`` (read from ``name``); a syntax error is one line ``NAME:LINE:COL: message``."""
    try:
        return yaml.load(text, Loader=_unique_keys_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
        opened, context = getattr(exc, "context_mark", None), getattr(exc, "context", None)
        if opened is not None and context and opened is not mark:  # e.g. where an unclosed [ was opened
            problem += f", {context} at line {opened.line + 1}, column {opened.column + 1}"
        raise InvalidParameterError(f"{where}: {problem} (YAML syntax error in {what})") from None
