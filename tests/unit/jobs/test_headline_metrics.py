"""The headline statistics mean what they say (mtlflow.jobs.compare.headline): Δm% and the mean rank over each
task's primary metric by default (a spec's ``comparison: {delta_m_metrics: all}`` for every metric), no
ill-conditioned metric as a denominator (the user's case: a reference R² of -0.031 made 95 % of a Δm% of -10),
and a verdict box that leads with "no method is distinguishable" when that is what the intervals say."""

from __future__ import annotations

import numpy as np
import pytest

from mtlflow import jobs
from mtlflow.benchmarks._spec.schema import parse_spec
from mtlflow.jobs import report
from mtlflow.jobs.compare.headline import delta_m_metrics
from mtlflow.metrics.scoring import delta_m

BOUNDED = {"higher_is_better": True, "unit_interval": True}
ERROR = {"higher_is_better": False, "unit_interval": False}
SPECS = {"cls": {"acc": BOUNDED, "f1": BOUNDED, "loss": ERROR},
         "reg": {"mae": ERROR, "rmse": ERROR, "r2": {"higher_is_better": True, "unit_interval": False},
                 "loss": ERROR}}
#: the 6,366-row table's shape: a regression nobody learned (R² near 0, below it for the references)
REFS = {"cls": [{"acc": 0.85, "f1": 0.60}, {"acc": 0.87, "f1": 0.62}, {"acc": 0.86, "f1": 0.61}],
        "reg": [{"mae": 0.70, "rmse": 1.00, "r2": -0.020}, {"mae": 0.71, "rmse": 1.01, "r2": -0.031},
                {"mae": 0.72, "rmse": 1.02, "r2": -0.042}]}
RUNS = {"ls": [(0.84, 0.60, 0.92, 1.03, 0.010), (0.86, 0.61, 0.93, 1.04, 0.000), (0.85, 0.59, 0.94, 1.05, 0.020)],
        "fairgrad": [(0.85, 0.62, 0.90, 1.02, 0.050), (0.84, 0.60, 0.95, 1.03, 0.040),
                     (0.86, 0.61, 0.92, 1.04, 0.060)]}  # within ls's seed spread on acc and mae


def spec_config(rule: str | None) -> dict:
    spec = {"name": "survey", "source": {"table": "t.csv"},
            "tasks": [{"name": "cls", "type": "binary"}, {"name": "reg", "type": "regression"}]}
    if rule is not None:
        spec["comparison"] = {"delta_m_metrics": rule}
    return {"spec": parse_spec(spec).model_dump(mode="json")}


def fake_run(method: str, seed: int, final: dict, tasks=("cls", "reg"), rule: str | None = None) -> dict:
    final = {t: {**final[t], "loss": 0.5} for t in tasks}
    run = {"benchmark": "spec", "benchmark_config": spec_config(rule), "dataset": "survey", "data_hash": "h" * 64,
           "config": {"method": method, "seed": seed, "hparams": {}}}
    metrics = {"tasks": list(tasks), "metric_specs": {t: SPECS[t] for t in tasks},
               "primary_metrics": {"cls": "acc", "reg": "mae"}, "hv_reference": {"cls": 1.0, "reg": 2.0},
               "final": {"test": final}, "selection": {"rule": "best val"},
               "epochs": [{"epoch": 1, "step_seconds_median": 0.01, "peak_memory_bytes": 1,
                           "splits": {"test": final}}]}
    return {"dir": f"/runs/{method}-{'-'.join(tasks)}-{seed}", "run": run, "metrics": metrics}


def method_final(values: tuple) -> dict:
    acc, f1, mae, rmse, r2 = values
    return {"cls": {"acc": acc, "f1": f1}, "reg": {"mae": mae, "rmse": rmse, "r2": r2}}


def sweep(rule: str | None = None, runs: dict = RUNS):
    method_runs = [fake_run(m, s, method_final(v), rule=rule) for m, values in runs.items() for s, v in enumerate(values)]
    refs = [fake_run("ls", s, {t: values}, tasks=(t,), rule=rule) for t, seeds in REFS.items()
            for s, values in enumerate(seeds)]
    return jobs.summarise(method_runs, refs, paper_references=False)


def reference_means() -> dict:
    return {t: {m: float(np.mean([s[m] for s in seeds])) for m in seeds[0]} for t, seeds in REFS.items()}


def hand_delta_m(values: tuple, metrics: dict) -> float:
    """Δm% (Maninis et al. 2019) by hand: the mean of the signed relative changes of the listed metrics."""
    refs, final = reference_means(), method_final(values)
    terms = [(-1 if SPECS[t][m]["higher_is_better"] else 1) * (final[t][m] - refs[t][m]) / abs(refs[t][m])
             for t, names in metrics.items() for m in names]
    return 100 * float(np.mean(terms))


def test_by_default_delta_m_and_the_mean_rank_average_each_task_s_primary_metric_only():
    summary = sweep()
    for method, values in RUNS.items():
        per_seed = [hand_delta_m(v, {"cls": ["acc"], "reg": ["mae"]}) for v in values]
        assert summary.methods[method].delta_m.per_seed == pytest.approx(per_seed, abs=1e-12)
    assert summary.headline.rule == "primary"
    assert summary.headline.delta_m_metrics == {"cls": ("acc",), "reg": ("mae",)}
    assert summary.headline.mean_rank_metrics == {"cls": ("acc",), "reg": ("mae",)}
    # mean rank over acc and mae alone: fairgrad ties ls on acc (0.85 each) and wins on mae
    assert summary.methods["fairgrad"].mean_rank.mean == pytest.approx((1.5 + 1) / 2)
    assert summary.methods["ls"].mean_rank.mean == pytest.approx((1.5 + 2) / 2)
    # the secondary metrics are still in the table
    assert summary.methods["ls"].intervals["reg"]["r2"].mean == pytest.approx(0.01)


def test_a_near_zero_reference_r2_does_not_move_the_headline():
    """The user's case: with R² averaged in (the old rule), its relative change against -0.031 is almost all of
    Δm%; now Δm% is the hand computation over the other metrics, whatever the R² values."""
    summary = sweep(rule="all")
    kept = {"cls": ["acc", "f1"], "reg": ["mae", "rmse"]}
    refs = reference_means()
    for method, values in RUNS.items():
        per_seed = [hand_delta_m(v, kept) for v in values]
        assert summary.methods[method].delta_m.per_seed == pytest.approx(per_seed, abs=1e-12)
        # what the old rule gave: every metric, R² included, hijacked by the relative change of R²
        hijacked = [delta_m(method_final(v), refs, SPECS, {"cls": ["acc", "f1"], "reg": ["mae", "rmse", "r2"]})
                    for v in values]
        assert max(abs(h - p) for h, p in zip(hijacked, per_seed, strict=True)) > 10
    assert summary.headline.delta_m_metrics == {"cls": ("acc", "f1"), "reg": ("mae", "rmse")}
    assert "reg: r2 left out of Δm% (own single-task references): a relative change of r2 is ill-conditioned; " \
           "rmse, already averaged, carries its information" in summary.warnings
    # the R² values move nothing
    moved = {m: [(*v[:4], v[4] + 0.3) for v in values] for m, values in RUNS.items()}
    assert sweep(rule="all", runs=moved).methods["fairgrad"].delta_m.per_seed == \
        summary.methods["fairgrad"].delta_m.per_seed


def test_an_r2_is_replaced_by_the_task_s_error_or_left_out_with_the_reason():
    refs = {"reg": {"mae": 0.7, "rmse": 1.0, "r2": -0.03}}
    specs = {"reg": SPECS["reg"]}
    chosen = delta_m_metrics({"reg": ["r2"]}, refs, None, specs, "own single-task references")
    assert chosen.metrics == {"reg": ["rmse"]}
    assert chosen.notes == ("reg: rmse stands in for r2 in Δm% (own single-task references): a relative change of "
                            "r2 is ill-conditioned (values near 0 are ordinary)",)
    alone = delta_m_metrics({"reg": ["r2"]}, {"reg": {"r2": 0.4}}, None, specs, "own single-task references")
    assert alone.metrics == {"reg": []}
    assert "the task records no rmse or mae to use instead" in alone.notes[0]


def test_a_reference_within_noise_of_zero_is_never_a_denominator():
    specs = {"cls": SPECS["cls"]}
    # F1 over the reference seeds 0.00, 0.04, 0.02: mean 0.02, standard deviation 0.02 -> |mean| <= 2 sd
    spread = float(np.std([0.0, 0.04, 0.02], ddof=1))
    chosen = delta_m_metrics({"cls": ["acc", "f1"]}, {"cls": {"acc": 0.86, "f1": 0.02}},
                             {"cls": {"acc": 0.01, "f1": spread}}, specs, "own single-task references")
    assert chosen.metrics == {"cls": ["acc"]}
    assert chosen.notes[0].startswith("cls: f1 left out of Δm% (own single-task references): its single-task "
                                      "reference 0.02 is within 2 x its seed standard deviation (0.02) of 0")
    # one reference seed (no spread): a bounded score below 0.01 is too close to 0
    floor = delta_m_metrics({"cls": ["f1"]}, {"cls": {"f1": 0.005}}, {"cls": {"f1": 0.0}}, specs, "refs")
    assert floor.metrics == {"cls": []} and "below 0.01" in floor.notes[0]
    # a clearly non-zero reference stays
    assert delta_m_metrics({"cls": ["f1"]}, {"cls": {"f1": 0.6}}, {"cls": {"f1": 0.01}}, specs,
                           "refs").metrics == {"cls": ["f1"]}


def test_no_method_distinguishable_leads_the_verdict_box():
    box = report.verdict_box(sweep())
    assert box["headline"].startswith("No method is distinguishable from ls at 95 % (Δm%, over 3 seed(s)). "
                                      "fairgrad has the lowest Δm%: ")
    assert box["headline"].endswith("not shown better than any other method.")
    markdown = report.headline_markdown(sweep())
    assert markdown.startswith("**No method is distinguishable from ls at 95 %")


def test_a_method_worse_than_the_best_with_confidence_keeps_the_winner_headline():
    far = {"ls": RUNS["ls"], "strong": [(0.97, 0.8, 0.40, 0.6, 0.5), (0.98, 0.81, 0.41, 0.61, 0.5),
                                        (0.96, 0.79, 0.42, 0.62, 0.5)]}
    box = report.verdict_box(sweep(runs=far))
    assert box["headline"].startswith("strong has the lowest Δm%: ") and box["confident"]


def test_one_seed_says_no_method_can_be_told_apart():
    one = {m: values[:1] for m, values in RUNS.items()}
    box = report.verdict_box(sweep(runs=one))
    assert box["headline"].startswith("No method can be told apart from another: 1 seed gives no interval. ")


def test_the_spec_option_is_read_from_the_runs_records_and_checked():
    from mtlflow import benchmarks
    from mtlflow.benchmarks._spec.schema import SpecError

    spec = benchmarks.get("spec")
    assert spec.headline_metrics(spec_config("all")) == "all"
    assert spec.headline_metrics(spec_config(None)) == "primary"
    with pytest.raises(SpecError, match=r"comparison.delta_m_metrics: 'everything' is not valid: input should be "
                                        r"'primary' or 'all'"):
        spec_config("everything")
