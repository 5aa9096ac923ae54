"""Progress for people: `mtlflow report` of a run or an aggregate, the training progress bar's ETA, and the
task progress of local pipeline runs."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from mtlflow.ops.observability.progress import PipelineProgress, expected_tasks, format_seconds, task_label

#: the analytic toy problem: training takes milliseconds, the reports are what is tested
TOY = {"max_steps_per_epoch": 5}


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """On the toy problem: an MGDA run (2 epochs), single-task references, and their aggregate."""
    from mtlflow import jobs

    root = tmp_path_factory.mktemp("report")
    jobs.prepare("toy", root / "data", steps_per_epoch=10)
    jobs.train(root / "data", root / "mgda", method="mgda", epochs=2, progress=False, **TOY)
    for task in ("f1", "f2"):
        jobs.train(root / "data", root / f"ref-{task}", method="ls", tasks=[task], epochs=1, progress=False, **TOY)
    jobs.aggregate([root / "mgda"], root / "results", reference_dirs=[root / "ref-f1", root / "ref-f2"])
    return root


def test_report_of_a_run_directory(finished_runs, tmp_path, capsys):
    from mtlflow.cli import main

    out = tmp_path / "run.html"
    assert main(["report", str(finished_runs / "mgda"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    page = out.read_text()
    metrics = json.loads((finished_runs / "mgda" / "metrics.json").read_text())
    assert "<h1>mtlflow run: mgda on toy (seed 0)</h1>" in page and "Status <b>completed</b>" in page
    assert page.count('src="data:image/png;base64,') == 1
    # the final metrics table and one telemetry row per epoch
    assert f"<td>{metrics['final']['test']['f1']['value']:.4g}</td>" in page
    assert page.count("<tr><td>1</td>") == 1 and page.count("<tr><td>2</td>") == 1


def test_report_of_an_aggregate_directory_also_without_its_runs(finished_runs, tmp_path, capsys):
    from mtlflow.cli import main

    results = tmp_path / "results"
    shutil.copytree(finished_runs / "results", results)
    (results / "report.html").unlink()
    assert main(["report", str(results)]) == 0
    page = (results / "report.html").read_text()
    assert "<h1>mtlflow report: toy</h1>" in page and page.count('src="data:image/png;base64,') == 2
    # the run directories are gone: the learning curves come from the saved curves.png
    moved = tmp_path / "moved"
    shutil.move(str(finished_runs / "mgda"), moved)
    try:
        assert main(["report", str(results), "--out", str(tmp_path / "again.html")]) == 0
    finally:
        shutil.move(str(moved), finished_runs / "mgda")
    assert "mtlflow report: toy" in (tmp_path / "again.html").read_text()


def test_the_aggregate_of_one_seed_says_so_instead_of_a_zero_spread(finished_runs):
    page = (finished_runs / "results" / "report.html").read_text()
    table = (finished_runs / "results" / "results.md").read_text()
    for text in (page, table):
        assert "1 seed: no interval" in text and "± 0.0000" not in text
        assert "fewer than 3 seeds: mgda (1) (1 seed: no interval, no verdict)" in text
    assert page.index('aria-label="verdict"') < page.index("<h2>Results</h2>")
    assert "http://" not in page and "https://" not in page  # self-contained: nothing fetched from elsewhere
    rows = list(csv.DictReader(io.StringIO((finished_runs / "results" / "results.csv").read_text())))
    assert [r["method"] for r in rows] == ["mgda"] and rows[0]["delta_m% low"] == ""


def test_report_of_something_else_is_one_line_and_exit_3(tmp_path, capsys):
    from mtlflow.cli import main

    assert main(["report", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither a run directory" in err[0]


def test_training_progress_bar_shows_the_eta(finished_runs, tmp_path, capsys):
    from mtlflow import jobs

    jobs.train(finished_runs / "data", tmp_path / "run", method="ls", epochs=2, progress=True, **TOY)
    err = capsys.readouterr().err
    # tqdm: "<done>/<total> [<elapsed><<remaining>, <rate>]", 2 epochs x 5 steps
    assert re.search(r"toy/ls: .*10/10 \[\d\d:\d\d<\d\d:\d\d", err), err[-500:]


def test_pipeline_progress_counts_tasks_with_elapsed_time_and_eta(tmp_path):
    ticks = iter([0.0, 10.0, 30.0, 60.0])
    stream = io.StringIO()
    progress = PipelineProgress("benchmark_sweep", 4, tmp_path, stream=stream, clock=lambda: next(ticks))
    run = tmp_path / "mtlflow-benchmark-sweep-1"
    for task in ("prepare-data", "for-loop-2-iteration-1/train"):
        (run / task).mkdir(parents=True)
        (run / task / "executor_output.json").write_text("{}")
        progress.poll()
    progress.poll()  # nothing new
    assert progress.lines == ["[benchmark_sweep 1/4] prepare-data done · elapsed 0:10 · ETA ~0:30",
                              "[benchmark_sweep 2/4] train #1 done · elapsed 0:30 · ETA ~0:30"]
    assert stream.getvalue().splitlines() == progress.lines


def test_expected_task_counts_and_formats():
    params = {"methods": ["ls", "mgda", "famo"], "seeds": [0, 1], "reference_seeds": [0]}
    # prepare + 3 plans + 6 x (train + evaluate) + 2 references + the baselines + aggregate + status
    assert expected_tasks("benchmark_sweep", params, n_tasks=2) == 4 + 12 + 2 + 1 + 2
    assert expected_tasks("benchmark_sweep", params, n_tasks=2, baseline_kinds=3) == 4 + 12 + 2 + 3 + 2
    assert expected_tasks("retrain", {}, n_tasks=2) == 7
    assert format_seconds(59.6) == "1:00" and format_seconds(3725) == "1:02:05"
    assert task_label(Path("r/for-loop-3-iteration-12/train-2/executor_output.json")) == "train-2 #12"
