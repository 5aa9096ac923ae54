"""The DVC experiment loop on a fresh `git clone` of this repository's committed HEAD (its dvc.yaml, params.yaml,
dvc.lock, metrics/ and plots/ as a user gets them), not on a copied dvc.yaml: two `dvc exp run`s with `-S`
changes on a tiny MultiMNIST sweep, `dvc exp show` with every metric of the baseline and of both experiments
read back (no `!`), `dvc metrics diff` against HEAD's committed metrics, `dvc plots show` (HTML) and `dvc plots
diff` between the experiments, the stages' code dependencies (a method's source re-runs the trainings only;
bytecode and docs re-run nothing), and the results committed, pushed and pulled into a second clone, where
`dvc repro` re-runs nothing but the source stage. And the task spec of the docs' first page, on a real
DVC-tracked table, through `dvc repro` and a new version of that table.

Commit the pipeline files before running it: it tests what a clone sees."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import churn_csv, first_page_commands, run_cli

ROOT = Path(__file__).resolve().parents[2]
#: the smallest sweep that still runs every stage: one method, one epoch, a few hundred digits
TINY = ["-S", "epochs=1", "-S", "train_options.min_steps=1", "-S", "methods=[fairgrad]", "-S", "seeds=[0]",
        "-S", "reference_seeds=[0]",
        "-S", "data_options.n_train=128", "-S", "data_options.n_val=64", "-S", "data_options.n_test=64"]
TRAIN_STAGES = {"train@fairgrad-0", "reference@left-0", "reference@right-0", "experiment"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(DVC_NO_ANALYTICS="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", GIT_AUTHOR_NAME="ci",
               GIT_AUTHOR_EMAIL="ci@example.com", GIT_COMMITTER_NAME="ci", GIT_COMMITTER_EMAIL="ci@example.com")
    return env


def _run(args, cwd) -> str:
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _dvc(cwd, *args) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd)


def _git_json(repo: Path, rev: str, path: str):
    return json.loads(_run(["git", "show", f"{rev}:{path}"], repo))


def stages_run(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


def changed_stages(repo: Path) -> dict[str, list]:
    """`dvc status --json` less the source stage, which is always changed (it re-reads the data's inputs)."""
    status = json.loads(_dvc(repo, "status", "--json"))
    assert status.pop("source", ["always changed"]) == ["always changed"], status
    # tuning/dvc.yaml's search is run only when asked for (`dvc repro tuning/dvc.yaml`): never run here
    return {stage: changes for stage, changes in status.items() if not stage.startswith("tuning/")}


def metric_files(row: dict) -> dict[str, dict]:
    """The metrics of one `dvc exp show --json` row, by file; a file DVC could not read fails here (`!`)."""
    metrics = row["data"]["metrics"]
    unreadable = {path: entry for path, entry in metrics.items() if "data" not in entry or "error" in entry}
    assert not unreadable, unreadable
    return {path: entry["data"] for path, entry in metrics.items()}


@pytest.mark.slow
def test_experiments_compare_and_reproduce_on_a_fresh_clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    repo, remote = tmp_path / "clone", tmp_path / "remote"
    _run(["git", "clone", "-q", str(ROOT), str(repo)], tmp_path)
    committed_summary = _git_json(repo, "HEAD", "metrics/summary.json")
    assert set(committed_summary) >= {"fairgrad"}, "dvc.lock and metrics/ of the default params.yaml"

    first = _dvc(repo, "exp", "run", "-n", "tiny", *TINY)
    assert stages_run(first) == {"source", "prepare", "baselines", "evaluate", "aggregate"} | TRAIN_STAGES
    second = _dvc(repo, "exp", "run", "-n", "famo", "-S", "dvc.experiment_method=famo")
    assert stages_run(second) == {"source", "experiment"}  # the research stage alone

    # exp show: the baseline's committed metrics and each experiment's, as committed in its ref
    rows = json.loads(_dvc(repo, "exp", "show", "--json"))
    baseline, = (row for row in rows if row["rev"] != "workspace")
    assert metric_files(baseline)["metrics/summary.json"] == committed_summary
    experiments = {e["revs"][0]["name"]: e["revs"][0] for e in baseline["experiments"]}
    assert set(experiments) == {"tiny", "famo"}
    for name, method in (("tiny", "fairgrad"), ("famo", "famo")):
        exp = experiments[name]
        metrics = metric_files(exp)
        assert set(metrics) == {"metrics/train/fairgrad-s0.json", "metrics/evaluate.json", "metrics/summary.json",
                                "metrics/experiment.json"}
        for path, values in metrics.items():
            assert values == _git_json(repo, exp["rev"], path), path
        assert exp["data"]["params"]["params.yaml"]["data"]["dvc"]["experiment_method"] == method
    table = _dvc(repo, "exp", "show", "--md", "--no-pager")
    cells = {cell.strip() for line in table.splitlines() for cell in line.split("|")}
    assert "!" not in cells and "tiny" in table and "famo" in table

    # metrics diff: HEAD's committed values against the workspace (the last experiment's results)
    diff = json.loads(_dvc(repo, "metrics", "diff", "--json"))["metrics/summary.json"]
    now = json.loads((repo / "metrics" / "summary.json").read_text())
    for key in ("delta_m", "hypervolume"):
        entry = diff[f"fairgrad.{key}"]
        assert (entry["old"], entry["new"]) == (committed_summary["fairgrad"][key], now["fairgrad"][key])

    # one method's hyper-parameter: its training and what follows re-run, not the references nor the research
    # stage (training famo here); the metric keys stay, so `dvc metrics diff` shows changes, not "-"
    third = _dvc(repo, "exp", "run", "-n", "alpha2", "-S", "method_hparams.fairgrad.alpha=2.0")
    assert stages_run(third) == {"source", "train@fairgrad-0", "evaluate", "aggregate"}
    diff = json.loads(_dvc(repo, "metrics", "diff", "tiny", "alpha2", "--all", "--json"))  # --all: also equal ones
    summary = diff["metrics/summary.json"]
    assert summary["fairgrad.hparams.alpha"] == {"old": 1.0, "new": 2.0, "diff": 1.0}
    before = metric_files(experiments["tiny"])["metrics/summary.json"]["fairgrad"]
    after = json.loads((repo / "metrics" / "summary.json").read_text())["fairgrad"]
    for key in ("delta_m", "mean_rank", "hypervolume"):  # both sides under the same key: a number each, no "-"
        assert (summary[f"fairgrad.{key}"]["old"], summary[f"fairgrad.{key}"]["new"]) == (before[key], after[key])
    assert diff["metrics/train/fairgrad-s0.json"]["left.loss"]["diff"] != 0  # another training indeed

    # plots: the per-epoch curves (one row per epoch) and the sweep's Pareto errors, as HTML and per revision
    curve = json.loads((repo / "plots" / "train" / "fairgrad-s0" / "left.json").read_text())
    assert [row["epoch"] for row in curve] == [1] and set(curve[0]) == {"epoch", "train_loss", "val", "test"}
    pareto, = json.loads((repo / "plots" / "pareto.json").read_text())
    assert pareto["method"] == "fairgrad" and pareto["label"] == "fairgrad(alpha=2.0)" and pareto["pareto_optimal"]
    assert pareto["left error"] == pareto["first task error"] == pytest.approx(1 - evaluated_accuracy(repo, "left"))
    assert pareto["right error"] == pareto["second task error"] == pytest.approx(1 - evaluated_accuracy(repo, "right"))
    _dvc(repo, "plots", "show", "-o", str(tmp_path / "plots"))
    page = (tmp_path / "plots" / "index.html").read_text()
    assert "plots/train/fairgrad-s0/left.json" in page and "Pareto front" in page and "second task error" in page
    assert "<script src=" not in page.replace(" ", "")  # the libraries are inlined: the page draws offline
    compared = json.loads(_dvc(repo, "plots", "diff", "tiny", "famo", "--json"))
    assert not compared.get("errors"), compared["errors"]
    revisions = {rev for plot in compared["data"]["plots/experiment/s0/left.json"] for rev in plot["revisions"]}
    assert revisions == {"tiny", "famo"}

    # code dependencies: bytecode and docs change nothing, a method's source re-runs the trainings only
    assert changed_stages(repo) == {}
    (repo / "src" / "mtlflow" / "core" / "__pycache__").mkdir(exist_ok=True)
    (repo / "src" / "mtlflow" / "core" / "__pycache__" / "atomic.cpython-311.pyc").write_bytes(b"\0")
    with (repo / "docs" / "guides" / "dvc.md").open("a") as docs:
        docs.write("\nAn edit of the docs.\n")
    assert changed_stages(repo) == {}
    fairgrad = repo / "src" / "mtlflow" / "methods" / "fairgrad.py"
    fairgrad.write_text(fairgrad.read_text() + "\n# an edit of a method\n")
    changed = changed_stages(repo)
    assert set(changed) == TRAIN_STAGES, changed
    assert all(entry == [{"changed deps": {"src/mtlflow/methods": "modified"}}] for entry in changed.values())
    _run(["git", "checkout", "-q", "--", "src", "docs"], repo)

    # the results committed and pushed: a second clone pulls them and is up to date
    _dvc(repo, "remote", "add", "-f", "-d", "local", str(remote))
    _run(["git", "add", "dvc.lock", "params.yaml", "metrics", "plots", ".dvc/config"], repo)
    _run(["git", "commit", "-qm", "the famo experiment"], repo)
    _dvc(repo, "push")
    again = tmp_path / "again"
    _run(["git", "clone", "-q", str(repo), str(again)], tmp_path)
    _dvc(again, "pull")
    # the source stage re-reads the data's inputs (its data/source.json is not cached); nothing else re-runs
    assert stages_run(_dvc(again, "repro")) == {"source"}
    assert json.loads((again / "metrics" / "experiment.json").read_text()) == experiments["famo"]["data"]["metrics"][
        "metrics/experiment.json"]["data"]
    shutil.rmtree(remote)


@pytest.mark.slow
def test_the_first_page_spec_runs_unchanged_in_dvc_repro_and_a_new_table_version_reruns_it(tmp_path):
    """The spec the docs' first command writes for churn.csv (real scm20d rows; the second command runs the same
    spec in the local pipeline, test_spec_realdata.py) as params.yaml's ``spec`` on a fresh clone, with the table
    DVC-tracked: `dvc repro` runs every stage on it, again runs only the source stage (also in a clone in
    another folder that pulled the results), and a new version of the table re-runs the pipeline from prepare."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    repo = tmp_path / "clone"
    _run(["git", "clone", "-q", str(ROOT), str(repo)], tmp_path)
    churn_csv(repo / "churn.csv", rows=600)
    spec_init = first_page_commands()[0].split()
    assert spec_init[:3] == ["mtlflow", "spec", "init"] and "churn.yaml" in spec_init
    proc = run_cli(*spec_init[1:], cwd=repo)
    assert proc.returncode == 0, proc.stderr
    _dvc(repo, "add", "-q", "churn.csv")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params.update(spec="churn.yaml", data_options={}, methods=["ls"], seeds=[0], reference_seeds=[0], epochs=1,
                  method_hparams={"ls": {}}, train_options={"batch_size": 100})
    params["dvc"] = {"reference_tasks": ["churned", "spend", "plan"], "experiment_method": "ls"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "add", "churn.csv.dvc", ".gitignore", "churn.yaml", "params.yaml"], repo)
    _run(["git", "commit", "-qm", "churn.csv, version 1"], repo)

    every_stage = {"source", "prepare", "baselines", "train@ls-0", "reference@churned-0", "reference@spend-0", "reference@plan-0",
                   "evaluate", "aggregate", "experiment"}
    assert stages_run(_dvc(repo, "repro")) == every_stage
    summary = json.loads((repo / "metrics" / "summary.json").read_text())
    assert set(summary) == {"ls"} and math.isfinite(summary["ls"]["delta_m"])
    experiment = json.loads((repo / "metrics" / "experiment.json").read_text())
    assert {"test.churned.roc_auc", "test.spend.mae"} <= set(experiment)
    source = json.loads((repo / "data" / "source.json").read_text())
    assert stages_run(_dvc(repo, "repro")) == {"source"}
    # committed and pushed, then pulled into a clone in another folder (a CI runner): nothing to re-run there
    _dvc(repo, "remote", "add", "-f", "-d", "local", str(tmp_path / "remote"))
    _run(["git", "add", "dvc.lock", "metrics", "plots", ".dvc/config"], repo)
    _run(["git", "commit", "-qm", "results on churn.csv, version 1"], repo)
    _dvc(repo, "push", "-q")
    runner = tmp_path / "elsewhere" / "runner"
    _run(["git", "clone", "-q", str(repo), str(runner)], tmp_path)
    _dvc(runner, "pull", "-q")
    assert stages_run(_dvc(runner, "repro")) == {"source"}
    assert json.loads((runner / "data" / "source.json").read_text()) == source

    churn_csv(repo / "churn.csv", rows=600, skip=600)  # the table's next version
    _dvc(repo, "add", "-q", "churn.csv")
    assert changed_stages(repo) == {}  # the table is not a dependency: the source stage reads it
    # ... and `mtlflow stage status` tells that it changed, before any repro
    status = run_cli("stage", "status", cwd=repo)
    # (tuning/dvc.yaml's search, never run here, is listed as not yet run: left out of this check)
    stages = [s for s in json.loads(status.stdout) if not s.startswith("tuning/")]
    assert status.returncode == 0 and stages == ["source"], status.stderr
    assert "changed since dvc.lock (table_sha256)" in json.loads(status.stdout)["source"][0]
    assert stages_run(_dvc(repo, "repro", "--single-item", "source")) == {"source"}
    assert json.loads((repo / "data" / "source.json").read_text())["table_sha256"] != source["table_sha256"]
    # prepare sees a new data version, and everything after it follows from prepare's output
    assert changed_stages(repo) == {"prepare": [{"changed deps": {"data/source.json": "modified"}}]}


def evaluated_accuracy(repo: Path, task: str) -> float:
    """The test accuracy of the sweep's run (the evaluate stage's metric), whose error the Pareto data plots."""
    return json.loads((repo / "metrics" / "evaluate.json").read_text())["fairgrad-s0"][f"{task}.acc"]
