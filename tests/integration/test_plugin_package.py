"""The example plug-in package (examples/plugin_package/) as a user meets it, through the ``mtlflow`` command
line in a fresh interpreter: installed (pip, offline, into a folder on PYTHONPATH) its benchmark, method and
architecture are listed with their distribution and prepare, train and evaluate by their entry-point names;
not installed, its import paths do the same; bad plug-ins are one line and exit code 2.

Each test runs its commands in one interpreter (:func:`mtlflow_commands`): importing torch costs seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "examples" / "plugin_package"
DISTRIBUTION = "churn-plugin"
TINY = ("--epochs", "1", "--max-steps-per-epoch", "2", "--batch-size", "32", "--no-progress")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder holding the example package installed by pip (no network, no build isolation) from a copy
    of its source (the build writes into the source tree)."""
    root = tmp_path_factory.mktemp("plugin")
    shutil.copytree(PACKAGE, root / "source")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(root / "site"), str(root / "source")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return str(root / "site")


def dist_info(folder: Path, distribution: str, entry_points: str) -> str:
    """A folder with a hand-made installed distribution declaring ``entry_points`` (entry_points.txt text)."""
    info = folder / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return str(folder)


#: runs the ``mtlflow`` commands of argv (JSON lists of arguments) one after the other, as ``python -m mtlflow``
#: would (an exception that escapes the command line's error handling ends the interpreter with its traceback)
DRIVER = """
import contextlib, io, json, sys
from mtlflow.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def mtlflow_commands(*commands: list[str], path: str) -> list[dict]:
    """``{"code", "stdout", "stderr"}`` of each command, run in a fresh interpreter with PYTHONPATH ``path``."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def one_line_usage_error(result: dict) -> str:
    assert result["code"] == 2, result
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert len(lines) == 1, result["stderr"]
    return lines[0]


def listed(output: str) -> dict[str, str]:
    """``{name: origin}`` of a text listing (an entry's name starts a line, its "from:" line follows)."""
    origins, name = {}, None
    for line in output.splitlines():
        if line and not line.startswith(" "):
            name = line.split()[0]
        elif line.strip().startswith("from: "):
            origins[name] = line.strip().removeprefix("from: ")
    return origins


def test_installed_plugins_are_listed_with_their_distribution(installed: str, tmp_path: Path) -> None:
    methods, benchmarks, architectures, unknown = mtlflow_commands(
        ["methods", "--json"], ["benchmarks"], ["architectures", "--json"],
        ["prepare", "--benchmark", "chrun", "--out", str(tmp_path / "data")], path=installed)
    for listing in (methods, benchmarks, architectures):
        assert listing["code"] == 0, listing["stderr"]
    origins = {row["name"]: row["from"] for row in json.loads(methods["stdout"])}
    assert origins["unitsum"] == DISTRIBUTION and origins["ls"] == "mtlflow"
    assert json.loads(methods["stdout"])[list(origins).index("unitsum")]["requires"] == "gramian"
    origins = listed(benchmarks["stdout"])
    assert origins["churn"] == DISTRIBUTION and origins["toy"] == "mtlflow"
    origins = {row["name"]: row["from"] for row in json.loads(architectures["stdout"])}
    assert origins == {"hps": "mtlflow", "normal": "mtlflow", "wide-mlp": DISTRIBUTION}
    line = one_line_usage_error(unknown)
    assert line.startswith("mtlflow: error: unknown benchmark 'chrun'; valid benchmarks: ") and "churn" in line


def prepare_train_evaluate(tmp_path: Path, path: str, benchmark: str, method: str, architecture: str) -> None:
    """Prepare, train and evaluate; the records name the plug-ins as given, and evaluation rebuilds the run
    from them alone."""
    data, run = str(tmp_path / "data"), str(tmp_path / "run")
    results = mtlflow_commands(
        ["prepare", "--benchmark", benchmark, "--data-option", "rows=200", "--out", data],
        ["train", "--data", data, "--method", method, "--architecture", architecture, "--architecture-option",
         "width=16", *TINY, "--out", run],
        ["evaluate", "--data", data, run], path=path)
    for result in results:
        assert result["code"] == 0, result["stderr"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (record["benchmark"], record["config"]["method"], record["config"]["architecture"]) == (
        benchmark, method, architecture)
    model = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert model["benchmark"] == benchmark
    assert model["architecture"] == {"name": architecture, "options": {"width": 16, "depth": 2}}
    assert set(json.loads(results[-1]["stdout"].splitlines()[-1])) == {"churn", "spend"}


def test_installed_plugins_prepare_train_and_evaluate_by_name(installed: str, tmp_path: Path) -> None:
    prepare_train_evaluate(tmp_path, installed, "churn", "unitsum", "wide-mlp")


def test_import_paths_need_no_installation(tmp_path: Path) -> None:
    prepare_train_evaluate(tmp_path, str(PACKAGE), "churn_plugin.tasks:Churn", "churn_plugin.methods:UnitGradientSum",
                           "churn_plugin.models:wide_mlp")


#: (flag, name, the start of the error) of bad plug-in names; without installation the entry-point name is unknown
BAD_NAMES = [
    ("--method", "my_pkg:MyMethod", "mtlflow: error: cannot import my_pkg:MyMethod (ModuleNotFoundError: No module "
     "named 'my_pkg'); install the package or fix the path"),
    ("--method", "churn_plugin.models:wide_mlp", "mtlflow: error: method churn_plugin.models:wide_mlp is the function "
     "churn_plugin.models.wide_mlp, not a subclass of mtlflow.methods.base.Method"),
    ("--benchmark", "churn_plugin.methods:UnitGradientSum", "mtlflow: error: benchmark "
     "churn_plugin.methods:UnitGradientSum is the class churn_plugin.methods.UnitGradientSum, not a subclass of "
     "mtlflow.benchmarks.base.Benchmark"),
    ("--method", "unitsum", "mtlflow: error: unknown method 'unitsum'; valid methods: alignedmtl, "),
]


def test_a_bad_plugin_name_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    commands = [["train", *([] if flag == "--benchmark" else ["--benchmark", "toy"]), flag, name,
                 "--out", str(tmp_path / "run")] for flag, name, _ in BAD_NAMES]
    for (_, _, message), result in zip(BAD_NAMES, mtlflow_commands(*commands, path=str(PACKAGE)), strict=True):
        assert one_line_usage_error(result).startswith(message)
    assert not (tmp_path / "run").exists()


def test_a_plugin_named_like_a_built_in_is_refused_naming_both(installed: str, tmp_path: Path) -> None:
    clash = dist_info(tmp_path, "clash-plugin", "[mtlflow.methods]\nfairgrad = churn_plugin.methods:UnitGradientSum\n")
    for result in mtlflow_commands(["methods"], ["train", "--benchmark", "toy", "--method", "fairgrad", "--out",
                                                 str(tmp_path / "r")], path=f"{installed}:{clash}"):
        assert ("two methods are named 'fairgrad': the built-in mtlflow.methods.fairgrad:FairGrad of mtlflow and entry "
                "point fairgrad = churn_plugin.methods:UnitGradientSum of clash-plugin; rename the entry point or "
                "uninstall clash-plugin") in one_line_usage_error(result)


def test_a_broken_entry_point_is_one_line_with_the_import_error(tmp_path: Path) -> None:
    broken = dist_info(tmp_path, "broken-plugin", "[mtlflow.methods]\nbroken = no_such_module.methods:Method\n")
    result, = mtlflow_commands(["train", "--benchmark", "toy", "--method", "broken", "--out", str(tmp_path / "r")],
                               path=broken)
    assert one_line_usage_error(result) == (
        "mtlflow: error: cannot import entry point broken = no_such_module.methods:Method of broken-plugin "
        "(ModuleNotFoundError: No module named 'no_such_module'); reinstall broken-plugin or fix its entry point")
