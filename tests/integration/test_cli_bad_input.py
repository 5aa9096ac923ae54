"""The ``mtlflow`` command line in a real subprocess: exit codes and one-line errors for bad input,
the listing commands, and ``evaluate`` / ``aggregate`` on tiny finished runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
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
    for row in summary["methods"].values():
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


# -- the battery of spec fields and sizes (issue 29, items 9 and 11) ------------------------------

def write_table(folder: Path) -> Path:
    """A 60-row table: two numeric features, a binary label ``a``, a numeric ``b`` and a binary ``größe``."""
    rows = ["x1,x2,a,b,größe"] + [f"{(7 * i) % 11 / 10},{(5 * i) % 13 / 10},{i % 2},{(3 * i) % 17 / 10},{i // 30}"
                                  for i in range(60)]
    table = folder / "table.csv"
    table.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return table


def write_spec(folder: Path, text: str = "") -> Path:
    """A spec of :func:`write_table`'s table with ``text`` appended (more top-level keys)."""
    write_table(folder)
    spec = folder / "spec.yaml"
    spec.write_text("name: mine\nsource:\n  table: table.csv\ntasks:\n  - name: a\n    type: binary\n"
                    "  - name: b\n    type: regression\nfeatures:\n  numeric: [x1, x2]\n" + text, encoding="utf-8")
    return spec


def blank_column(column: str) -> Callable[[Path], None]:
    """A table edit: every cell of ``column`` empty."""
    def edit(table: Path) -> None:
        rows = [line.split(",") for line in table.read_text(encoding="utf-8").splitlines()]
        at = rows[0].index(column)
        for row in rows[1:]:
            row[at] = ""
        table.write_text("\n".join(",".join(row) for row in rows) + "\n", encoding="utf-8")
    return edit


def bad_cell(table: Path) -> None:
    """A table edit: data row 5 of the numeric feature x2 holds text."""
    lines = table.read_text(encoding="utf-8").splitlines()
    cells = lines[5].split(",")
    cells[1] = "abc"
    lines[5] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("case, text, edit, command, expected", [
    ("factory of another signature", "model:\n  factory: json:dumps\n", None, "train",
     ["spec.yaml:12: model.factory: json:dumps", "function(spec, schema)"]),
    ("factory returning no model", "model:\n  factory: operator:is_\n", None, "train",
     ["operator:is_ returned a bool, not a mtlflow.models.MultiTaskModel"]),
    # issue 29, item 9: prepare builds the factory's model on the prepared schema as its last step
    ("factory returning no model at prepare", "model:\n  factory: operator:is_\n", None, "prepare",
     ["spec.yaml:12: model.factory: operator:is_ returned a bool, not a mtlflow.models.MultiTaskModel"]),
    ("factory of another signature at prepare", "model:\n  factory: json:dumps\n", None, "prepare",
     ["spec.yaml:12: model.factory: json:dumps", "function(spec, schema)"]),
    ("factory that raises at prepare", "model:\n  factory: operator:truediv\n", None, "prepare",
     ["spec.yaml:12: model.factory: operator:truediv raised TypeError", "fix the factory"]),
    ("a width of 1e12", "model:\n  hidden: [1000000000000]\n", None, "prepare", ["spec.yaml:12: model.hidden", "65536"]),
    ("3.6e9 hidden weights", "model:\n  hidden: [60000, 60000]\n", None, "prepare", ["model.hidden", "budget"]),
    ("unknown train: key", "train:\n  epohcs: 3\n", None, "train",
     ["training default(s) epohcs (the spec's train: section", "not `mtlflow train` options"]),
    ("unknown train: key at prepare", "train:\n  epohcs: 3\n", None, "prepare", ["training default(s) epohcs"]),
    ("a batch of 2**70 in train:", f"train:\n  batch_size: {2**70}\n", None, "prepare",
     ["batch_size must be an integer from 1 to 2147483648"]),
    ("duplicate YAML key", "name: other\n", None, "prepare",
     ["spec.yaml:11:1: key 'name' appears twice in one mapping (first at line 1)"]),
    ("non-numeric cell", "", bad_cell, "prepare",
     ["spec.yaml:10: features.numeric[1]: feature 'x2' is not numeric: data row 5 holds 'abc'; clean the cell or list "
      "the column under features.categorical"]),
    ("all-missing label", "", blank_column("a"), "prepare",
     ["tasks[0].name: class column 'a' has no labels: every cell is empty"]),
    ("non-numeric cell through train", "", bad_cell, "train",
     ["spec.yaml:10: features.numeric[1]: feature 'x2'"]),
    ("all-missing label through train", "", blank_column("a"), "train", ["class column 'a' has no labels"]),
])
def test_spec_fields_are_refused_in_one_line(case: str, text: str, edit: Callable[[Path], None] | None, command: str,
                                             expected: list[str], tmp_path: Path) -> None:
    """Through `train --spec` (prepared into the cache first) the errors keep the spec's FILE:LINE too, and the
    refusal is the only line: the spec is checked before "preparing ... into the cache" (issue 29, item 11)."""
    spec = write_spec(tmp_path, text)
    if edit is not None:
        edit(tmp_path / "table.csv")
    if command == "train":
        proc = run_cli("train", "--spec", str(spec), "--epochs", "1", "--out", str(tmp_path / "out"),
                       env={"MTLFLOW_CACHE": str(tmp_path / "cache")})
    else:
        proc = run_cli("prepare", "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, (case, proc.stderr)
    assert "Traceback" not in proc.stderr, case
    (line,) = stderr_lines(proc)
    for part in expected:
        assert part in line, (case, line)
    assert not (tmp_path / "out").exists(), case


@pytest.mark.parametrize("tasks, expected", [("a,a", "--tasks names a more than once"),
                                             ("a,nope", "--tasks nope: not columns")])
def test_spec_init_refuses_task_columns_in_one_line(tasks: str, expected: str, tmp_path: Path) -> None:
    table = write_table(tmp_path)
    proc = run_cli("spec", "init", str(table), "--tasks", tasks, "--out", str(tmp_path / "spec.yaml"))
    assert expected in assert_one_line_error(proc, 2)
    assert not (tmp_path / "spec.yaml").exists()


def test_spec_init_names_a_task_whose_column_is_no_valid_name(tmp_path: Path) -> None:
    """``größe`` is a column but no task name (ASCII letters, digits, _ . -): the task keeps it as its column."""
    import yaml

    table = write_table(tmp_path)
    proc = run_cli("spec", "init", str(table), "--tasks", "a,größe", "--out", str(tmp_path / "spec.yaml"))
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "spec.yaml").read_text(encoding="utf-8"))
    assert written["tasks"][1] == {"name": "gr__e", "column": "größe", "type": "binary"}
    proc = run_cli("prepare", "--spec", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "data"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("option, value, expected", [
    ("--batch-size", str(2**70), "batch_size must be an integer from 1 to 2147483648"),
    ("--eval-batch-size", str(2**70), "eval_batch_size must be an integer from 1 to 2147483648"),
    ("--batch-size", str(2**31 + 1), "batch_size must be an integer from 1 to 2147483648"),
    ("--architecture", "os.path:join", "architecture os.path:join is the function posixpath.join, not a model factory"),
])
def test_sizes_and_factories_are_refused_before_training(option: str, value: str, expected: str,
                                                         tmp_path: Path) -> None:
    data = tmp_path / "toy"
    jobs.prepare("toy", data)
    proc = run_cli("train", "--data", str(data), option, value, "--epochs", "1", "--out", str(tmp_path / "run"))
    assert expected in assert_one_line_error(proc, 2)
    assert not (tmp_path / "run").exists(), "a refused input left a run directory (run.json 'failed')"


@pytest.mark.parametrize("case, edit, expected", [
    ("missing table", ("table: table.csv", "table: nope.csv"), "spec.yaml:3: source.table: file not found"),
    ("unknown task column", ("name: b\n", "name: nocol\n"), "tasks[1].name: column 'nocol' is not in the table"),
])
def test_pipeline_refuses_a_bad_spec_before_it_starts(case: str, edit: tuple[str, str], expected: str,
                                                      tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text(encoding="utf-8").replace(*edit), encoding="utf-8")
    workdir = tmp_path / "pipeline"
    proc = run_cli("pipeline", "run", "--local", "--param", f"spec={spec}", "--workdir", str(workdir))
    assert expected in assert_one_line_error(proc, 2), case
    assert not workdir.exists(), f"{case}: the workdir was written for a refused spec"


def test_a_failed_pipeline_task_is_reported_by_its_own_error(tmp_path: Path) -> None:
    """The last mtlflow error of the failed task's traceback in kfp-local.log, whatever module defines it."""
    from mtlflow.pipelines.runner import failure_reason

    log = tmp_path / "kfp-local.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "mtlflow.benchmarks._spec.schema.SpecError: /d/spec.yaml:12: tasks[1].name: column 'nocol' is "
                   "not in the table (columns: a, b); fix the name\n"
                   "\x1b[31mERROR\x1b[0m Task 'prepare-data' finished with status FAILURE\n")
    reason = failure_reason("Inner task failed: 'prepare-data'\nmore", log)
    assert reason == "/d/spec.yaml:12: tasks[1].name: column 'nocol' is not in the table (columns: a, b); fix the name"
    log.write_text("Traceback (most recent call last):\nmtlflow.core.errors.DataError: /d/manifest.json is missing\n")
    assert failure_reason("Inner task failed: 'train'", log) == "/d/manifest.json is missing"
    log.write_text("nothing of mtlflow here\n")
    assert failure_reason("\x1b[31mInner task failed: 'train'\x1b[0m\nmore", log) == "Inner task failed: 'train'"


def _toy_data(tmp_path: Path) -> None:
    jobs.prepare("toy", tmp_path / "toy")


def _unknown_benchmark_manifest(tmp_path: Path) -> None:
    _toy_data(tmp_path)
    manifest = json.loads((tmp_path / "toy" / "manifest.json").read_text())
    (tmp_path / "toy" / "manifest.json").write_text(json.dumps({**manifest, "benchmark": "nobench"}))


def _non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")


def _sweep_project(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).resolve().parents[2] / "params.yaml", tmp_path / "params.yaml")


@pytest.mark.parametrize("case, setup, argv, code, expected", [
    ("repeated reference seeds", None, "pipeline run --local --param benchmark=toy --param reference_seeds=[0,0] "
     "--workdir {t}/out", 2, "reference_seeds lists 0 more than once; give each once"),
    ("duplicate key in a params file", lambda t: (t / "p.yaml").write_text("epochs: 1\nseeds: [0]\nepochs: 2\n"),
     "pipeline run --local --params {t}/p.yaml --workdir {t}/out", 2,
     "p.yaml:3:1: key 'epochs' appears twice in one mapping (first at line 1)"),
    ("data pull into a non-empty folder", _non_empty_folder, "data pull 0123456789abcdef0123456789abcdef.dir "
     "--remote {t}/remote --out {t}/out", 2, "out is not empty; pull a data version into a new directory"),
    ("manifest of an unknown benchmark", _unknown_benchmark_manifest, "train --data {t}/toy --out {t}/out", 3,
     "toy/manifest.json names benchmark 'nobench', which is not installed here"),
    ("--spec with --data", _toy_data, "train --data {t}/toy --spec {t}/spec.yaml --out {t}/out", 2,
     "error: --spec applies only where this command prepares the data"),  # not "--benchmark spec disagrees"
    ("experiment without references", _sweep_project, "stage experiment", 3,
     "the single-task references runs/reference/left-s0, "),
])
def test_other_inputs_are_refused_in_one_line(case: str, setup: Callable[[Path], None] | None, argv: str, code: int,
                                              expected: str, tmp_path: Path) -> None:
    if setup is not None:
        setup(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = run_cli(*argv.format(t=tmp_path).split(), cwd=tmp_path)
    line = assert_one_line_error(proc, code)
    assert expected in line, (case, line)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, f"{case}: something was written"


def test_spec_init_says_which_columns_it_leaves_out(tmp_path: Path) -> None:
    """A numeric column with a text cell is neither a feature nor categories: the output names it and the cell."""
    table = write_table(tmp_path)
    bad_cell(table)
    proc = run_cli("spec", "init", str(table), "--tasks", "a,b", "--out", str(tmp_path / "spec.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert "x2 (data row 5 holds 'abc')" in proc.stdout
    assert "features.numeric" in proc.stdout
    import yaml

    features = yaml.safe_load((tmp_path / "spec.yaml").read_text(encoding="utf-8"))["features"]
    assert features == {"numeric": ["x1", "größe"], "categorical": []}


def test_an_interrupted_prepare_does_not_suggest_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`prepare` has no --resume: its interruption message says to start it again."""
    from mtlflow.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "prepare", interrupted)
    assert main(["prepare", "--benchmark", "toy", "--out", str(tmp_path / "data")]) == 130
    message = capsys.readouterr().err
    assert "--resume" not in message and "start the same command again" in message
