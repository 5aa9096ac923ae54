"""`mtlflow reproduce`: one ci-scale claim end to end at a tiny size, its result file and its ledger row."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_reproduce_writes_the_result_file_and_the_ledger_row_matches_it(tmp_path, capsys):
    from mtlflow.cli import main
    from mtlflow.experiments import claims
    from mtlflow.metrics.intervals import format_estimate, mean_interval

    out = tmp_path / "claims"
    argv = ["reproduce", "cost-toy-escape", "--scale", "ci", "--set", "steps=300", "--seeds", "0,1,2",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "cost-toy-escape.json").read_text())
    assert record["scale"] == "ci" and record["seeds"] == [0, 1, 2] and record["config"]["steps"] == 300
    assert len(record["values"]) == 3 and all(0 <= v <= 5 for v in record["values"])
    assert record["estimate"] == pytest.approx(mean_interval(record["values"]).as_dict())
    assert record["command"] == "mtlflow " + " ".join(argv)
    assert record["verdict"] == claims.judge(claims.get("cost-toy-escape"), record["values"])["verdict"]
    assert {"date", "hardware", "seconds"} <= set(record) and record["hardware"]["device"] == "cpu"
    assert "cost-toy-escape (ci)" in capsys.readouterr().out

    # a second run does not overwrite the stored result
    assert main(argv) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err

    ledger = tmp_path / "claims.md"
    assert main(["reproduce", "--ledger", "--out", str(out), "--ledger-path", str(ledger)]) == 0
    text = ledger.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `cost-toy-escape` |"))
    assert f"{format_estimate(record['estimate'], digits=3)}, n = 3" in row
    assert record["verdict"] in row
    other = next(line for line in text.splitlines() if line.startswith("| `cost-cityscapes` |"))
    assert "not yet run here" in other and "mtlflow reproduce cost-cityscapes --scale ci" in other


def test_reproduce_bad_input_is_one_line(tmp_path, capsys):
    from mtlflow.cli import main

    assert main(["reproduce", "no-such-claim", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("mtlflow: error: unknown claim 'no-such-claim'")
    assert main(["reproduce", "cost-toy-escape", "--set", "stepz=3", "--out", str(tmp_path)]) == 2
    assert "--set stepz" in capsys.readouterr().err
    assert main(["reproduce", "--out", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
