"""`mtlflow tune` killed mid-study (SIGKILL while a trial runs, after the first trials finished) and resumed with
--resume reaches the same trials and chosen configuration as an uninterrupted run with the same seed: the killed
trial is adopted (same number, same parameters, continued from its checkpoint), no trial is lost or repeated,
and each trial's steps count once. Two worker processes share one study journal without losing a trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtlflow import jobs
from mtlflow.jobs.tune import tune

HERE = Path(__file__).resolve().parents[1] / "unit" / "jobs"
BENCHMARK = "tune_problems:Quadratic"
BUDGET_TRIALS = 6

pytestmark = pytest.mark.integration


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(HERE))
    path = tmp_path / "data"
    jobs.prepare(BENCHMARK, path, steps_per_epoch=8)  # a few steps per epoch: a kill lands inside a trial
    return path


def tune_cmd(data: Path, out: Path, *extra: str, budget: int = BUDGET_TRIALS) -> list[str]:
    return [sys.executable, "-m", "mtlflow", "tune", "--data", str(data), "--out", str(out), "--budget-trials",
            str(budget), "--retrain-seeds", "1", "--no-references", "--no-compare", "--no-progress", "--startup-trials", "3",
            "--seed", "5", "--selection", "holdout", *extra]  # one 1-row val split: the holdout path on purpose


def trials(out: Path) -> list[dict]:
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "study.journal")))
    return [{"number": t.number, "state": t.state.name, "params": t.params, "value": t.value,
             "steps": t.user_attrs.get("steps"), "intermediate": t.intermediate_values}
            for t in optuna.load_study(study_name="ls", storage=storage).get_trials()]


@pytest.mark.slow
def test_a_killed_tune_resumes_to_the_same_trials_and_choice(tmp_path: Path, data: Path) -> None:
    victim_out = tmp_path / "killed"
    victim = subprocess.Popen(tune_cmd(data, victim_out), env=env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    # the uninterrupted run: the same job in this process (what the command calls with these flags)
    tune(tmp_path / "uninterrupted", ["ls"], data_dir=data, budget_trials=BUDGET_TRIALS, retrain_seeds=1,
         references=False, compare=False, progress=False, startup_trials=3, seed=5, selection="holdout")
    third = victim_out / "trials" / "ls" / "0002"
    deadline = time.monotonic() + 120
    while True:  # trials 0 and 1 finished (one at a time), trial 2 running with at least one epoch checkpointed
        assert victim.poll() is None, "tune finished before the kill; make its trials longer"
        assert time.monotonic() < deadline, "no third trial running after 120 s"
        if (third / "checkpoint.pt").is_file() and not (third / "model.pt").exists():
            break
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    killed = [t for t in trials(victim_out) if t["state"] == "RUNNING"]
    assert [t["number"] for t in killed] == [2], "the kill must land while the third trial runs"

    resumed = subprocess.run(tune_cmd(data, victim_out, "--resume"), env=env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    after, before = trials(victim_out), trials(tmp_path / "uninterrupted")
    assert [t["state"] for t in after] == [t["state"] for t in before] and "FAIL" not in {t["state"] for t in after}
    assert after == before  # same numbers, parameters, values, intermediate values and recorded steps
    assert {t["number"] for t in killed} <= {t["number"] for t in after if t["state"] in ("COMPLETE", "PRUNED")}
    chosen = [json.loads((out / "tune.json").read_text())["studies"]["ls"]["chosen"]
              for out in (victim_out, tmp_path / "uninterrupted")]
    assert chosen[0] == chosen[1]


@pytest.mark.slow
def test_two_workers_share_one_study(tmp_path: Path, data: Path) -> None:
    out = tmp_path / "shared"
    # the worker imports everything first and joins the moment the first process has written its plan: the CLI's
    # main, called as `mtlflow tune ... --worker` would call it
    join = ("import sys, time, pathlib; import mtlflow.jobs.tune; from mtlflow.cli import main\n"
            f"while not pathlib.Path({str(out / 'plan.json')!r}).is_file(): time.sleep(0.001)\n"
            f"sys.exit(main({tune_cmd(data, out, '--worker', budget=12)[3:]!r}))")
    second = subprocess.Popen([sys.executable, "-c", join], env=env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen(tune_cmd(data, out, budget=12), env=env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    assert second.wait(timeout=300) == 0, second.stderr.read()
    assert first.wait(timeout=300) == 0, first.stderr.read()
    result = json.loads((out / "tune.json").read_text())["studies"]["ls"]
    seen = trials(out)
    assert all(t["state"] in ("COMPLETE", "PRUNED") for t in seen)
    workers = {t["worker"] for t in _user_attrs(out)}
    assert len(workers) == 2, "both processes ran trials"
    assert result["spent"]["steps"] == sum(t["steps"] for t in seen) <= result["spent"]["budget_steps"]
    assert len({t["run_dir"] for t in _user_attrs(out)}) == len(seen)  # one run directory per trial


def _user_attrs(out: Path) -> list[dict]:
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "study.journal")))
    return [t.user_attrs for t in optuna.load_study(study_name="ls", storage=storage).get_trials()]
