"""A retrain gate decision reaches a real Pushgateway (mtlflow_retrain_*) and the Kubeflow UI's flat
metrics with the numbers of the decision record."""

from __future__ import annotations

import numpy as np
import pytest

from mtlflow.jobs.pipeline_steps import decision_metrics
from mtlflow.metrics.paired import gate
from mtlflow.ops.observability import export_decision
from prometheus_support import parse_samples, sample


@pytest.fixture()
def decision():
    rng = np.random.default_rng(0)
    champion = {"left": (rng.random(200) < 0.4).astype(float), "right": (rng.random(200) < 0.5).astype(float)}
    candidate = {"left": champion["left"] * (rng.random(200) < 0.5), "right": champion["right"].copy()}
    ruled = gate(candidate, champion, min_improvement=0.01).as_dict()
    model = {"primary_metrics": {"left": "acc", "right": "acc"}}
    return {"benchmark": "multimnist", "promote": ruled["promote"], "reason": ruled["reason"], "gate": ruled,
            "decided_unix": 1234.5, "data_hash": "abc", "split": "test",
            "candidate": {**model, "error": 0.3, "metrics": {"left": {"acc": 0.8}, "right": {"acc": 0.6}}},
            "champion": {**model, "version": "v1", "error": 0.45, "metrics": {"left": {"acc": 0.6}, "right": {"acc": 0.5}}}}


def test_the_decision_is_pushed_with_its_intervals(pushgateway, decision):
    assert export_decision(decision, pushgateway.url, pipeline="retrain", run="retrain-run-7")
    samples = parse_samples(pushgateway.metrics_text())
    group = {"job": "mtlflow_retrain_gate", "pipeline": "retrain", "benchmark": "multimnist", "run": "retrain-run-7"}
    assert decision["promote"] and sample(samples, "mtlflow_retrain_promoted", **group) == 1
    assert sample(samples, "mtlflow_retrain_model_error", model="champion", **group) == 0.45
    assert sample(samples, "mtlflow_retrain_test_examples", **group) == 200
    for task, diff in (("all", decision["gate"]["combined"]), *decision["gate"]["tasks"].items()):
        for bound, key in (("estimate", "mean_difference"), ("low", "low"), ("high", "high")):
            assert sample(samples, "mtlflow_retrain_error_difference", task=task, bound=bound, **group) == \
                pytest.approx(diff[key])
    assert sample(samples, "mtlflow_retrain_decision_timestamp_seconds", **group) == 1234.5


def test_the_ui_metrics_carry_both_models_and_the_intervals(decision):
    flat = decision_metrics(decision)
    combined = decision["gate"]["combined"]
    assert flat["promoted"] == 1.0 and flat["n"] == 200.0
    assert flat["candidate.left.acc"] == 0.8 and flat["champion.right.acc"] == 0.5 and flat["champion.error"] == 0.45
    assert (flat["difference.all.low"], flat["difference.all.estimate"], flat["difference.all.high"]) == \
        (combined["low"], combined["mean_difference"], combined["high"])
    assert flat["difference.right.estimate"] == 0.0  # the candidate kept the champion's right-task errors
    no_champion = decision_metrics({**decision, "champion": None, "gate": None})
    assert set(no_champion) == {"promoted", "candidate.error", "candidate.left.acc", "candidate.right.acc"}
