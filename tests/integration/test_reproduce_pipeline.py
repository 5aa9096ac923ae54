"""`mtlflow reproduce CLAIM --pipeline --local`: the claim's seeds as tasks of the `reproduce` pipeline under
kfp.local (real subprocesses, real artifacts, the exit handler's status record) write the result file that
`mtlflow reproduce CLAIM` writes, value for value."""

from __future__ import annotations

import builtins
import json

import pytest

from mtlflow.cli import main
from mtlflow.experiments import claims

ORIGINAL_PRINT = builtins.print
#: ASMG's synthetic table (the cheapest multi-seed claim) at its ci scale's 3 seeds, shrunk to seconds per seed
SETTINGS = ["--set", "dim=5", "--set", "sample_sizes=[10]", "--set", "iterations=200"]
#: what differs between two runs of the same claim: when, how fast and where they ran, and the command line
TIMING = {"date", "seconds", "cpu_seconds", "load_average", "hardware", "command"}


def test_the_pipeline_writes_the_result_file_of_the_cli_value_for_value(tmp_path, capsys):
    argv = ["reproduce", "asmg-synthetic", "--scale", "ci", *SETTINGS, "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    assert main([*argv, "--out", str(tmp_path / "pipeline"), "--pipeline", "--local",
                 "--workdir", str(tmp_path / "work")]) == 0
    assert builtins.print is ORIGINAL_PRINT  # kfp.local's per-task print swaps are undone
    assert "as a pipeline" in capsys.readouterr().out
    cli = json.loads((tmp_path / "cli" / "asmg-synthetic.json").read_text())
    pipeline = json.loads((tmp_path / "pipeline" / "asmg-synthetic.json").read_text())
    assert list(pipeline) == list(cli)
    for key in set(cli) - TIMING - {"details"}:
        assert pipeline[key] == cli[key], key
    assert pipeline["seeds"] == [0, 1, 2] and len(set(pipeline["values"])) > 1  # seed order matters here
    for mine, theirs in zip(pipeline["details"]["cells"], cli["details"]["cells"], strict=True):
        assert {k: v for k, v in mine.items() if k != "seconds"} == {k: v for k, v in theirs.items()
                                                                     if k != "seconds"}
    assert pipeline["command"].endswith("--pipeline --local --workdir " + str(tmp_path / "work"))
    # the exit handler recorded the run, and the combination's artifact is the file
    (status,) = (tmp_path / "work" / "storage" / "checkpoints" / "status").glob("mtlflow-reproduce-*.json")
    assert json.loads(status.read_text())["state"] == "SUCCEEDED"
    assert json.loads((tmp_path / "work" / "result.json").read_text()) == pipeline

    # an existing result is kept, as by `mtlflow reproduce`
    assert main([*argv, "--out", str(tmp_path / "pipeline"), "--pipeline", "--local",
                 "--workdir", str(tmp_path / "work")]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert claims.judge(claims.get("asmg-synthetic"), pipeline["values"])["verdict"] == pipeline["verdict"]


def test_an_unknown_claim_or_a_pipeline_ledger_is_one_line_and_runs_nothing(tmp_path, capsys):
    assert main(["reproduce", "no-such-claim", "--pipeline", "--local", "--workdir", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err.startswith("mtlflow: error: unknown claim 'no-such-claim'")
    assert main(["reproduce", "--ledger", "--pipeline", "--out", str(tmp_path / "o")]) == 2
    assert "--ledger and --list take no pipeline" in capsys.readouterr().err
    assert main(["reproduce", "asmg-synthetic", "--local", "--out", str(tmp_path / "o")]) == 2
    assert "--local belongs to --pipeline" in capsys.readouterr().err
    assert main(["reproduce", "asmg-synthetic", "--profile", "p.yaml", "--out", str(tmp_path / "o")]) == 2
    assert "--profile belongs to --pipeline" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.fixture(autouse=True)
def _restore_print():
    yield
    builtins.print = ORIGINAL_PRINT
