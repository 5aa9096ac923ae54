"""The retrain gate: the candidate and the model store's champion evaluated on the same test split.

The champion was usually trained, and its stored metrics measured, on an older data version; those
numbers are never compared with the candidate's. Both models are evaluated here, on the test split
of the candidate's (new) prepared data, keeping each example's error
(:func:`mtlflow.metrics.evaluation.evaluate_examples`), and :func:`mtlflow.metrics.paired.gate`
decides from the paired per-example differences. The decision record (both models' metrics on that
split, the intervals, ``n``, the rule) is what the model store, the Kubeflow UI and Prometheus get.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mtlflow.core.errors import DataError
from mtlflow.engine.rundir import check_run_consistent, load_model, read_run, run_label
from mtlflow.jobs.data import load_prepared

#: the split both models are compared on
SPLIT = "test"


def evaluate_on(model_file: str | Path, data_dir: str | Path, split: str = SPLIT) -> dict[str, Any]:
    """Evaluate the model of ``model_file`` on ``split`` of ``data_dir``, keeping per-example errors.

    Unlike :func:`mtlflow.jobs.evaluate`, the data need not be the version the model was trained on
    (a champion meets each new data version): it must be data of the model's benchmark holding the
    model's tasks. The tasks' losses and metrics are the data's benchmark's."""
    from mtlflow.metrics.evaluation import evaluate_examples, paired_statistic
    from mtlflow.engine.trainer import check_finite_evaluation

    _, model, blob = load_model(model_file)
    bench, data = load_prepared(data_dir)
    if blob["benchmark"] != bench.name:
        raise DataError(f"model {model_file} is a {blob['benchmark']} model but {data_dir} holds {bench.name} data; "
                        "compare models of one benchmark")
    missing = [t for t in blob["tasks"] if t not in bench.task_names]
    if missing:
        raise DataError(f"model {model_file} predicts task(s) {', '.join(missing)} that {data_dir} does not have "
                        f"({', '.join(bench.task_names)}); use a model store per task set")
    tasks = bench.select_tasks(blob["tasks"])
    index = [bench.task_names.index(t.name) for t in tasks]
    metrics, examples = evaluate_examples(model, bench, data.splits[split], tasks, index)
    check_finite_evaluation({split: metrics}, f"of {model_file} on {data_dir}")  # a diverged model: exit 4
    return {"benchmark": bench.name, "dataset": bench.label, "split": split, "data_hash": data.content_hash,
            "trained_on": blob["data_hash"], "method": blob["method"], "tasks": [t.name for t in tasks],
            "metric_specs": {t.name: t.metric_specs() for t in tasks}, "metrics": metrics,
            "statistics": {t.name: paired_statistic(t) for t in tasks},
            "errors": {t: values["error"] for t, values in examples.items()}}


def _summary(evaluated: Mapping[str, Any], primary: Mapping[str, str]) -> dict[str, Any]:
    """What the decision record keeps of one model's evaluation (no per-example arrays)."""
    from mtlflow.ops.model_store import score

    kept = ("method", "split", "data_hash", "trained_on", "metrics", "statistics")
    return {**{k: evaluated[k] for k in kept}, "primary_metrics": dict(primary),
            "error": score(evaluated["metrics"], primary, evaluated["metric_specs"]),
            "paired_error": {t: float(np.nanmean(errors)) for t, errors in evaluated["errors"].items()}}


def decide(run_dir: str | Path, data_dir: str | Path, model_store: str | Path,
           min_improvement: float = 0.0) -> dict[str, Any]:
    """The gate's decision record for the trained run ``run_dir`` against the champion of its dataset in
    ``model_store``, both evaluated on the test split of ``data_dir``; ``promote`` says whether the run
    should replace the champion (always, when there is none)."""
    from mtlflow.metrics.paired import gate
    from mtlflow.ops import model_store as store

    run_dir = Path(run_dir)
    check_run_consistent(run_dir)
    run = read_run(run_dir)
    primary = run["metrics"]["primary_metrics"]
    cand = evaluate_on(run_dir / "model.pt", data_dir)
    record: dict[str, Any] = {
        "benchmark": cand["dataset"], "split": SPLIT, "data_hash": cand["data_hash"], "tasks": sorted(cand["tasks"]),
        "metric_specs": cand["metric_specs"], "decided_unix": round(time.time(), 3),
        "candidate": {"run": str(run_dir), "label": run_label(run["run"]), **_summary(cand, primary)}}
    champion = store.read_champion(model_store, cand["dataset"])
    if champion is None:
        return {**record, "promote": True, "champion": None, "gate": None,
                "reason": f"no champion for {cand['dataset']} yet"}
    if sorted(champion["tasks"]) != record["tasks"]:
        raise DataError(f"the champion of {cand['dataset']} solves tasks {champion['tasks']} but the candidate "
                        f"{record['tasks']}; use another model store for a different task set")
    # the version directory under this store root (the recorded absolute path may be another mount's)
    version_dir = store.benchmark_dir(model_store, cand["dataset"]) / "versions" / champion["version"]
    held = evaluate_on(version_dir / "model.pt", data_dir)
    decision = gate({t: cand["errors"][t] for t in record["tasks"]}, {t: held["errors"][t] for t in record["tasks"]},
                    min_improvement, statistics=cand["statistics"])
    return {**record, "promote": decision.promote, "reason": decision.reason, "gate": decision.as_dict(),
            "champion": {"version": champion["version"], "label": champion["label"],
                         "stored_error": champion["error"], "stored_data_hash": champion["data_hash"],
                         **_summary(held, champion["primary_metrics"])}}
