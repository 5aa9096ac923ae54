"""The test-split-size warning (mtlflow.jobs.compare.caveats) with each metric's own sampling variance: the
standard error of the mean of the per-example errors for a mean error (MAE), Hanley-McNeil for a ROC-AUC (not the
binomial variance of a proportion), shown with one seed too, and read from evaluation files outside the run
directories (the DVC stage's runs/evaluation/, given to the aggregate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtlflow import jobs
from mtlflow.jobs.compare.caveats import hanley_mcneil_se
from mtlflow.metrics.classification import roc_auc
from mtlflow.metrics.evaluation import write_examples

N = 94
SPECS = {"vote": {"roc_auc": {"higher_is_better": True, "unit_interval": True},
                  "loss": {"higher_is_better": False, "unit_interval": False}},
         "income": {"mae": {"higher_is_better": False, "unit_interval": False},
                    "loss": {"higher_is_better": False, "unit_interval": False}}}
LABELS = (np.arange(N) % 3 == 0).astype(float)  # 32 positives, 62 negatives


def income_errors(method: str) -> np.ndarray:
    rng = np.random.default_rng(1 if method == "ls" else 2)
    errors = rng.gamma(2.0, 0.4, N)
    errors[:4] = np.nan  # unlabelled rows
    return errors


def write_run(root: Path, method: str, auc: float) -> dict:
    """One seed of a method with its per-example test evaluation in a separate folder (as the DVC stage keeps it)."""
    run_dir = root / method
    run_dir.mkdir(parents=True)
    income = income_errors(method)
    final = {"vote": {"roc_auc": auc, "loss": 0.6}, "income": {"mae": float(np.nanmean(income)), "loss": 0.5}}
    evaluation_file = root / "evaluation" / f"{method}.json"
    evaluation_file.parent.mkdir(exist_ok=True)
    bce = np.full(N, 0.6)
    write_examples(evaluation_file.with_name(f"{method}.per_example.npz"),
                   {"vote": {"error": bce, "loss": bce, "positives": LABELS, "negatives": 1 - LABELS},
                    "income": {"error": income, "loss": income}})
    evaluation_file.write_text(json.dumps({
        "run": str(run_dir), "split": "test", "data_hash": "h" * 64, "metrics": final,
        "per_example": {"file": f"{method}.per_example.npz", "examples": N,
                        "statistics": {"vote": "loss", "income": "mae"}}}))
    run = {"benchmark": "spec", "dataset": "survey", "data_hash": "h" * 64,
           "config": {"method": method, "seed": 0, "hparams": {}}}
    metrics = {"tasks": ["vote", "income"], "metric_specs": SPECS,
               "primary_metrics": {"vote": "roc_auc", "income": "mae"}, "hv_reference": {"vote": 1.0, "income": 5.0},
               "final": {"test": final}, "selection": {"rule": "best val"},
               "epochs": [{"epoch": 1, "step_seconds_median": 0.01, "peak_memory_bytes": 1, "splits": {"test": final}}]}
    return {"dir": str(run_dir), "run": run, "metrics": metrics, "evaluation": evaluation_file}


def test_hanley_mcneil_matches_the_spread_of_simulated_aucs():
    """Binormal scores (positives N(1, 1), negatives N(0, 1)): the standard deviation of the AUC over 4,000
    simulated test sets of 32 positives and 62 negatives against the formula at the true AUC, Φ(1/√2)."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(32), np.zeros(62)]
    aucs = [roc_auc(np.r_[rng.normal(1, 1, 32), rng.normal(0, 1, 62)], labels) for _ in range(4000)]
    assert hanley_mcneil_se(float(norm.cdf(1 / np.sqrt(2))), 32, 62) == pytest.approx(np.std(aucs), rel=0.08)


def test_one_seed_regression_and_auc_warnings_use_their_own_variance_from_the_given_evaluations(tmp_path):
    runs = [write_run(tmp_path, "ls", 0.75), write_run(tmp_path, "fairgrad", 0.77)]
    summary = jobs.summarise(runs, [], paper_references=False, evaluations=[r["evaluation"] for r in runs])
    auc_half = 1.96 * hanley_mcneil_se(0.76, 32, 62)
    assert ("1 seed, no seed interval: vote has 94 test examples, so its roc_auc alone varies by about "
            f"±{auc_half:.4f} (95 %, Hanley-McNeil, 32 positive and 62 negative) from the choice of test examples; "
            "differences smaller than that are not resolved") in summary.warnings
    # the binomial variance of a proportion at 0.76 would be another number
    assert f"±{1.96 * np.sqrt(0.76 * 0.24 / N):.4f}" != f"±{auc_half:.4f}"
    # each run's per-example absolute errors (the labelled ones): the mean over runs of their mean's standard error
    half = 1.96 * float(np.mean([np.std(income_errors(m)[4:], ddof=1) / np.sqrt(N - 4) for m in ("ls", "fairgrad")]))
    assert (f"1 seed, no seed interval: income has {N - 4} test examples, so its mae alone varies by about "
            f"±{half:.4f} (95 %, standard error of the mean of the per-example errors) from the choice of test "
            "examples; differences smaller than that are not resolved") in summary.warnings


def test_without_the_given_evaluations_there_is_nothing_to_size_the_split_with(tmp_path):
    runs = [write_run(tmp_path, "ls", 0.75), write_run(tmp_path, "fairgrad", 0.77)]
    summary = jobs.summarise(runs, [], paper_references=False)
    assert not any("alone varies" in w for w in summary.warnings)
