"""The run-directory guard leaves nothing behind when a run fails before writing anything, and never
removes what a run (this one or an earlier one) wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.outputs import LOCK_NAME, check_output_path, run_dir_guard


def fail_inside(run_dir: Path, write: str | None = None) -> None:
    with pytest.raises(RuntimeError, match="model cannot be built"):
        with run_dir_guard(run_dir):
            assert (run_dir / LOCK_NAME).is_file()
            if write:
                (run_dir / write).write_text("{}")
            raise RuntimeError("model cannot be built")


def test_a_run_that_fails_before_writing_removes_the_directories_it_created(tmp_path: Path) -> None:
    fail_inside(tmp_path / "runs" / "sweep" / "ls")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_in_an_existing_empty_directory_removes_only_its_lock(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    fail_inside(tmp_path / "run")
    assert (tmp_path / "run").is_dir() and list((tmp_path / "run").iterdir()) == []


def test_what_a_failed_run_wrote_is_kept(tmp_path: Path) -> None:
    fail_inside(tmp_path / "new" / "run", write="run.json")
    assert sorted(p.name for p in (tmp_path / "new" / "run").iterdir()) == [LOCK_NAME, "run.json"]


def test_a_directory_locked_by_an_earlier_run_is_left_as_it_was(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with run_dir_guard(run_dir):
        pass
    fail_inside(run_dir)
    assert [p.name for p in run_dir.iterdir()] == [LOCK_NAME]


# -- outputs and the command's inputs (issue 29, item 7) -------------------------------------------

@pytest.mark.parametrize(("out", "read_by_name", "relation"), [
    ("data", False, "is"), ("data/run", False, "lies inside"), (".", False, "contains"),
    ("data", True, "is"), (".", True, "contains"), ("data/run", True, None),
])
def test_an_output_keeps_clear_of_the_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str,
                                             read_by_name: bool, relation: str | None) -> None:
    """Equal to, inside or containing an input is refused; a folder whose files are read by name (an image
    folder) may hold the output, but not be or lie inside it."""
    (tmp_path / "work" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "work" / out
    inputs = [("--data", tmp_path / "work" / "data", True) if read_by_name else ("--data", tmp_path / "work" / "data")]
    if relation is None:
        assert check_output_path(target, "--out", "dir", inputs) == target
    else:
        with pytest.raises(InvalidParameterError, match=f"^--out {target} {relation} --data "):
            check_output_path(target, "--out", "dir", inputs)
