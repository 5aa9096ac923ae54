"""One guard for every path mtlflow writes: run directories, prepared datasets, caches and workdirs.

Every command checks its output paths *before* it loads data or builds a model, with one guard
(:func:`check_output_path`; :func:`check_output_dir` for directories): the path is resolved (symlink
loops, dangling links and kernel file systems refused), must be of the right kind, writable, and clear of
the command's inputs. A command that writes a run or dataset directory holds an exclusive
lock on it for as long as it writes (:func:`locked_dir`). The lock is an ``flock``
(:mod:`mtlflow.core.locks`) on a hidden file holding the writer's pid: the kernel drops it when the
writer dies (even by SIGKILL), so a lock can never go stale, and while it is held no other mtlflow
process writes there -- which is what makes removing the temporary files of dead writers
(:func:`remove_orphaned_temp_files`) safe.

A run directory that already holds a result is never replaced silently (:func:`claim_run_dir`):
the caller must say ``resume`` (continue from its checkpoint) or ``overwrite`` (the old result files
are deleted *before* the new run starts, so a new run that fails never leaves the old run's model and
metrics beside its own failed ``run.json``).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Literal

from mtlflow.core.atomic import read_json, storage_errors
from mtlflow.core.errors import DataError, InvalidParameterError, OutputInUseError
from mtlflow.core.hashing import MANIFEST_NAME
from mtlflow.core.locks import file_lock_or_fail

LOCK_NAME = ".mtlflow.lock"
#: files a training run writes into its directory (PaLoRA adds its front plot)
RUN_FILES = ("run.json", "metrics.json", "checkpoint.pt", "model.pt", "evaluation.json", "report.html",
             "pareto_front.png")


#: kernel file systems: writable for root, but nothing written there is a file (``/dev/shm`` is plain memory)
KERNEL_FILE_SYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))
#: the inputs of a command, each (what the user called it, e.g. "--data", its path[, True]); a path None is not
#: given; a third item True marks a folder whose files are read by name (an image folder), which an output may
#: lie inside (the images are not touched) but not be or contain
Inputs = Iterable[tuple]


def check_output_path(path: str | os.PathLike, flag: str, kind: Literal["dir", "file"] = "dir",
                      inputs: Inputs = ()) -> Path:
    """The one guard of every path mtlflow writes, called before any data is read: ``path`` as a
    directory (``kind="dir"``) or file (``kind="file"``) that this command may create or replace.

    Refused, each with one line naming ``flag`` and the fix: an empty path; a symlink loop or a dangling
    symlink on the way; ``/proc``, ``/sys``, ``/dev``; the current directory or one of its parents (a
    directory); a file where a directory is needed, a directory where a file is, a path below a file; an
    output equal to, inside or containing one of the command's ``inputs`` (their files would be
    replaced, or the output read back as input); a directory that is read-only, not writable or on a full
    file system. Returns ``path`` as given (a :class:`~pathlib.Path`)."""
    if not str(path).strip():
        raise InvalidParameterError(f"{flag} is empty; give a {_kind_name(kind)} path")
    target = Path(path)
    resolved = _resolve(target, flag)
    for system in KERNEL_FILE_SYSTEMS:
        if (resolved == system or system in resolved.parents) and Path("/dev/shm") not in (resolved, *resolved.parents):
            raise InvalidParameterError(f"{flag} {path} is in {system}, a kernel file system, not storage; choose a "
                                        "location on disk")
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if kind == "dir":
        cwd = Path.cwd().resolve()
        if resolved == cwd or resolved in cwd.parents:
            raise InvalidParameterError(f"{flag} {path} is the current directory or one of its parents; "
                                        "give a new sub-directory, e.g. runs/NAME")
        if not existing.is_dir():
            where = (f"{flag} {path} is a file" if existing == resolved else
                     f"{flag} {path} lies below the file {existing}")
            raise InvalidParameterError(f"{where}, not a directory; give a directory path")
    elif existing == resolved and resolved.is_dir():
        raise InvalidParameterError(f"{flag} {path} is a directory, not a file; give a file path, e.g. "
                                    f"{Path(path) / 'result.json'}")
    elif existing != resolved and not existing.is_dir():
        raise InvalidParameterError(f"{flag} {path} lies below the file {existing}, not in a directory; give a "
                                    "file path in a directory")
    _check_inputs(target, resolved, flag, kind, inputs)
    _check_writable(path, existing if existing.is_dir() else existing.parent, flag)
    return target


def check_output_dir(path: str | os.PathLike, flag: str, inputs: Inputs = ()) -> Path:
    """:func:`check_output_path` of a directory."""
    return check_output_path(path, flag, "dir", inputs)


def _kind_name(kind: str) -> str:
    return "directory" if kind == "dir" else "file"


def _resolve(target: Path, flag: str) -> Path:
    """``target`` made absolute with every symlink resolved; a loop or a dangling link on the way is refused
    (mkdir would fail on it, or a write follow it to an unexpected place)."""
    absolute = Path(os.path.abspath(target))
    for prefix in (*reversed(absolute.parents), absolute):
        if not prefix.is_symlink():
            continue
        try:
            os.stat(prefix)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidParameterError(f"{flag} {target}: {prefix} is a symlink loop; remove the link or "
                                            "give another path") from None
            raise InvalidParameterError(f"{flag} {target}: {prefix} is a symlink to {os.readlink(prefix)}, which "
                                        "does not exist; remove the link or create its target") from None
    return absolute.resolve()


def _check_inputs(target: Path, resolved: Path, flag: str, kind: str, inputs: Inputs) -> None:
    for name, given, *read_by_name in inputs:
        if given is None or not str(given).strip():
            continue
        source = Path(given).resolve()
        if source == resolved:
            relation = "is"
        elif source in resolved.parents and not any(read_by_name):
            relation = "lies inside"
        elif resolved in source.parents:
            relation = "contains"
        else:
            continue
        fix = "choose a directory outside every input, e.g. runs/NAME" if kind == "dir" else \
            "choose a file outside every input"
        raise InvalidParameterError(f"{flag} {target} {relation} {name} {given}, an input of this command (its "
                                    f"data would be overwritten or read back); {fix}")


def _check_writable(path: str | os.PathLike, directory: Path, flag: str) -> None:
    """``directory`` (the deepest existing one on the way to ``path``) must take new files."""
    stats = os.statvfs(directory)
    if stats.f_flag & os.ST_RDONLY:
        raise InvalidParameterError(f"{flag} {path}: {directory} is on a read-only file system; choose a writable "
                                    "location")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{flag} {path}: {directory} is not writable (permission denied); "
                                    "choose a writable location")
    if stats.f_blocks > 0 and stats.f_bavail == 0:  # (a file system that reports no sizes has f_blocks 0)
        raise InvalidParameterError(f"{flag} {path}: the file system of {directory} is full; free space or choose "
                                    "another location")


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

    def in_use() -> OutputInUseError:
        return OutputInUseError(f"{what} is in use by {_holder(lock_file)}; wait for it to finish or "
                                "choose another output directory")

    with file_lock_or_fail(lock_file, busy=in_use) as handle:
        with storage_errors(lock_file):  # a disk that filled up since the guard checked it
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        yield


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
        recorded = prepared_files(path)
        if recorded is None:
            raise InvalidParameterError(f"{flag} {path}: its {MANIFEST_NAME} lists no files (an older or edited "
                                        "manifest), so prepare cannot tell its files from yours; delete the "
                                        "directory yourself or choose another one (nothing was deleted)")
        foreign = foreign_entries(path, recorded)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise InvalidParameterError(f"{flag} {path} holds files that prepare did not write ({shown}); "
                                        "--overwrite replaces only a prepared dataset: move them out or choose "
                                        "another directory (nothing was deleted)")


def prepared_files(data_dir: Path) -> set[str] | None:
    """The files ``prepare`` wrote into ``data_dir`` as its manifest lists them (``files``, plus the manifest);
    None when the manifest cannot be read or lists none."""
    try:
        recorded = json.loads((data_dir / MANIFEST_NAME).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return {MANIFEST_NAME, *recorded} if isinstance(recorded, dict) else None


def foreign_entries(data_dir: Path, ours: set[str]) -> list[str]:
    """What ``data_dir`` holds beyond the files ``ours`` (relative POSIX paths) and their folders, relative
    and sorted; a foreign folder is named once (``sub/``), with everything in it."""
    folders = {parent.as_posix() for name in ours for parent in PurePosixPath(name).parents}
    foreign = []
    for root, dirs, files in os.walk(data_dir):
        here = Path(root).relative_to(data_dir)
        for name in sorted(dirs):
            relative = (here / name).as_posix()
            if relative not in folders:
                foreign.append(relative + "/")
                dirs.remove(name)  # its content goes with it
        foreign.extend((here / name).as_posix() for name in files if (here / name).as_posix() not in ours)
    return sorted(foreign)


@contextlib.contextmanager
def dataset_dir_guard(out: str | os.PathLike, overwrite: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Check and lock the target of ``prepare``; an existing directory is replaced only if it is a
    prepared dataset holding nothing but what ``prepare`` wrote (:func:`prepared_files`) and ``overwrite``
    is set: the user's own files are never deleted. The lock is a sibling file, ``.<name>.lock``, because
    the directory itself is swapped in whole."""
    path = check_output_dir(out, flag)
    _check_dataset_target(path, overwrite, flag)  # a refused prepare writes nothing, not even the lock
    with locked_dir(path.parent / f".{path.name}.lock", f"data directory {path}"):
        remove_orphaned_temp_files(path.parent, path.name)
        _check_dataset_target(path, overwrite, flag)
        yield path
