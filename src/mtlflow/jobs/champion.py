"""The retrain gate: the candidate and the model store's champion evaluated on the same test split.

The champion was usually trained, and its stored metrics measured, on an older data version; those
numbers are never compared with the candidate's. Both models are evaluated here, on the test split
of the candidate's (new) prepared data, keeping each example's error
(:func:`mtlflow.metrics.evaluation.evaluate_examples`), and :func:`mtlflow.metrics.paired.gate`
decides from the paired per-example differences. The decision record (both models' metrics on that
split, the intervals, ``n``, the rule) is what the model store, the Kubeflow UI and Prometheus get.

**Overlap.** A champion that trained on rows of the new test split would be compared on examples it has
seen. Each prepared dataset keeps its rows' content digests (:mod:`mtlflow.benchmarks.row_hashes`), and
the model store keeps, with each champion, the digests of the rows it was trained and selected on (train
and val: ``seen_rows.npy``). The gate finds the new test rows among them and applies :data:`OVERLAP_RULE`:
those rows are left out of the comparison (both models, so the pairs stay paired), the count is recorded
and printed, and the gate refuses when more than :data:`MAX_OVERLAP_SHARE` of the split would be left out.
When either side has no digests (data prepared, or a champion stored, before they were kept) the record
says the overlap is unknown.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.benchmarks import row_hashes
from mtlflow.core.errors import DataError
from mtlflow.engine.rundir import check_run_consistent, load_model, read_run, run_label
from mtlflow.engine.trainer import check_finite_evaluation
from mtlflow.jobs.data import load_prepared
from mtlflow.metrics.evaluation import evaluate_examples, paired_statistic
from mtlflow.metrics.paired import gate
from mtlflow.ops import model_store as store
from mtlflow.ops.model_store import score

#: the split both models are compared on
SPLIT = "test"
#: the champion's rows the overlap check compares with the new test rows (trained on, and selected on)
SEEN_SPLITS = ("train", "val")
#: above this share of the test split seen by the champion, the gate refuses instead of leaving the rows out
MAX_OVERLAP_SHARE = 0.5
OVERLAP_RULE = ("test rows whose content digest is among the rows the champion trained or was selected on are left "
                f"out of the comparison for both models; the gate refuses when they exceed {MAX_OVERLAP_SHARE:.0%} "
                "of the test split")


def evaluate_on(model_file: str | Path, data_dir: str | Path, split: str = SPLIT) -> dict[str, Any]:
    """Evaluate the model of ``model_file`` on ``split`` of ``data_dir``, keeping per-example errors.

    Unlike :func:`mtlflow.jobs.evaluate`, the data need not be the version the model was trained on
    (a champion meets each new data version): it must be data of the model's benchmark holding the
    model's tasks. The tasks' losses and metrics are the data's benchmark's."""
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
    kept = ("method", "split", "data_hash", "trained_on", "metrics", "statistics")
    return {**{k: evaluated[k] for k in kept}, "primary_metrics": dict(primary),
            "error": score(evaluated["metrics"], primary, evaluated["metric_specs"]),
            "paired_error": {t: float(np.nanmean(errors)) for t, errors in evaluated["errors"].items()}}


def seen_rows(data_dir: str | Path) -> np.ndarray | None:
    """The content digests of the rows a model trained on ``data_dir`` has seen (train and val), None when the
    data has no digests."""
    digests = row_hashes.read(data_dir)
    return None if digests is None else np.concatenate([digests[s] for s in SEEN_SPLITS])


def check_overlap(version_dir: Path, data_dir: str | Path, n: int) -> tuple[dict[str, Any], np.ndarray]:
    """The overlap record and the mask of test rows kept for the comparison (:data:`OVERLAP_RULE`)."""
    digests = row_hashes.read(data_dir)
    seen_file = version_dir / store.SEEN_ROWS
    keep = np.ones(n, dtype=bool)
    if digests is None or not seen_file.is_file():
        missing = f"{data_dir} has no row digests" if digests is None else f"{seen_file} is missing"
        return {"checked": False, "rule": OVERLAP_RULE, "note": f"overlap unknown: {missing} (prepared or stored "
                "before rows were digested)"}, keep
    if len(digests[SPLIT]) != n:
        raise DataError(f"{data_dir / row_hashes.ROW_HASHES} lists {len(digests[SPLIT])} test rows but the test split "
                        f"has {n}; prepare {data_dir} again")
    try:
        seen = np.load(seen_file)
    except (OSError, ValueError) as exc:
        raise DataError(f"{seen_file} is unreadable ({exc}); restore it from the model store's backup or roll the "
                        "champion back") from None
    overlapping = row_hashes.overlap(seen, digests[SPLIT])
    share = float(overlapping.mean()) if n else 0.0
    record = {"checked": True, "rule": OVERLAP_RULE, "rows": int(overlapping.sum()), "of": int(n), "share": share}
    if share > MAX_OVERLAP_SHARE:
        raise DataError(f"{record['rows']} of {n} test rows of {data_dir} ({share:.0%}) are rows the champion trained "
                        "or was selected on; prepare the new data version with the champion's split settings "
                        "(split.seed, shares, key) so that old rows keep their splits")
    return record, ~overlapping


def decide(run_dir: str | Path, data_dir: str | Path, model_store: str | Path,
           min_improvement: float = 0.0, margins: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The gate's decision record for the trained run ``run_dir`` against the champion of its dataset in
    ``model_store``, both evaluated on the test split of ``data_dir`` (less the rows the champion has seen:
    :data:`OVERLAP_RULE`); ``promote`` says whether the gate lets the run replace the champion (always, when
    there is none); ``margins`` are the per-task non-inferiority margins (:func:`mtlflow.metrics.paired.gate`)."""
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
        return {**record, "promote": True, "champion": None, "gate": None, "overlap": None,
                "reason": f"no champion for {cand['dataset']} yet"}
    if sorted(champion["tasks"]) != record["tasks"]:
        raise DataError(f"the champion of {cand['dataset']} solves tasks {champion['tasks']} but the candidate "
                        f"{record['tasks']}; use another model store for a different task set")
    # the version directory under this store root (the recorded absolute path may be another mount's)
    version_dir = store.benchmark_dir(model_store, cand["dataset"]) / "versions" / champion["version"]
    held = evaluate_on(version_dir / "model.pt", data_dir)
    overlap, keep = check_overlap(version_dir, data_dir, len(next(iter(cand["errors"].values()))))
    if overlap.get("rows"):
        print(f"warning: {overlap['rows']} of {overlap['of']} test rows are rows the champion trained or was selected "
              "on; they are left out of the comparison")
    decision = gate({t: cand["errors"][t][keep] for t in record["tasks"]},
                    {t: held["errors"][t][keep] for t in record["tasks"]},
                    min_improvement, statistics=cand["statistics"], margins=margins)
    return {**record, "promote": decision.promote, "reason": decision.reason, "gate": decision.as_dict(),
            "overlap": overlap,
            "champion": {"version": champion["version"], "label": champion["label"],
                         "stored_error": champion["error"], "stored_data_hash": champion["data_hash"],
                         **_summary(held, champion["primary_metrics"])}}
