"""Data that a command destroys (issue 29, items 6-8): one guard (:func:`mtlflow.core.outputs.check_output_path`)
for every path mtlflow writes. Each class of the battery is one parametrised test through the CLI:

- output paths: a file where a directory is needed and the reverse, a path below a file, ``/proc``, an output
  equal to, inside or containing one of the command's inputs, ``prepare --overwrite`` over the user's files;
- symlinks: a symlink loop or a dangling symlink as (or on the way to) ``--out`` / ``--workdir``;
- read-only and full file systems: refused before any work, and a disk that fills mid-run ends the run as
  "failed" (never "running") with one line.

Every refusal exits 2 with one ``mtlflow: error:`` line and writes or deletes nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from file_system_support import fill, snapshot, tmpfs_mounts
from mtlflow import cli, jobs

#: a task spec whose table lives in tbl/ (the commands refused here never read the table)
SPEC = "name: t\nsource: {table: tbl/table.csv}\ntasks: [{name: y, type: binary}]\nfeatures: {numeric: [x]}\n"
TABLE = "x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(40))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Prepared toy data and one completed toy run, read (never written) by the batteries."""
    root = tmp_path_factory.mktemp("shared")
    jobs.prepare("toy", root / "data")
    jobs.train(root / "data", root / "run", epochs=1, progress=False)
    return {"root": root, "data": root / "data", "run": root / "run"}


def run_refused(argv: str, fill: dict[str, str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``mtlflow ARGV`` in-process (an uncaught exception fails the test: that is a traceback): exit code and
    the one error line."""
    try:
        exit_code = cli.main([a.format(**fill) for a in argv.split(" ")])
    except SystemExit as exc:  # argparse
        exit_code = int(exc.code)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mtlflow: error: "), err
    return exit_code, lines[0]


def _copy_data(t: Path, s: dict) -> None:
    shutil.copytree(s["data"], t / "ds")


def _data_with_user_files(*names: str) -> Callable[[Path, dict], None]:
    def setup(t: Path, s: dict) -> None:
        _copy_data(t, s)
        for name in names:
            (t / "ds" / name).parent.mkdir(parents=True, exist_ok=True)
            (t / "ds" / name).write_text("the user's own")
    return setup


def _data_without_file_list(t: Path, s: dict) -> None:
    """A manifest that does not say which files prepare wrote (an older or edited one)."""
    _copy_data(t, s)
    manifest = json.loads((t / "ds" / "manifest.json").read_text())
    del manifest["files"]
    (t / "ds" / "manifest.json").write_text(json.dumps(manifest))


def _copy_run(t: Path, s: dict) -> None:
    shutil.copytree(s["run"], t / "copy")


def _nested_data(t: Path, s: dict) -> None:
    shutil.copytree(s["data"], t / "runs" / "ds")


def _dir_and_file(t: Path) -> None:
    (t / "adir").mkdir()
    (t / "afile").write_text("precious")


def _spec(t: Path) -> None:
    (t / "tbl").mkdir()
    (t / "tbl" / "table.csv").write_text(TABLE)
    (t / "spec.yaml").write_text(SPEC)


def _image_spec(t: Path) -> None:
    _spec(t)
    (t / "img").mkdir()
    (t / "images.yaml").write_text(SPEC.replace("tbl/table.csv}", "tbl/table.csv, images: img}").replace(
        "features: {numeric: [x]}\n", ""))


def _spec_in_workdir(t: Path) -> None:
    (t / "w" / "tbl").mkdir(parents=True)
    (t / "w" / "tbl" / "table.csv").write_text(TABLE)
    (t / "w" / "spec.yaml").write_text(SPEC)


# (id, argv, setup(tmp) or setup(tmp, shared), env, substring of the one error line); every case exits 2
OUTPUT_PATHS = [
    # 6. --overwrite replaces only what prepare wrote (its manifest's files)
    ("prepare-overwrite-over-user-files", "prepare --benchmark toy --out {t}/ds --overwrite",
     _data_with_user_files("notes.txt", "sub/more.txt"), None, "did not write (notes.txt, sub/)"),
    ("prepare-overwrite-over-a-hidden-file", "prepare --benchmark toy --out {t}/ds --overwrite",
     _data_with_user_files(".notes"), None, "did not write (.notes)"),
    ("prepare-overwrite-without-a-file-list", "prepare --benchmark toy --out {t}/ds --overwrite",
     _data_without_file_list, None, "lists no files"),
    # 7. an output equal to, inside or containing an input
    ("train-out-is-data", "train --data {t}/ds --out {t}/ds --epochs 1", _copy_data, None, "is --data"),
    ("train-out-is-data-overwrite", "train --data {t}/ds --out {t}/ds --epochs 1 --overwrite", _copy_data, None,
     "is --data"),
    ("train-out-inside-data", "train --data {t}/ds --out {t}/ds/run --epochs 1", _copy_data, None,
     "lies inside --data"),
    ("train-out-contains-data", "train --data {t}/runs/ds --out {t}/runs --epochs 1", _nested_data, None,
     "contains --data"),
    ("train-out-contains-the-cache", "train --benchmark toy --out {t}/out --epochs 1", None,
     {"MTLFLOW_CACHE": "{t}/out/cache"}, "contains the cached data"),
    ("train-spec-out-contains-its-table", "train --spec {t}/spec.yaml --out {t}/tbl --epochs 1", _spec, None,
     "contains the spec's table"),
    ("prepare-out-contains-the-spec-table", "prepare --spec {t}/spec.yaml --out {t}/tbl", _spec, None,
     "contains the spec's table"),
    ("prepare-out-is-the-image-folder", "prepare --spec {t}/images.yaml --out {t}/img", _image_spec, None,
     "is the spec's image folder"),
    ("prepare-out-inside-the-mnist-dir", "prepare --benchmark multimnist --mnist-dir {t}/adir --out {t}/adir/mm",
     _dir_and_file, None, "lies inside --mnist-dir"),
    ("evaluate-out-is-the-model", "evaluate {t}/copy --data {data} --out {t}/copy/model.pt", _copy_run, None,
     "is the run file"),
    ("evaluate-out-inside-data", "evaluate {run} --data {data} --out {data}/evaluation.json", None, None,
     "lies inside --data"),
    ("report-out-is-metrics", "report {t}/copy --out {t}/copy/metrics.json", _copy_run, None, "is the input file"),
    ("aggregate-out-is-a-run", "aggregate {t}/copy --out {t}/copy", _copy_run, None, "is run directory"),
    ("aggregate-out-inside-a-run", "aggregate {t}/copy --out {t}/copy/agg", _copy_run, None,
     "lies inside run directory"),
    ("spec-init-out-is-the-table", "spec init {t}/tbl/table.csv --tasks y --out {t}/tbl/table.csv --overwrite", _spec,
     None, "is the table"),
    ("workdir-contains-the-spec", "pipeline run --local --workdir {t}/w --param spec={t}/w/spec.yaml --param epochs=1",
     _spec_in_workdir, None, "contains --spec"),
    # 8. a file where a directory is needed, a directory where a file is, a path below a file
    ("evaluate-out-dir", "evaluate {run} --data {data} --out {t}/adir", _dir_and_file, None, "is a directory"),
    ("evaluate-out-below-file", "evaluate {run} --data {data} --out {t}/afile/x.json", _dir_and_file, None,
     "lies below the file"),
    ("report-out-dir", "report {run} --out {t}/adir", _dir_and_file, None, "is a directory"),
    ("aggregate-out-file", "aggregate {run} --out {t}/afile", _dir_and_file, None, "is a file"),
    ("spec-init-out-dir", "spec init {t}/tbl/table.csv --tasks y --out {t}/adir",
     lambda t: (_spec(t), _dir_and_file(t)), None, "is a directory"),
    ("spec-init-out-below-file", "spec init {t}/tbl/table.csv --tasks y --out {t}/afile/x.yaml",
     lambda t: (_spec(t), _dir_and_file(t)), None, "lies below the file"),
    ("palora-merge-out-is-the-model", "palora merge {t}/copy --preference 0.5,0.5 --out {t}/copy/model.pt", _copy_run,
     None, "is the run's model"),
    # 8. kernel file systems (root may write there)
    ("train-out-proc", "train --data {data} --out /proc/mtlflow-run --epochs 1", None, None, "kernel file system"),
    ("prepare-out-sys", "prepare --benchmark toy --out /sys/mtlflow-ds", None, None, "kernel file system"),
    ("evaluate-out-proc", "evaluate {run} --data {data} --out /proc/self/evaluation.json", None, None,
     "kernel file system"),
    ("spec-init-out-dev", "spec init {t}/tbl/table.csv --tasks y --out /dev/spec.yaml", _spec, None,
     "kernel file system"),
]


def _call_setup(setup, work: Path, shared: dict) -> None:
    if setup is not None:
        setup(work, shared) if setup.__code__.co_argcount == 2 else setup(work)


@pytest.mark.parametrize("case", OUTPUT_PATHS, ids=[c[0] for c in OUTPUT_PATHS])
def test_output_paths(case, shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _, argv, setup, env, message = case
    work = tmp_path / "work"
    work.mkdir()
    _call_setup(setup, work, shared)
    fill = {"t": str(work), "data": str(shared["data"]), "run": str(shared["run"])}
    monkeypatch.chdir(work)
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value.format(**fill))
    before = snapshot(work, shared["root"])
    exit_code, line = run_refused(argv, fill, capsys)
    assert (exit_code, message in line) == (2, True), line
    assert snapshot(work, shared["root"]) == before, "a refused command wrote or deleted files"
    assert not (tmp_path / "cache").exists()


def test_overwrite_replaces_a_dataset_holding_only_what_prepare_wrote(tmp_path: Path, capsys) -> None:
    """The other side of item 6: a dataset holding nothing but prepare's files (in sub-folders too) is replaced."""
    (tmp_path / "tbl").mkdir()
    (tmp_path / "tbl" / "table.csv").write_text(TABLE)
    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "ds"
    jobs.prepare("spec", out, spec=str(tmp_path / "spec.yaml"))
    files = jobs.read_manifest(out)["files"]
    assert cli.main(["prepare", "--spec", str(tmp_path / "spec.yaml"), "--out", str(out), "--overwrite"]) == 0
    assert jobs.read_manifest(out)["files"] == files


# -- symlinks -------------------------------------------------------------------------------------

def _links(t: Path) -> None:
    (t / "loop1").symlink_to("loop2")
    (t / "loop2").symlink_to("loop1")
    (t / "dangling").symlink_to("nowhere")
    _spec(t)


#: (command with {out}, whether {out} is a file): every writer's --out / --workdir
WRITERS = [
    ("train", "train --data {data} --out {out} --epochs 1", False),
    ("prepare", "prepare --benchmark toy --out {out}", False),
    ("pipeline-workdir", "pipeline run --local --workdir {out} --param epochs=1", False),
    ("spec-init", "spec init {t}/tbl/table.csv --tasks y --out {out}", True),
    ("evaluate", "evaluate {run} --data {data} --out {out}", True),
    ("aggregate", "aggregate {run} --out {out}", False),
    ("report", "report {run} --out {out}", True),
]
LINKS = [("loop", "loop1", "is a symlink loop"), ("loop-on-the-way", "loop1/x", "is a symlink loop"),
         ("dangling", "dangling", "which does not exist"), ("below-dangling", "dangling/x", "which does not exist")]


@pytest.mark.parametrize("writer", WRITERS, ids=[w[0] for w in WRITERS])
@pytest.mark.parametrize("link", LINKS, ids=[c[0] for c in LINKS])
def test_symlinks_as_output(writer, link, shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _, argv, _ = writer
    _, out, message = link
    work = tmp_path / "work"
    work.mkdir()
    _links(work)
    fill = {"t": str(work), "data": str(shared["data"]), "run": str(shared["run"]), "out": str(work / out)}
    monkeypatch.chdir(work)
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    before = snapshot(work, shared["root"])
    exit_code, line = run_refused(argv, fill, capsys)
    assert (exit_code, message in line) == (2, True), line
    assert snapshot(work, shared["root"]) == before, "a refused command wrote or deleted files"


# -- read-only and full file systems --------------------------------------------------------------

@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    yield from tmpfs_mounts(tmp_path)


#: (id, tmpfs options, fill it first, command with {fs} the mount point)
FILE_SYSTEMS = [(f"{kind}-{name}", options, fill, argv)
                for kind, options, fill in (("read-only", "ro,size=64k", False), ("full", "size=16k", True))
                for name, argv, _ in WRITERS if name != "pipeline-workdir"] + [
    ("read-only-pipeline-workdir", "ro,size=64k", False, "pipeline run --local --workdir {out} --param epochs=1"),
    ("read-only-data-pull", "ro,size=64k", False, "data pull 0123456789abcdef0123456789abcdef.dir --remote {t} "
                                                 "--out {out}"),
]


@pytest.mark.parametrize("case", FILE_SYSTEMS, ids=[c[0] for c in FILE_SYSTEMS])
def test_read_only_or_full_file_system_is_refused_before_any_work(case, shared, tmp_path: Path, mount_tmpfs,
                                                                  monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    name, options, full, argv = case
    fs = mount_tmpfs(options)
    if full:
        fill(fs)
    work = tmp_path / "work"
    work.mkdir()
    _spec(work)
    target = fs / ("out.json" if "evaluate" in name or "report" in name else
                   "spec.yaml" if "spec-init" in name else "out")
    fill_values = {"t": str(work), "data": str(shared["data"]), "run": str(shared["run"]), "out": str(target)}
    monkeypatch.chdir(work)
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    before = snapshot(work, fs, shared["root"])
    exit_code, line = run_refused(argv, fill_values, capsys)
    expected = "read-only file system" if options.startswith("ro") else "is full"
    assert (exit_code, expected in line) == (2, True), line
    assert snapshot(work, fs, shared["root"]) == before, "a refused command wrote or deleted files"


@pytest.mark.parametrize("size", ["16k", "24k", "32k"])
def test_a_disk_that_fills_mid_run_fails_the_run_in_one_line(size: str, shared, tmp_path: Path, mount_tmpfs,
                                                             capsys) -> None:
    """A toy run needs about 36 KiB of tmpfs pages: these sizes fill up at the first checkpoint (16k, 24k) or at
    the final metrics (32k). ENOSPC ends the run as "failed" with the reason, never left "running", with one
    line and no temporary file left behind."""
    fs = mount_tmpfs(f"size={size}")
    exit_code = cli.main(["train", "--data", str(shared["data"]), "--out", str(fs / "run"), "--epochs", "1",
                          "--no-progress"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"mtlflow: error: cannot write {fs / 'run'}/"), lines
    assert lines[0].endswith(": no space left on the device; free space (or make it writable) or choose an output "
                             "on another file system"), lines
    run = json.loads((fs / "run" / "run.json").read_text())
    assert run["status"] == "failed" and "no space left" in run["error"], run
    assert not list((fs / "run").glob(".*.tmp")), "a half-written file was left behind"
