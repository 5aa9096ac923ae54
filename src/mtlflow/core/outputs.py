"""One guard for every path mtlflow writes: run directories, prepared datasets, caches and workdirs.

Every command checks its output paths *before* it loads data or builds a model
(:func:`check_output_dir`), and a command that writes a run or dataset directory holds an exclusive
lock on it for as long as it writes (:func:`locked_dir`). The lock is an ``flock`` on a hidden file
holding the writer's pid: the kernel drops it when the writer dies (even by SIGKILL), so a lock can
never go stale, and while it is held no other mtlflow process writes there -- which is what makes
removing the temporary files of dead writers (:func:`remove_orphaned_temp_files`) safe.

A run directory that already holds a result is never replaced silently (:func:`claim_run_dir`):
the caller must say ``resume`` (continue from its checkpoint) or ``overwrite`` (the old result files
are deleted *before* the new run starts, so a new run that fails never leaves the old run's model and
metrics beside its own failed ``run.json``).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator

from mtlflow.core.errors import InvalidParameterError, OutputInUseError
from mtlflow.core.hashing import MANIFEST_NAME

LOCK_NAME = ".mtlflow.lock"
#: files a training run writes into its directory (PaLoRA adds its front plot)
RUN_FILES = ("run.json", "metrics.json", "checkpoint.pt", "model.pt", "evaluation.json", "report.html",
             "pareto_front.png")


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a directory mtlflow may create or write; one-line errors name ``flag`` and the fix."""
    if not str(path).strip():
        raise InvalidParameterError(f"{flag} is empty; give a directory path")
    target = Path(path)
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise InvalidParameterError(f"{flag} {path} is the current directory or one of its parents; "
                                    "give a new sub-directory, e.g. runs/NAME")
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        where = f"{flag} {path} is a file" if existing == resolved else f"{flag} {path} lies below the file {existing}"
        raise InvalidParameterError(f"{where}, not a directory; give a directory path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{flag} {path}: {existing} is not writable (permission denied); "
                                    "choose a writable location")
    return target


def _holder(lock_file: Path) -> str:
    try:
        pid = lock_file.read_text().strip()
    except OSError:
        pid = ""
    return f"process {pid}" if pid else "another process"


@contextlib.contextmanager
def locked_dir(lock_file: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an exclusive, non-blocking lock on ``lock_file`` (created, with this pid) while writing ``what``."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputInUseError(f"{what} is in use by {_holder(lock_file)}; wait for it to finish or "
                                   "choose another output directory") from None
        try:
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_orphaned_temp_files(directory: str | os.PathLike, target: str | None = None) -> list[Path]:
    """Delete the temporary files and folders :mod:`mtlflow.core.atomic` leaves when its writer dies.

    ``target=None``: every ``.*.tmp`` in ``directory`` (a run directory, whose writers all hold its
    lock); ``target=NAME``: only the ``.NAME.<8 random chars>.tmp`` (and ``.NAME.old.*.tmp``) of that
    one sibling. Call it only while holding the lock every writer of those files holds: then each of
    them was left by a writer that died before renaming it into place.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    if target is None:
        candidates = list(directory.glob(".*.tmp"))
    else:
        mine = re.compile(rf"\.{re.escape(target)}\.(old\.)?[a-z0-9_]{{8}}\.tmp")
        candidates = [p for p in directory.glob(f".{glob.escape(target)}.*.tmp") if mine.fullmatch(p.name)]
    for path in candidates:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return candidates


def _status(run_dir: Path) -> str:
    from mtlflow.core.atomic import read_json
    from mtlflow.core.errors import DataError

    try:
        return str(read_json(run_dir / "run.json", "run description").get("status"))
    except (DataError, AttributeError):
        return "unknown"


def stale_run_files(run_dir: str | os.PathLike, resume: bool, overwrite: bool, flag: str = "--out") -> list[Path]:
    """The result files in ``run_dir`` that a new run deletes before it starts; raises if the existing
    result may not be touched. Deletes nothing, so commands call it before loading any data."""
    if resume and overwrite:
        raise InvalidParameterError("--resume and --overwrite contradict each other; give one of them")
    run_dir = Path(run_dir)
    present = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    if overwrite or not present:
        return present
    if resume:
        if (run_dir / "checkpoint.pt").is_file():
            return []
        if (run_dir / "model.pt").exists():
            raise InvalidParameterError(f"{flag} {run_dir} holds a finished model but no checkpoint.pt to resume "
                                        "from; pass --overwrite to train it again or choose another directory")
        return present  # a run.json of a run that died before its first checkpoint: nothing to continue
    raise InvalidParameterError(f"{flag} {run_dir} already holds a run (status {_status(run_dir)}); pass "
                                "--resume to continue it, --overwrite to replace it, or choose another directory")


def claim_run_dir(run_dir: Path, resume: bool, overwrite: bool, flag: str = "--out") -> None:
    """Remove dead writers' temp files and the stale result files (call it holding the run's lock)."""
    remove_orphaned_temp_files(run_dir)
    for path in stale_run_files(run_dir, resume, overwrite, flag):
        path.unlink()
    if resume and not (run_dir / "checkpoint.pt").is_file():
        print(f"mtlflow: note: {run_dir} has no checkpoint to resume from; starting at epoch 1", file=sys.stderr)


@contextlib.contextmanager
def run_dir_guard(run_dir: str | os.PathLike, resume: bool = False, overwrite: bool = False,
                  flag: str = "--out", main_process: bool = True) -> Iterator[Path]:
    """Check, lock and claim a training run directory for the duration of the run.

    Only the main process of a distributed run locks and claims; the other ranks write nothing there.
    """
    path = check_output_dir(run_dir, flag)
    if not main_process:
        yield path
        return
    created = _missing_directories(path)
    lock_existed = (path / LOCK_NAME).exists()
    with locked_dir(path / LOCK_NAME, f"run directory {path}"):
        claim_run_dir(path, resume, overwrite, flag)
        try:
            yield path
        except BaseException:
            if not lock_existed:
                _remove_if_untouched(path, created)
            raise


def _missing_directories(path: Path) -> list[Path]:
    """The directories that writing into ``path`` will create, deepest first."""
    resolved = path.resolve()
    return [d for d in (resolved, *resolved.parents) if not d.exists()]


def _remove_if_untouched(path: Path, created: list[Path]) -> None:
    """Remove the lock and the directories a run created when it failed before writing anything else
    (e.g. a model that cannot be built): a failed command leaves nothing behind. Called holding the
    lock, so no other writer can be adding files meanwhile."""
    if {p.name for p in path.iterdir()} != {LOCK_NAME}:
        return
    (path / LOCK_NAME).unlink()
    for directory in created:
        try:
            directory.rmdir()
        except OSError:  # not empty: something else was written there meanwhile
            return


def _check_dataset_target(path: Path, overwrite: bool, flag: str) -> None:
    if path.exists() and any(path.iterdir()):
        if not (path / MANIFEST_NAME).is_file():
            raise InvalidParameterError(f"{flag} {path} is a non-empty directory that is not a prepared "
                                        "dataset; choose a new or empty directory (nothing was deleted)")
        if not overwrite:
            raise InvalidParameterError(f"{flag} {path} already holds a prepared dataset; pass --overwrite "
                                        "to replace it or choose another directory")


@contextlib.contextmanager
def dataset_dir_guard(out: str | os.PathLike, overwrite: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Check and lock the target of ``prepare``; an existing directory is replaced only if it is a
    prepared dataset and ``overwrite`` is set (anything else in it is never deleted). The lock is a
    sibling file, ``.<name>.lock``, because the directory itself is swapped in whole."""
    path = check_output_dir(out, flag)
    _check_dataset_target(path, overwrite, flag)  # a refused prepare writes nothing, not even the lock
    with locked_dir(path.parent / f".{path.name}.lock", f"data directory {path}"):
        remove_orphaned_temp_files(path.parent, path.name)
        _check_dataset_target(path, overwrite, flag)
        yield path
