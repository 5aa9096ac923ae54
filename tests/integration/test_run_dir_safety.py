"""Bad input and data loss (issue 12): every refused command exits non-zero with one
``mtlflow: error:`` line and writes nothing; run directories are locked, never replaced silently,
survive SIGTERM, and lose their dead writers' temporary files.

The battery calls ``mtlflow.cli.main`` in-process (an uncaught exception would fail the test, which is
what a traceback is); locks, signals and divergence run ``python -m mtlflow`` in real processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, run_cli, stderr_lines
from file_system_support import snapshot
from mtlflow import cli, jobs

TOY_RUN = {"epochs": 1, "progress": False}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Prepared toy data and one completed toy run, read (never written) by the battery."""
    root = tmp_path_factory.mktemp("shared")
    jobs.prepare("toy", root / "data")
    jobs.train(root / "data", root / "run", **TOY_RUN)
    return {"root": root, "data": root / "data", "run": root / "run"}


# -- the battery: command -> exit code, one line naming the problem, nothing written ---------------

def _user_dir(t: Path) -> None:
    (t / "mine" / "sub").mkdir(parents=True)
    (t / "mine" / "notes.txt").write_text("precious")


def _file(t: Path) -> None:
    (t / "afile").write_text("precious")


def _params(text: str, name: str = "params.yaml") -> Callable[[Path], None]:
    def write(t: Path) -> None:
        (t / name).write_text(text)
    return write


def _run_copy(edit: Callable[[Path], None] | None = None) -> Callable[[Path, dict], None]:
    def setup(t: Path, s: dict) -> None:
        shutil.copytree(s["run"], t / "copy")
        if edit:
            edit(t / "copy")
    return setup


def _edit_run_json(**changes) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        info = json.loads((run / "run.json").read_text())
        for key, value in changes.items():
            if key == "method":
                info["config"]["method"] = value
            else:
                info[key] = value
        (run / "run.json").write_text(json.dumps(info))
    return edit


def _edited_manifest(t: Path, s: dict) -> None:
    shutil.copytree(s["data"], t / "data")
    manifest = json.loads((t / "data" / "manifest.json").read_text())
    manifest["content_hash"] = "0" * 64
    (t / "data" / "manifest.json").write_text(json.dumps(manifest))


SWEEP = "benchmark: toy\nepochs: 1\nreference_seeds: [0]\n"
#: validation runs before anything is compiled or sent (nothing listens on port 9)
SUBMIT = "pipeline submit --pipeline main --host http://127.0.0.1:9 --params-file {t}/params.yaml"

# (id, argv, setup(tmp) or setup(tmp, shared), env, exit code, substring of the one error line)
BATTERY = [
    # 1. prepare never deletes what --out held
    ("prepare-into-user-dir", "prepare --benchmark toy --out {t}/mine", _user_dir, None, 2, "not a prepared dataset"),
    ("prepare-overwrite-user-dir", "prepare --benchmark toy --out {t}/mine --overwrite", _user_dir, None, 2,
     "not a prepared dataset"),
    ("prepare-existing-dataset", "prepare --benchmark toy --out {data}", None, None, 2, "--overwrite"),
    # 3. an existing run is never replaced silently
    ("train-existing-run", "train --data {data} --out {run} --epochs 1", None, None, 2, "already holds a run"),
    ("train-resume-and-overwrite", "train --data {data} --out {t}/r --resume --overwrite --epochs 1", None, None, 2,
     "contradict"),
    ("train-resume-finished-without-checkpoint", "train --data {data} --out {t}/copy --resume --epochs 1",
     _run_copy(lambda r: (r / "checkpoint.pt").unlink()), None, 2, "no checkpoint.pt"),
    # 6. output paths: a file, below a file, '.', found before any data is loaded
    ("prepare-out-file", "prepare --benchmark toy --out {t}/afile", _file, None, 2, "is a file"),
    ("prepare-out-below-file", "prepare --benchmark toy --out {t}/afile/x", _file, None, 2, "lies below the file"),
    ("prepare-out-cwd", "prepare --benchmark toy --out .", None, None, 2, "current directory"),
    ("train-out-file", "train --data {data} --out {t}/afile --epochs 1", _file, None, 2, "is a file"),
    ("train-out-below-file", "train --benchmark toy --out {t}/afile/run --epochs 1", _file, None, 2,
     "lies below the file"),
    ("train-out-cwd", "train --data {data} --out . --epochs 1", None, None, 2, "current directory"),
    ("cache-is-file", "train --benchmark toy --out {t}/r --epochs 1", _file, {"MTLFLOW_CACHE": "{t}/afile"}, 2,
     "$MTLFLOW_CACHE"),
    ("cache-below-file", "train --benchmark toy --out {t}/r --epochs 1", _file, {"MTLFLOW_CACHE": "{t}/afile/c"}, 2,
     "$MTLFLOW_CACHE"),
    ("workdir-is-file", "pipeline run --local --workdir {t}/afile --param epochs=0", _file, None, 2, "--workdir"),
    ("workdir-cwd", "pipeline run --local --workdir . --param epochs=0", None, None, 2, "--workdir"),
    # 6. YAML syntax errors: FILE:LINE:COL
    ("yaml-error-pipeline", SUBMIT,
     _params("benchmark: toy\nmethods: [ls, mgda\nseeds: [0]\n"), None, 2, "params.yaml:3:6: expected ','"),
    ("yaml-error-stage", "stage train --method ls --params {t}/params.yaml",
     _params("prepare:\n  benchmark: toy\ntrain: {epochs: 1\n"), None, 2, "params.yaml:4:1: "),
    ("params-file-is-dir", "pipeline submit --host http://127.0.0.1:9 --params-file {t}", None, None, 2,
     "is a directory"),
    # 6./9. one seed type for the CLI and the pipelines
    ("seed-2-70", f"train --data {{data}} --out {{t}}/r --seed {2**70} --epochs 1", None, None, 2, "[0, 2**32)"),
    ("seed-negative", "train --data {data} --out {t}/r --seed -1 --epochs 1", None, None, 2, "[0, 2**32)"),
    ("hypercleaning-seeds-repeated", "hypercleaning --seeds 0,0 --out {t}/hc", None, None, 2, "distinct seeds"),
    ("ablate-seed-too-large", f"ablate cost --benchmark toy --seeds 0,{2**32} --out {{t}}/ab", None, None, 2,
     "[0, 2**32)"),
    ("toy-seed-negative", "toy --out {t}/toy --methods ls --steps 2 --seed -1", None, None, 2, "[0, 2**32)"),
    ("pipeline-seed-negative", SUBMIT,
     _params(SWEEP + "methods: [ls]\nseeds: [-1]\n"), None, 2, "[0, 2**32)"),
    ("pipeline-seed-2-40", SUBMIT,
     _params(SWEEP + f"methods: [ls]\nseeds: [{2**40}]\n"), None, 2, "[0, 2**32)"),
    # 5. duplicates are refused, not counted as extra seeds or heads
    ("tasks-duplicate", "train --data {data} --out {t}/r --tasks f1,f1 --epochs 1", None, None, 2, "f1 more than once"),
    ("tasks-duplicate-dry-run", "train --benchmark toy --dry-run --tasks f2,f2", None, None, 2, "more than once"),
    ("pipeline-duplicate-methods", SUBMIT,
     _params(SWEEP + "methods: [ls, ls]\nseeds: [0]\n"), None, 2, "methods lists 'ls' more than once"),
    ("pipeline-duplicate-seeds", SUBMIT,
     _params(SWEEP + "methods: [ls]\nseeds: [0, 0]\n"), None, 2, "seeds lists 0 more than once"),
    ("aggregate-same-dir-twice", "aggregate {run} {run} --out {t}/agg", None, None, 2, "given twice"),
    ("aggregate-same-run-twice", "aggregate {run} {t}/copy --out {t}/agg", _run_copy(), None, 2,
     "with seed 0; keep one run per method and seed"),
    # 7. nothing silently ignored
    ("tasks-empty", "train --data {data} --out {t}/r --tasks= --epochs 1", None, None, 2, "empty task"),
    ("tasks-comma", "train --data {data} --out {t}/r --tasks , --epochs 1", None, None, 2, "empty task"),
    ("tasks-unknown", "train --benchmark toy --out {t}/r --tasks nope --epochs 1", None, None, 2,
     "unknown task(s) nope"),
    ("benchmark-disagrees-with-data", "train --benchmark multimnist --data {data} --out {t}/r --epochs 1", None,
     None, 2, "disagrees with --data"),
    ("option-with-data", "train --data {data} --out {t}/r --data-option n_train=5 --epochs 1", None, None, 2,
     "--data-option applies only"),
    # 9. messages
    ("data-empty", "train --data= --out {t}/r --epochs 1", None, None, 2, "--data is empty"),
    ("methods-a-string", SUBMIT,
     _params(SWEEP + "methods: ls\nseeds: [0]\n"), None, 2, "methods must be a list of strings, got 'ls'; write e.g. [ls]"),
    ("argparse-bad-int", "train --benchmark toy --epochs x", None, None, 2,
     "mtlflow train: argument --epochs: invalid int value: 'x'"),
    ("argparse-unknown-command", "nosuchcommand", None, None, 2, "invalid choice: 'nosuchcommand'"),
    ("manifest-hash-edited", "train --data {t}/data --out {t}/r --epochs 1", _edited_manifest, None, 3,
     "the content_hash recorded in"),
    # 2./3. evaluate refuses a run whose model is not the run.json's result
    ("evaluate-failed-run", "evaluate {t}/copy --data {data}", _run_copy(_edit_run_json(status="failed")),
     None, 3, "did not complete"),
    ("evaluate-mixed-run", "evaluate {t}/copy --data {data}", _run_copy(_edit_run_json(method="mgda")), None, 3,
     "does not belong to the run"),
    ("report-mixed-run", "report {t}/copy", _run_copy(_edit_run_json(method="mgda", status="failed")), None, 3,
     "metrics.json does not belong to the run"),
]


@pytest.mark.parametrize("case", BATTERY, ids=[c[0] for c in BATTERY])
def test_bad_input_battery(case, shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _, argv, setup, env, code, message = case
    work = tmp_path / "work"
    work.mkdir()
    if setup is not None:
        setup(work, shared) if setup.__code__.co_argcount == 2 else setup(work)
    fill = {"t": str(work), "data": str(shared["data"]), "run": str(shared["run"])}
    monkeypatch.chdir(work)
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value.format(**fill))
    before = snapshot(work, shared["root"])
    try:
        exit_code = cli.main([a.format(**fill) for a in argv.split(" ")])
    except SystemExit as exc:  # argparse
        exit_code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_code == code, err
    assert len(lines) == 1 and lines[0].startswith("mtlflow: error: "), err
    assert message in lines[0], lines[0]
    assert snapshot(work, shared["root"]) == before, "a refused command wrote or deleted files"
    assert not (tmp_path / "cache").exists()


# -- the guarded paths still work -----------------------------------------------------------------

def test_overwrite_replaces_a_prepared_dataset_and_cleans_a_killed_prepare(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ds"
    jobs.prepare("toy", out)
    # what a prepare killed mid-build or mid-swap leaves behind, and a neighbour's that must survive
    for name in (".ds.abcd1234.tmp", ".ds.old.abcd1234.tmp", ".ds2.abcd1234.tmp"):
        (tmp_path / name).mkdir()
    assert cli.main(["prepare", "--benchmark", "toy", "--out", str(out), "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["content_hash"] == jobs.read_manifest(out)["content_hash"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [".ds2.abcd1234.tmp"]


def test_resume_removes_dead_writers_temp_files(shared, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(shared["run"], run)
    leftovers = [run / ".checkpoint.pt.k2j4h5g6.tmp", run / ".metrics.json.a1b2c3d4.tmp"]
    leftovers[0].write_bytes(os.urandom(2_000_000))
    leftovers[1].write_text("{")
    proc = run_cli("train", "--data", str(shared["data"]), "--out", str(run), "--epochs", "1", "--resume",
                   "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in leftovers)
    assert [p.name for p in run.glob(".*.tmp")] == []


def test_a_second_writer_is_refused_while_the_lock_is_held(shared, tmp_path: Path) -> None:
    from mtlflow.core.outputs import LOCK_NAME, locked_dir

    run = tmp_path / "run"
    shutil.copytree(shared["run"], run)
    before = snapshot(run)
    with locked_dir(run / LOCK_NAME, "test"):
        proc = run_cli("train", "--data", str(shared["data"]), "--out", str(run), "--epochs", "1", "--overwrite",
                       "--no-progress")
        after = snapshot(run)
    assert proc.returncode == 6, proc.stderr
    assert stderr_lines(proc) == [f"mtlflow: error: run directory {run} is in use by process {os.getpid()}; "
                                  "wait for it to finish or choose another output directory"]
    assert {k: v for k, v in after.items() if not k.endswith(LOCK_NAME)} == \
        {k: v for k, v in before.items() if not k.endswith(LOCK_NAME)}


def test_the_lock_of_a_killed_writer_is_released(tmp_path: Path) -> None:
    from mtlflow.core.outputs import LOCK_NAME, locked_dir

    lock = tmp_path / LOCK_NAME
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom mtlflow.core.outputs import locked_dir\n"
                               f"with locked_dir({str(lock)!r}, 'x'):\n    print('held', flush=True)\n"
                               "    time.sleep(120)"], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=f"in use by process {holder.pid}"):
            with locked_dir(lock, "x"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with locked_dir(lock, "x"):  # no stale lock after SIGKILL
        assert lock.read_text().strip() == str(os.getpid())


@pytest.fixture(scope="module")
def multimnist_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mm") / "data"
    jobs.prepare("multimnist", out, n_train=128, n_val=32, n_test=32)
    return out


def mm_train(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), "--batch-size", "64", "--max-steps-per-epoch", "2",
            "--no-progress", *extra]


def test_a_failed_overwrite_leaves_no_old_result_and_a_divergence_exits_4(multimnist_tiny: Path,
                                                                          tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_cli(*mm_train(multimnist_tiny, run, "--epochs", "1")).returncode == 0
    # FairGrad at lr 1e8 diverges in its second epoch, after the first epoch's metrics were written
    proc = run_cli(*mm_train(multimnist_tiny, run, "--epochs", "2", "--overwrite", "--method", "fairgrad",
                             "--optimizer", "sgd", "--lr", "1e8"))
    assert proc.returncode == 4, proc.stderr
    # the divergence is caught by the loss check or the solver, whichever sees it first: exit 4 either way
    assert len(stderr_lines(proc)) == 1 and ("NaN or Inf" in proc.stderr or "non-finite" in proc.stderr)
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    # no result of the old (LS) run is left: no model, and metrics only if they are the failed FairGrad
    # run's own completed epochs
    assert not (run / "model.pt").exists()
    assert not (run / "metrics.json").exists() or json.loads((run / "metrics.json").read_text())["method"] == "fairgrad"
    proc = run_cli("evaluate", str(run), "--data", str(multimnist_tiny))
    assert proc.returncode == 3 and "did not complete" in proc.stderr


def test_a_non_finite_gramian_in_fairgrads_solver_exits_4_like_any_non_finite_value() -> None:
    from mtlflow import methods
    from mtlflow.core.errors import NonFiniteValueError

    grads = torch.tensor([[1.0, float("nan")], [0.5, 1.0]])
    with pytest.raises(NonFiniteValueError, match="NaN or Inf") as caught:
        methods.build("fairgrad", 2).combine(grads, torch.ones(2))
    assert caught.value.exit_code == 4


def test_sigterm_records_interrupted_keeps_the_checkpoint_and_resumes(multimnist_tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    victim = subprocess.Popen([sys.executable, "-m", "mtlflow", *mm_train(multimnist_tiny, run, "--epochs", "40")],
                              env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "checkpoint.pt").exists():
        assert victim.poll() is None, victim.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=60) == 143
    assert victim.stderr.read().strip().splitlines() == [
        "mtlflow: terminated by SIGTERM; checkpoints are intact, resume with the same command and --resume"]
    info = json.loads((run / "run.json").read_text())
    assert (info["status"], info["error"]) == ("interrupted", "Terminated: SIGTERM")
    stopped_at = torch.load(run / "checkpoint.pt", weights_only=False)["epoch"]
    assert 1 <= stopped_at < 40
    assert not (run / "model.pt").exists()
    resumed = run_cli(*mm_train(multimnist_tiny, run, "--epochs", "40", "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert len(json.loads((run / "metrics.json").read_text())["epochs"]) == 40


def test_resume_without_a_checkpoint_is_announced(shared, tmp_path: Path) -> None:
    proc = run_cli("train", "--data", str(shared["data"]), "--out", str(tmp_path / "new"), "--epochs", "1",
                   "--resume", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == [f"mtlflow: note: {tmp_path / 'new'} has no checkpoint to resume from; "
                                  "starting at epoch 1",
                                  "training: 1 epoch(s), 1000 optimizer steps, best validation epoch 1; not converged: "
                                  "train longer (the validation score improved within the last 1 epoch(s)); "
                                  "validation split too small to select epochs (1 rows, fewer than 100): its best "
                                  "epoch and its convergence are noise; give the validation split more rows (a "
                                  "spec's split:)"]


def test_dvc_push_leaves_no_temporary_copies_in_the_remote(shared, tmp_path: Path) -> None:
    pytest.importorskip("dvc")
    from mtlflow.ops import dvc as dvc_io

    remote = tmp_path / "remote"
    first = dvc_io.push_dataset(shared["data"], str(remote))
    again = dvc_io.push_dataset(shared["data"], str(remote))
    assert first["dvc_hash"] == again["dvc_hash"]
    stored = [p for p in (remote / "files" / "md5").rglob("*") if p.is_file()]
    assert [p.name for p in stored if p.name.endswith(".tmp")] == []
    assert len(stored) == first["nfiles"] + 1  # the files and the .dir listing
    pulled = dvc_io.pull_dataset(first["dvc_hash"], str(remote), tmp_path / "pulled")
    assert jobs.read_manifest(pulled)["content_hash"] == jobs.read_manifest(shared["data"])["content_hash"]
