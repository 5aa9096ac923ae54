"""The ``mtlflow`` command line in a real subprocess: exit codes and one-line errors for bad input,
the listing commands, and ``evaluate`` / ``aggregate`` on tiny finished runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_RUN, run_cli, stderr_lines

from mtlflow import benchmarks, jobs, methods
from mtlflow.core.errors import InvalidParameterError


def assert_one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mtlflow: error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


def cache_is_empty(cache: Path) -> bool:
    return not cache.exists() or not any(cache.rglob("*"))


# -- usage errors (exit 2) ------------------------------------------------------------------------

def test_unknown_method(tmp_path: Path) -> None:
    proc = run_cli("train", "--benchmark", "toy", "--method", "nope", "--out", str(tmp_path / "run"),
                   env={"MTLFLOW_CACHE": str(tmp_path / "cache")})
    line = assert_one_line_error(proc, 2)
    assert "unknown method 'nope'" in line
    for name in methods.available():
        assert name in line
    assert cache_is_empty(tmp_path / "cache")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_unknown_benchmark(command: str, tmp_path: Path) -> None:
    proc = run_cli(command, "--benchmark", "nobench", "--out", str(tmp_path / "out"),
                   env={"MTLFLOW_CACHE": str(tmp_path / "cache")})
    line = assert_one_line_error(proc, 2)
    assert "unknown benchmark 'nobench'" in line
    for name in benchmarks.available():
        assert name in line
    assert not (tmp_path / "out").exists()


def test_invalid_hparam_rejected_before_data_is_prepared(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli("train", "--benchmark", "multimnist", "--method", "fairgrad", "--hp", "alpha=-1",
                   "--out", str(tmp_path / "run"), env={"MTLFLOW_CACHE": str(cache)})
    line = assert_one_line_error(proc, 2)
    assert "alpha" in line and "> 0" in line
    assert "preparing" not in proc.stderr
    assert cache_is_empty(cache)


def test_unknown_hparam_name(multimnist_small: Path, tmp_path: Path) -> None:
    proc = run_cli("train", "--data", str(multimnist_small), "--method", "mgda", "--hp", "gamma=1",
                   "--out", str(tmp_path / "run"))
    line = assert_one_line_error(proc, 2)
    assert "gamma" in line and "solver" in line
    assert not (tmp_path / "run").exists()


def test_zero_epochs(multimnist_small: Path, tmp_path: Path) -> None:
    proc = run_cli("train", "--data", str(multimnist_small), "--epochs", "0", "--out", str(tmp_path / "run"))
    line = assert_one_line_error(proc, 2)
    assert "epochs" in line
    assert not (tmp_path / "run").exists()


def test_zero_epochs_rejected_before_data_is_prepared(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli("train", "--benchmark", "toy", "--epochs", "0", "--out", str(tmp_path / "run"),
                   env={"MTLFLOW_CACHE": str(cache)})
    assert proc.returncode == 2
    assert cache_is_empty(cache), "data was prepared before --epochs 0 was rejected"


def test_hp_values_are_parsed_as_yaml_scalars() -> None:
    from mtlflow.cli.common import parse_assignments

    parsed = parse_assignments(["alpha=2", "solver=frank-wolfe", "gamma=0.001", "flag=true", "tol=1.0e-4"], "--hp")
    assert parsed == {"alpha": 2, "solver": "frank-wolfe", "gamma": 0.001, "flag": True, "tol": 1e-4}
    with pytest.raises(InvalidParameterError, match="KEY=VALUE"):
        parse_assignments(["novalue"], "--hp")


def test_hp_scientific_notation_is_a_float() -> None:
    from mtlflow.cli.common import parse_assignments

    hparams = parse_assignments(["w_lr=1e-3"], "--hp")
    assert hparams == {"w_lr": 1e-3}
    assert methods.build("famo", 2, **hparams).hp["w_lr"] == 1e-3


# -- data errors (exit 3) -------------------------------------------------------------------------

def test_missing_data_dir(tmp_path: Path) -> None:
    proc = run_cli("train", "--data", "/nonexistent", "--out", str(tmp_path / "run"))
    line = assert_one_line_error(proc, 3)
    assert "/nonexistent/manifest.json" in line
    assert not (tmp_path / "run").exists()


def test_corrupt_data_is_rejected(small_copy: Path, tmp_path: Path) -> None:
    with open(small_copy / "train.pt", "r+b") as fh:
        fh.truncate(100)
    proc = run_cli("train", "--data", str(small_copy), "--out", str(tmp_path / "run"))
    line = assert_one_line_error(proc, 3)
    assert str(small_copy) in line and "prepare" in line
    assert not (tmp_path / "run").exists()


def test_corrupt_data_error_names_the_file(small_copy: Path, tmp_path: Path) -> None:
    with open(small_copy / "train.pt", "r+b") as fh:
        fh.truncate(100)
    proc = run_cli("train", "--data", str(small_copy), "--out", str(tmp_path / "run"))
    assert proc.returncode == 3
    assert "train.pt" in proc.stderr


def test_mnist_dir_without_idx_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("prepare", "--benchmark", "multimnist", "--out", str(tmp_path / "data"),
                   "--mnist-dir", str(empty))
    line = assert_one_line_error(proc, 3)
    assert str(empty / "t10k-images-idx3-ubyte.gz") in line
    assert not (tmp_path / "data").exists()


# -- listings -------------------------------------------------------------------------------------

def test_methods_lists_every_method() -> None:
    proc = run_cli("methods")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith(" ")}
    assert listed == set(methods.available())
    proc = run_cli("methods", "--json")
    assert proc.returncode == 0
    assert [m["name"] for m in json.loads(proc.stdout)] == methods.available()


def test_benchmarks_lists_every_benchmark() -> None:
    proc = run_cli("benchmarks")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith(" ")}
    assert listed == set(benchmarks.available())
    assert "left, right" in proc.stdout


# -- evaluate and aggregate -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs(multimnist_small: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two multi-task runs (LS, MGDA) and two single-task references, one epoch of two steps each."""
    root = tmp_path_factory.mktemp("runs")
    runs = {
        "ls": dict(method="ls"),
        "mgda": dict(method="mgda"),
        "ref-left": dict(method="ls", tasks=["left"]),
        "ref-right": dict(method="ls", tasks=["right"]),
    }
    for name, opts in runs.items():
        jobs.train(multimnist_small, root / name, epochs=1, **opts, **TINY_RUN)
    return {name: root / name for name in runs}


def test_evaluate_writes_evaluation_json(tiny_runs: dict[str, Path], multimnist_small: Path, tmp_path: Path) -> None:
    run = tmp_path / "ls"
    shutil.copytree(tiny_runs["ls"], run)
    proc = run_cli("evaluate", str(run), "--data", str(multimnist_small))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "evaluation.json").read_text())
    assert result["split"] == "test" and result["method"] == "ls"
    assert result["tasks"] == ["left", "right"]
    final = json.loads((run / "metrics.json").read_text())["final"]["test"]
    for task in ("left", "right"):
        assert result["metrics"][task]["acc"] == pytest.approx(final[task]["acc"])
        assert result["metrics"][task]["loss"] == pytest.approx(final[task]["loss"], rel=1e-5)
    assert json.loads(proc.stdout) == result["metrics"]


def test_evaluate_on_other_data_is_rejected(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "toy"
    jobs.prepare("toy", other)
    proc = run_cli("evaluate", str(tiny_runs["ls"]), "--data", str(other), "--out", str(tmp_path / "e.json"))
    line = assert_one_line_error(proc, 3)
    assert "same prepared data" in line
    assert not (tmp_path / "e.json").exists()


def test_aggregate_writes_report_with_delta_m(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "agg"
    proc = run_cli("aggregate", str(tiny_runs["ls"]), str(tiny_runs["mgda"]),
                   "--references", str(tiny_runs["ref-left"]), str(tiny_runs["ref-right"]), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("results.json", "results.md", "report.html", "pareto.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    summary = json.loads((out / "results.json").read_text())
    assert set(summary["methods"]) == {"ls", "mgda"}
    refs = summary["references"]
    assert set(refs["metrics"]) == {"left", "right"}
    for label, row in summary["methods"].items():
        assert isinstance(row["delta_m"], float)
        # Δm% recomputed from the stored means and references (accuracy: higher is better)
        terms = [-(row["mean"][t]["acc"] - refs["metrics"][t]["acc"]) / refs["metrics"][t]["acc"]
                 for t in ("left", "right")]
        assert row["delta_m"] == pytest.approx(100 * sum(terms) / 2)
        assert row["mean_rank"] >= 1.0
    assert summary["pareto_set"]
    assert "Δm%" in (out / "results.md").read_text()
    html = (out / "report.html").read_text()
    assert "Δm%" in html and "data:image/png;base64," in html
    assert "| ls " in proc.stdout and "| mgda " in proc.stdout


def test_aggregate_rejects_unfinished_run(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_runs["ls"], broken)
    info = json.loads((broken / "run.json").read_text())
    info["status"] = "failed"
    (broken / "run.json").write_text(json.dumps(info))
    proc = run_cli("aggregate", str(broken), "--out", str(tmp_path / "agg"))
    line = assert_one_line_error(proc, 3)
    assert "did not complete" in line
