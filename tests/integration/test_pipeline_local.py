"""benchmark_sweep (alias ``main``) end to end with kfp.local's SubprocessRunner: real subprocesses,
real artifacts, a real local DVC remote, checkpoints and the exit handler's status record."""

from __future__ import annotations

import builtins
import json

import pytest

from mtlflow.core.errors import InvalidParameterError, UnknownNameError
from mtlflow.ops import dvc as dvc_io
from mtlflow.pipelines import runner

ORIGINAL_PRINT = builtins.print
TINY_PARAMS = {
    "data_options": {"n_train": 300, "n_val": 100, "n_test": 100},
    "methods": ["ls", "fairgrad"],
    "seeds": [0],
    "reference_seeds": [0],
    "epochs": 1,
    "train_options": {"batch_size": 100, "device": "auto"},
}


@pytest.mark.slow
def test_benchmark_sweep_runs_locally(tmp_path, pushgateway, capfd):
    report = runner.run_local({**TINY_PARAMS, "pushgateway": pushgateway.url}, workdir=tmp_path, pipeline="main")
    assert report == tmp_path / "report.html"
    html = report.read_text()
    assert "fairgrad" in html and "data:image/png;base64," in html
    summary = json.loads((tmp_path / "results" / "results.json").read_text())
    assert set(summary["methods"]) == {"ls", "fairgrad"}
    assert {s["task"] for s in summary["references"]["sources"]} == {"left", "right"}
    assert all("delta_m" in row for row in summary["methods"].values())
    assert summary["selection_rules"] == ["last"]
    # every trained run and its evaluation are real files in the kfp.local artifact tree
    run = json.loads((tmp_path / "pipeline_run.json").read_text())
    artifacts = tmp_path / "artifacts"
    evaluations = list(artifacts.rglob("evaluate/evaluation"))
    assert {json.loads(p.read_text())["method"] for p in evaluations} == {"ls", "fairgrad"}
    # the exit handler recorded the final state
    assert run["status"]["state"] == "SUCCEEDED" and run["status"]["pipeline"] == "benchmark_sweep"
    # the dataset is versioned: its DVC hash matches the artifact and the local remote holds it
    prepared = json.loads(next(artifacts.rglob("prepare-data/executor_output.json")).read_text())
    meta = prepared["artifacts"]["data"]["artifacts"][0]["metadata"]
    storage = tmp_path / "storage"
    assert meta["dvc_remote"] == str(storage / "data" / "dvc-remote") and meta["git_revision"]
    assert meta["dvc_hash"] == dvc_io.directory_md5(next(artifacts.rglob("prepare-data/data")))
    assert any((storage / "data" / "dvc-remote").rglob(meta["dvc_hash"].split(".")[0][2:] + ".dir"))
    # 2 method runs + 2 references trained in resumable run directories under the checkpoint root
    # (and the baselines' cache, fitted once per data version, beside them)
    runs = [p for p in (storage / "checkpoints" / "runs").iterdir() if p.name != "baselines"]
    assert (storage / "checkpoints" / "runs" / "baselines").is_dir()
    assert sorted(p.name.rsplit("-", 1)[0] for p in runs) == ["fairgrad-s0", "ls-s0", "ls-s0-left", "ls-s0-right"]
    assert all((p / "checkpoint.pt").is_file() for p in runs)
    _check_ui_artifacts(artifacts, summary)
    _check_pushed_metrics(pushgateway, summary)
    # task progress with N/M, elapsed time and ETA: 13 tasks (prepare, 3 plans, 2 x (train + evaluate),
    # 2 references, the trivial baseline of the images, aggregate, status)
    printed = capfd.readouterr()
    progress = [line for line in printed.err.splitlines() if line.startswith("[benchmark_sweep ")]
    assert len(progress) == 13 and progress[-1].startswith("[benchmark_sweep 13/13] record-status done")
    assert all(" · elapsed " in line and " · ETA ~" in line for line in progress)
    # the terminal gets the progress lines, where the tasks' output went and the summary: not kfp.local's logs
    log = tmp_path / runner.LOG_NAME
    assert f"the tasks' output goes to {log}" in printed.err
    assert len(printed.out) + len(printed.err) < 5000 and "executor_output" not in printed.out + printed.err
    assert "executor_output.json" in log.read_text() and "Executing task" in log.read_text()
    assert "pipeline benchmark_sweep finished in" in printed.out.splitlines()[-1]
    assert builtins.print is ORIGINAL_PRINT  # kfp.local's per-task indenting print does not outlive the run


def _executor_artifacts(task_dir):
    return json.loads((task_dir / "executor_output.json").read_text())["artifacts"]


def _check_ui_artifacts(artifacts, summary):
    """What the Kubeflow UI renders: Metrics scalars, ClassificationMetrics, HTML and Markdown."""
    train_dirs = [p.parent for p in artifacts.rglob("report") if p.parent.name.startswith("train")]
    assert len(train_dirs) == 4
    for task_dir in train_dirs:
        page = (task_dir / "report").read_text()
        assert page.startswith("<!DOCTYPE html>") and 'src="data:image/png;base64,' in page
        assert "status: **completed**" in (task_dir / "summary").read_text()
    evaluations = [p.parent for p in artifacts.rglob("evaluate/evaluation")]
    assert len(evaluations) == 2
    for task_dir in evaluations:
        evaluation = json.loads((task_dir / "evaluation").read_text())
        meta = _executor_artifacts(task_dir)["confusion"]["artifacts"][0]["metadata"]
        assert meta["task"] == "left"
        rows = [r["row"] for r in meta["confusionMatrix"]["rows"]]
        assert rows == evaluation["confusion_matrices"]["left"]["matrix"]
        assert sum(map(sum, rows)) == 100  # n_test: every test sample once
        scalars = _executor_artifacts(task_dir)["metrics"]["artifacts"][0]["metadata"]
        assert scalars["test.left.acc"] == evaluation["metrics"]["left"]["acc"]
        assert "## Confusion matrix: right" in (task_dir / "summary").read_text()
    (aggregate_dir,) = [p.parent for p in artifacts.rglob("aggregate/summary")]
    assert (aggregate_dir / "summary").read_text().startswith("# mtlflow results: multimnist")
    scalars = _executor_artifacts(aggregate_dir)["metrics"]["artifacts"][0]["metadata"]
    for label, row in summary["methods"].items():
        assert scalars[f"{label}.delta_m_pct"] == row["delta_m"]


def _check_pushed_metrics(pushgateway, summary):
    """The run's training telemetry, comparison and final status are in the real Pushgateway."""
    from prometheus_support import parse_samples, sample

    samples = parse_samples(pushgateway.metrics_text())
    sweep = {"pipeline": "benchmark_sweep", "benchmark": "multimnist"}
    trained = {(lab["method"], lab["tasks"]) for name, lab, _ in samples
               if name == "mtlflow_train_epoch" and lab.get("pipeline") == "benchmark_sweep"}
    assert trained == {(label, "all") for label in summary["methods"]} | {("ls", "left"), ("ls", "right")}
    for label, row in summary["methods"].items():
        assert sample(samples, "mtlflow_delta_m_percent", method=label, reference="own", **sweep) == \
            pytest.approx(row["delta_m"])
    assert sample(samples, "mtlflow_pipeline_last_run_succeeded", pipeline="benchmark_sweep") == 1


def test_invalid_parameters_are_rejected_before_running(tmp_path):
    with pytest.raises(UnknownNameError, match="valid methods"):
        runner.run_local({**TINY_PARAMS, "methods": ["ls", "nope"]}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="empty"):
        runner.run_local({**TINY_PARAMS, "methods": []}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="epochs"):
        runner.run_local({**TINY_PARAMS, "epochs": -1}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="unknown benchmark_sweep parameter"):
        runner.run_local({**TINY_PARAMS, "bogus": 1}, workdir=tmp_path)
    with pytest.raises(InvalidParameterError, match="only on a cluster"):
        runner.run_local({}, workdir=tmp_path, pipeline="distributed_train")
    assert not (tmp_path / "artifacts").exists()
