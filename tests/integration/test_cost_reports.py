"""The COST reports: `mtlflow ablate cost` (Tables 4, 7, 8), the toy comparison (Fig. 6) and the
per-epoch overhead in `mtlflow bench`, each on tiny settings."""

from __future__ import annotations

import csv
import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ablate_cost_writes_the_three_tables_with_delta_m_and_telemetry(multimnist_small, tmp_path, capsys):
    from mtlflow.cli import main

    out = tmp_path / "ablation"
    code = main(["ablate", "cost", "--data", str(multimnist_small), "--method", "mgda", "--epochs", "1",
                 "--batch-size", "64", "--max-steps-per-epoch", "1", "--trigger", "always",
                 "--teleport-option", "steps=1", "--teleport-option", "perturbations=1", "--no-progress",
                 "--out", str(out)])
    assert code == 0
    table = json.loads((out / "ablation.json").read_text())
    rows = {r["key"]: r for r in table["rows"]}
    assert set(rows) == {"base", "full", "no-lt", "no-lg", "no-htr", "trigger-dominated", "trigger-weak",
                         "trigger-many-task", "adapter-lora", "adapter-loha"}
    # identical configurations are trained once: the full row is also the LoRA row
    assert rows["adapter-lora"]["run_key"] == "full" and rows["full"]["run_key"] == "full"
    assert rows["base"]["teleports_per_run"] == 0 and rows["full"]["teleports_per_run"] == 1
    assert rows["full"]["conflicting_before"] is not None and rows["full"]["grad_norm_after"] is not None
    assert all(isinstance(r["delta_m"], float) for r in rows.values())
    md = (out / "ablation.md").read_text()
    for title in ("Table 4", "Table 7", "Table 8", "w/o L_t", "w/o HTR", "many-task trigger", "LoHa", "Δm%"):
        assert title in md
    assert len(list(csv.reader((out / "ablation.csv").open()))) == 1 + len(rows)
    assert "Table 4" in capsys.readouterr().out
    # finished runs are reused: a second call trains nothing and gives the same table
    assert main(["ablate", "cost", "--data", str(multimnist_small), "--method", "mgda", "--epochs", "1",
                 "--batch-size", "64", "--max-steps-per-epoch", "1", "--trigger", "always",
                 "--teleport-option", "steps=1", "--teleport-option", "perturbations=1", "--no-progress",
                 "--out", str(out)]) == 0
    assert json.loads((out / "ablation.json").read_text())["rows"] == table["rows"]


def test_ablate_rejects_bad_input_before_preparing_data(tmp_path, capsys):
    from mtlflow.cli import main

    for args, match in [(["--trigger", "sometimes"], "--trigger must be one of"),
                        (["--teleport-option", "rank=0"], "rank must be"), (["--method", "nope"], "unknown method")]:
        assert main(["ablate", "cost", "--benchmark", "multimnist", "--out", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "runs").exists()


def test_toy_ls_with_cost_runs_beside_ls_and_records_its_teleports(tmp_path):
    from mtlflow.experiments.trajectories import run_toy

    summary = run_toy(["ls"], tmp_path, steps=1050, progress=False, teleport="cost",
                      teleport_options={"steps": 10})
    names = [m["method"] for m in summary["methods"]]
    assert names == ["ls", "ls+cost"]
    teleports = summary["teleports"]["ls+cost"]
    assert teleports and all(t["adapter_steps"] == 10 for t in teleports)
    # the delayed start and the cap: at most one teleport per start and 1000-step "epoch"
    per = {}
    for t in teleports:
        key = (t["start"], t["step"] // 1000)
        per[key] = per.get(key, 0) + 1
    assert max(per.values()) == 1
    assert (tmp_path / "cost-ls.png").stat().st_size > 10_000 and "ls+cost" in (tmp_path / "toy.md").read_text()
    cost_row = summary["methods"][1]
    assert len(cost_row["trajectory"][0]) == 5 and cost_row["note"] == f"{len(teleports)} teleports"


def test_bench_reports_cost_overhead_per_epoch(tmp_path):
    from mtlflow.experiments.bench import run_bench

    summary = run_bench(tmp_path, ["mgda"], [3], steps=1, warmup=0, batch_size=8, width=4, image_size=16,
                        engine_rows=[], progress=False, teleport="cost",
                        teleport_options={"steps": 1, "perturbations": 1}, cost_epoch_steps=3, cost_epochs=1)
    (row,) = summary["cost_overhead"]
    assert row["method"] == "mgda" and row["tasks"] == 3 and row["teleports_per_epoch"] == 1
    assert row["cost_epoch_seconds"] > 0 and row["base_epoch_seconds"] > 0
    assert row["overhead"] == pytest.approx(row["cost_epoch_seconds"] / row["base_epoch_seconds"] - 1)
    assert any(t["target"].startswith("COST overhead") for t in summary["targets"])
    assert "COST overhead per epoch" in (tmp_path / "bench.md").read_text()
    assert json.loads((tmp_path / "bench.json").read_text())["cost_overhead"][0]["epoch_steps"] == 3
