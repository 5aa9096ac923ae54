"""The sweep's baselines in the comparison (mtlflow.jobs.compare.baselines) on hand-built runs and baseline
directories whose answer is known: a method whose every test error equals the trivial baseline's "learned
nothing" (paired difference exactly 0), a classical model with no error beats every method, and baselines stay
out of Δm%, mean rank and the Pareto sets while appearing, marked, in the report's tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtlflow import jobs
from mtlflow.core.errors import DataError
from mtlflow.jobs import report
from mtlflow.jobs.compare.summary import Summary, from_json, to_json
from mtlflow.metrics.evaluation import write_examples

N = 120
HASH = "b" * 64
SPECS = {"cls": {"acc": {"higher_is_better": True, "unit_interval": True}},
         "reg": {"mae": {"higher_is_better": False, "unit_interval": False}}}
STATISTICS = {"cls": "acc_error", "reg": "mae"}


def trivial_errors() -> dict[str, np.ndarray]:
    """The majority class is wrong on the first 48 examples; the median is off by 1 to 2 everywhere."""
    cls = np.zeros(N)
    cls[:48] = 1
    return {"cls": cls, "reg": 1 + np.linspace(0, 1, N)}


def method_errors(method: str, seed: int) -> dict[str, np.ndarray]:
    """``idle`` makes the trivial baseline's errors on ``cls`` exactly; ``strong`` is wrong on 6 examples.
    Both beat the median on ``reg`` by about a half."""
    errors = trivial_errors()
    if method == "strong":
        errors["cls"] = np.zeros(N)
        errors["cls"][seed:seed + 6] = 1
    errors["reg"] = errors["reg"] * 0.5 + 0.01 * seed
    return errors


def write(root: Path, name: str, run: dict, errors: dict[str, np.ndarray]) -> dict:
    """A run-like directory (run.json, metrics.json, test_evaluation.json and its per-example values) as
    read_run returns it."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    final = {"cls": {"acc": 1 - float(errors["cls"].mean())}, "reg": {"mae": float(errors["reg"].mean())}}
    write_examples(run_dir / "test_evaluation.per_example.npz", {t: {"error": e, "loss": e} for t, e in errors.items()})
    (run_dir / jobs.split_evaluation_name("test")).write_text(json.dumps({
        "run": str(run_dir), "split": "test", "data_hash": HASH, "metrics": final,
        "per_example": {"file": "test_evaluation.per_example.npz", "examples": N, "statistics": STATISTICS}}))
    metrics = {"tasks": ["cls", "reg"], "metric_specs": SPECS, "primary_metrics": {"cls": "acc", "reg": "mae"},
               "hv_reference": {"cls": 1.0, "reg": 4.0}, "final": {"test": final}, "selection": {"rule": "best val"}}
    if run.get("kind") != "baseline":
        metrics["epochs"] = [{"epoch": 1, "step_seconds_median": 0.01, "peak_memory_bytes": 1}]
    record = {"status": "completed", "benchmark": "spec", "dataset": "fake", "data_hash": HASH, **run}
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return {"dir": str(run_dir), "run": record, "metrics": metrics}


def baseline(root: Path, kind: str, errors: dict[str, np.ndarray]) -> dict:
    return write(root, f"baseline-{kind}", {"kind": "baseline", "config": {"method": f"baseline-{kind}", "seed": 0,
                                                                            "hparams": {}},
                                            "baseline": {"kind": kind, "tasks": {"cls": {}, "reg": {}}}}, errors)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    runs = [write(root, f"{m}-s{s}", {"config": {"method": m, "seed": s, "hparams": {}}}, method_errors(m, s))
            for m in ("idle", "strong") for s in range(3)]
    perfect = {"cls": np.zeros(N), "reg": np.full(N, 0.05)}
    baselines = [baseline(root, "trivial", trivial_errors()), baseline(root, "hgb", perfect)]
    return runs, baselines, jobs.summarise(runs, [], paper_references=False, baselines=baselines)


def test_a_method_equal_to_the_trivial_baseline_learned_nothing(sweep):
    _, _, summary = sweep
    trivial = summary.baselines["baseline-trivial"]
    assert trivial.mean["cls"]["acc"] == pytest.approx(1 - 48 / N)
    idle = trivial.versus["idle"].tasks["cls"]
    assert (idle.mean_difference, idle.low, idle.high) == (0.0, 0.0, 0.0)  # the same errors on every example
    assert trivial.versus["strong"].tasks["cls"].verdict == "better"
    assert trivial.versus["idle"].tasks["reg"].verdict == "better"
    nothing = [w for w in summary.warnings if w.startswith("learned nothing")]
    assert len(nothing) == 1 and nothing[0].startswith("learned nothing: idle is not better than the trivial "
                                                       "baseline (acc 0.6000) on cls with 95 % confidence")


def test_a_classical_model_that_beats_every_method_is_said(sweep):
    _, _, summary = sweep
    hgb = summary.baselines["baseline-hgb"]
    assert all(hgb.versus[m].tasks[t].verdict == "worse" for m in ("idle", "strong") for t in ("cls", "reg"))
    classical = [w for w in summary.warnings if w.startswith("a classical per-task model")]
    assert [w.split(" beats every multi-task method on ")[1].split(" ")[0] for w in classical] == ["cls", "reg"]
    assert "(hgb acc 1.0000)" in classical[0] and "best method strong: acc" in classical[0]


def test_baselines_are_yardsticks_not_ranked_and_round_trip(sweep, tmp_path):
    runs, baselines, summary = sweep
    alone = jobs.summarise(runs, [], paper_references=False)
    assert set(summary.methods) == {"idle", "strong"} and summary.methods == alone.methods
    assert summary.pareto_set == alone.pareto_set and summary.mean_rank_method_set == alone.mean_rank_method_set
    # given among the runs, a baseline is recognised by its kind
    mixed = jobs.summarise([*runs, *baselines], [], paper_references=False)
    assert to_json(mixed) == to_json(summary)
    assert from_json(Summary, json.loads(json.dumps(to_json(summary)))) == summary
    text = report.markdown_summary(summary)
    assert "| baseline-trivial | baseline (fitted once) | 0.6000 |" in text
    assert "## Against the baselines" in text and "| idle | baseline-trivial | cls acc | 0.6000 |" in text


def test_a_baseline_of_other_data_is_refused(sweep, tmp_path):
    runs, baselines, _ = sweep
    foreign = {**baselines[0], "run": {**baselines[0]["run"], "data_hash": "c" * 64}}
    with pytest.raises(DataError, match="another data version"):
        jobs.summarise(runs, [], paper_references=False, baselines=[foreign])
