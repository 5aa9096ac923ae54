"""The one inter-process file lock: an exclusive ``flock`` on a file, held inside a ``with``.

The kernel drops an ``flock`` when its holder dies (even by SIGKILL), so the lock never goes stale and the
lock file may stay behind. Two variants:

* :func:`file_lock` waits until the lock is free: torchrun's processes taking turns at the shared data cache,
  promotions to the model store, pushes to one DVC remote.
* :func:`file_lock_or_fail` does not wait: a writer that finds its output directory in use by another process
  stops at once (:func:`mtlflow.core.outputs.locked_dir`) instead of queueing behind it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO


def file_lock(path: str | os.PathLike) -> contextlib.AbstractContextManager[TextIO]:
    """Hold an exclusive lock on ``path`` (created, with its folder, if needed), waiting until it is free;
    yields the lock file, open for appending."""
    return _locked(Path(path), busy=None)


def file_lock_or_fail(path: str | os.PathLike,
                      busy: Callable[[], Exception]) -> contextlib.AbstractContextManager[TextIO]:
    """Hold an exclusive lock on ``path`` (created, with its folder, if needed) without waiting: while another
    process holds it, raises ``busy()`` (the caller's one-line error) instead; yields the lock file."""
    return _locked(Path(path), busy)


@contextlib.contextmanager
def _locked(path: Path, busy: Callable[[], Exception] | None) -> Iterator[TextIO]:
    """The lock of both variants: waiting for it without ``busy``, else ``LOCK_NB`` and ``busy()`` raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        if busy is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise busy() from None
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
