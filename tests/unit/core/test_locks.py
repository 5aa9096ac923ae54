"""mtlflow.core.locks: the one file lock, waiting (file_lock) or failing at once (file_lock_or_fail), held
against another process (flock is per open file, so the holder is a real second process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mtlflow.core.errors import OutputInUseError
from mtlflow.core.locks import file_lock, file_lock_or_fail

HOLDER = """\
import sys, time
from pathlib import Path
from mtlflow.core.locks import file_lock
lock, done = Path(sys.argv[1]), Path(sys.argv[2])
with file_lock(lock):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
    done.write_text("written while holding the lock")
"""


def hold(lock: Path, done: Path, seconds: float) -> subprocess.Popen:
    """A second process that holds ``lock`` for ``seconds``, then writes ``done`` and releases it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(done), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_file_lock_waits_for_the_holder(tmp_path):
    lock, done = tmp_path / "a" / "b" / ".lock", tmp_path / "done"
    holder = hold(lock, done, 1.0)
    try:
        with file_lock(lock) as handle:   # returns only once the holder has released it
            assert done.is_file()
            assert not handle.closed
    finally:
        holder.wait(timeout=60)


def test_file_lock_or_fail_raises_the_callers_error_while_held(tmp_path):
    lock, done = tmp_path / ".lock", tmp_path / "done"
    holder = hold(lock, done, 30.0)
    try:
        with pytest.raises(OutputInUseError, match="^busy$"):
            with file_lock_or_fail(lock, busy=lambda: OutputInUseError("busy")):
                pytest.fail("the lock was taken while another process held it")
        assert not done.exists()   # it did not wait for the holder
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with file_lock_or_fail(lock, busy=lambda: OutputInUseError("busy")):   # the kernel dropped the dead holder's
        pass


def test_the_lock_is_released_after_the_block(tmp_path):
    lock = tmp_path / "x" / ".lock"
    with file_lock(lock):
        pass
    with file_lock_or_fail(lock, busy=lambda: OutputInUseError("busy")):   # no stale lock of this process
        with pytest.raises(OutputInUseError):   # a second open file of this process is refused too
            with file_lock_or_fail(lock, busy=lambda: OutputInUseError("busy")):
                pass
    assert lock.parent.is_dir()
