"""The Kubeflow components' work as plain functions: each component body parses its inputs, calls one of
these and copies the returned values into its kfp outputs (metadata, logged metrics). No kfp import here,
so the same steps run, and are tested, without a pipeline.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.benchmarks.base import read_manifest
from mtlflow.config.data import DataConfig
from mtlflow.config.pipeline import from_struct, reference_options, run_key
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.engine.rundir import check_run_consistent
from mtlflow.jobs.champion import decide, seen_rows
from mtlflow.jobs.compare.summary import MethodRow, to_json
from mtlflow.jobs.run_report import evaluation_markdown, run_markdown, run_report_html
from mtlflow.ops import dvc as dvc_io
from mtlflow.ops import model_store as store
from mtlflow.ops import run_status
from mtlflow.ops.observability import export_decision, export_run_status, export_summary, training_exporters


def flat_metrics(prefix: str, metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``{task: {name: value}}`` as the flat ``{"<prefix>.<task>.<name>": value}`` the Kubeflow UI shows."""
    return {f"{prefix}.{task}.{name}": float(value)
            for task, values in metrics.items() for name, value in values.items()}


def prepare_data(benchmark: str, data_options: Mapping[str, Any], out: str, data_version: str = "",
                 dvc_remote: str = "", default_remote: str = "", dvc_cache: str = "", spec: str = "",
                 spec_rev: str = "") -> dict[str, Any]:
    """Prepare ``benchmark`` with ``data_options`` (or the task spec ``spec``, its table at ``spec_rev``) into
    ``out`` and push it to the DVC remote, or pull ``data_version`` from it; returns the Dataset artifact's
    metadata (benchmark, data options, tasks, hashes)."""
    benchmark, options = DataConfig(benchmark, from_struct(dict(data_options)), spec, spec_rev).preparation()
    remote = dvc_io.resolve_remote(dvc_remote, default_remote)
    if data_version:
        if not remote:
            raise InvalidParameterError("data_version needs a DVC remote: set dvc_remote or $MTLFLOW_DVC_REMOTE")
        dvc_io.pull_dataset(data_version, remote, out, cache_dir=dvc_cache or None)
        manifest = read_manifest(out)
        if manifest["benchmark"] != benchmark:
            raise InvalidParameterError(f"data version {data_version} holds {manifest['benchmark']} data, "
                                        f"not {benchmark}; set benchmark={manifest['benchmark']}")
        options = manifest.get("config", {})
        version = {"git_revision": dvc_io.git_revision(), "dvc_hash": data_version, "dvc_remote": remote}
    else:
        manifest = jobs.prepare(benchmark, out, **options)
        version = dvc_io.version_metadata(out, remote)
    return {"benchmark": benchmark, "dataset": manifest.get("label", benchmark), "data_options": options,
            "tasks": manifest["tasks"], "content_hash": manifest["content_hash"], **version}


def run_dir_state(work_dir: Path) -> str:
    """What ``train`` does with the run directory of its run key: ``"reuse"`` a finished run whose files
    are consistent; ``"retrain"`` (from scratch) a run that stopped with an error or whose files are
    not the run's; ``"resume"`` an interrupted or killed run from its checkpoint, or start a new one."""
    if not (work_dir / "run.json").is_file():
        return "resume"
    try:
        status = atomic.read_json(work_dir / "run.json", "run description").get("status")
        if status == "failed":
            return "retrain"
        if status != "completed":
            return "resume"
        check_run_consistent(work_dir)
        jobs.read_run(work_dir)
    except DataError:
        return "retrain"
    return "reuse"


def train(data: str, data_metadata: Mapping[str, Any], run_out: str, model_out: str, report_out: str,
          summary_out: str, run_spec: str, epochs: int, train_options: Mapping[str, Any], checkpoint_root: str = "",
          pushgateway: str = "", pipeline_name: str = "", pipeline_run: str = "") -> dict[str, Any]:
    """Train the run of ``run_spec`` on the Dataset at ``data`` (refused when its hashes differ from
    ``data_metadata``'s). With ``checkpoint_root`` the run directory is ``<root>/<run key>``, the key
    hashing only the task's inputs (spec, data content hash, epochs, options): a finished run there is
    reused without training, one that failed is trained again from scratch, an interrupted or killed
    one resumes from its checkpoint (:func:`run_dir_state`). The run is copied to ``run_out`` (without
    the checkpoint), its weights to ``model_out``, its HTML report and Markdown summary to
    ``report_out`` / ``summary_out``. A method's run (not a reference) also keeps its evaluation on the test
    split with each example's error (``test_evaluation.json`` and ``test_evaluation.per_example.npz`` in the run
    directory): what the aggregate's paired comparison of two methods over the test examples needs, carried to it
    by the run artifact. Telemetry is pushed with the run key as its ``run`` label and, in the
    grouping key, ``pipeline_run`` (the pipeline run's name, by which its exit handler deletes the group).
    A single-task reference (``"reference": true`` in the spec) takes ``train_options`` without COST's
    (:func:`~mtlflow.config.pipeline.reference_options`).
    Returns ``{"metadata": ..., "metrics": {task: {name: value}}, "state": ...}`` (the selected final test
    metrics; the run directory's state when the task started)."""
    spec = json.loads(run_spec)
    options = from_struct(dict(train_options))
    if spec.get("reference"):
        options = reference_options(options)
    content_hash = data_metadata.get("content_hash")
    if data_metadata.get("dvc_hash"):
        dvc_io.verify_directory(data, data_metadata["dvc_hash"])
    key = run_key(run_spec, content_hash or "", epochs, options)
    work_dir, state = Path(run_out), "new"
    if checkpoint_root:
        work_dir = Path(checkpoint_root) / key
        state = run_dir_state(work_dir)
        print(f"run directory {work_dir}: " + {"reuse": "a finished run of the same inputs, reused",
                                               "retrain": "its run failed; training again from scratch",
                                               "resume": "training (resumes from its checkpoint if one exists)"}[state])
    if state == "reuse":
        final = jobs.read_run(work_dir)["metrics"]["final"]
    else:
        with training_exporters(pushgateway=pushgateway or None, pipeline=pipeline_name or "kfp", run=key,
                                pipeline_run=pipeline_run) as callbacks:
            final = jobs.train(data, work_dir, method=spec["method"], seed=int(spec["seed"]),
                               hparams=spec.get("hparams", {}), tasks=spec.get("tasks"), epochs=epochs,
                               expected_hash=content_hash, resume=state == "resume", overwrite=state == "retrain",
                               progress=False, callbacks=callbacks, **options)["final"]
    if work_dir != Path(run_out):
        shutil.copytree(work_dir, run_out, ignore=shutil.ignore_patterns("checkpoint.pt", ".mtlflow.lock"),
                        dirs_exist_ok=True)
    if not spec.get("reference"):  # what the aggregate's paired comparisons of the methods pair on
        jobs.evaluate(run_out, data, split="test", out_file=Path(run_out) / jobs.split_evaluation_name("test"),
                      per_example=True)
    shutil.copyfile(Path(run_out) / "model.pt", model_out)
    atomic.write_text(report_out, run_report_html(run_out))
    atomic.write_text(summary_out, run_markdown(run_out))
    metadata = {"method": spec["method"], "label": jobs.run_label(jobs.read_run(run_out)["run"]),
                "seed": int(spec["seed"]), "tasks": spec.get("tasks") or data_metadata.get("tasks"),
                "data_hash": content_hash, "dvc_hash": data_metadata.get("dvc_hash"), "run_key": key}
    return {"metadata": metadata, "metrics": final["test"], "state": state}


def evaluate(run: str, data: str, split: str, evaluation_out: str, confusion_out: str, summary_out: str,
             confusion_task: str = "") -> dict[str, Any]:
    """Evaluate the run's final model on ``split``; writes the evaluation JSON, every confusion matrix and a
    Markdown summary. Returns the metrics, the evaluation's metadata and the confusion matrix the UI shows
    (``confusion_task``, default the first classification task; None when there is none)."""
    result = jobs.evaluate(run, data, split=split, out_file=evaluation_out, confusion=True)
    matrices = result["confusion_matrices"]
    if confusion_task and confusion_task not in matrices:
        raise InvalidParameterError(f"confusion_task {confusion_task!r} is not a classification task of this run; "
                                    f"valid: {', '.join(matrices) or 'none'}")
    shown = confusion_task or next(iter(matrices), "")
    atomic.write_text(confusion_out, json.dumps(matrices))
    atomic.write_text(summary_out, evaluation_markdown(result))
    return {"metrics": result["metrics"],
            "metadata": {"split": split, "method": result["method"], "data_hash": result["data_hash"]},
            "confusion": {"task": shown, **matrices[shown]} if shown else None}


def aggregate(runs: Sequence[str], references: Sequence[str], method_set: Sequence[str], results_out: str,
              report_out: str, summary_out: str, pushgateway: str = "", pipeline_name: str = "",
              run_name: str = "", baselines: Sequence[str] = ()) -> dict[str, Any]:
    """Compare the runs against the single-task references (the methods of ``method_set`` rank); copies the
    HTML report and the Markdown table out, pushes the comparison to Prometheus when a gateway is set
    (grouped by pipeline, benchmark and ``run_name``, the pipeline run's name). ``baselines``: the directories of
    the sweep's baselines (rows of the report, in no score).
    Returns the results' metadata and the flat metrics the Kubeflow UI shows (Δm%, mean rank, hypervolume,
    each task's primary metric per method)."""
    labels = sorted({jobs.run_label(jobs.read_run(r)["run"]) for r in runs})
    declared = [m for m in labels if m in method_set or m.split("(")[0] in method_set]
    outcome = jobs.aggregate(list(runs), results_out, reference_dirs=list(references), method_set=declared or None,
                             baseline_dirs=list(baselines))
    shutil.copyfile(Path(results_out) / "report.html", report_out)
    shutil.copyfile(Path(results_out) / "results.md", summary_out)
    primary = outcome.primary_metrics
    flat: dict[str, float] = {}
    for label, row in outcome.methods.items():
        flat.update({f"{label}.{SHOWN[key]}": value for key, value in _scores(row).items()})
        flat.update({f"{label}.{task}.{primary[task]}": float(row.mean[task][primary[task]])
                     for task in outcome.tasks})
        # the 95 % interval bounds over seeds (absent with one seed: the UI shows no made-up spread)
        for key, interval in (("delta_m", row.delta_m and row.delta_m.interval),
                              ("delta_m_paper", row.delta_m_paper and row.delta_m_paper.interval),
                              ("hypervolume", row.hypervolume_interval)):
            if interval and interval.low is not None:
                flat[f"{label}.{SHOWN[key]}_low"] = float(interval.low)
                flat[f"{label}.{SHOWN[key]}_high"] = float(interval.high)
        for task in outcome.tasks:
            estimate = row.intervals[task][primary[task]]
            if estimate.low is not None:
                flat[f"{label}.{task}.{primary[task]}_low"] = float(estimate.low)
                flat[f"{label}.{task}.{primary[task]}_high"] = float(estimate.high)
        versus = row.versus.get("ls")
        if versus is not None and versus.delta_m is not None:
            flat[f"{label}.prob_improvement_vs_ls"] = float(versus.delta_m.probability_of_improvement)
    export_summary(to_json(outcome), pushgateway or None, pipeline=pipeline_name or "kfp", run=run_name or "kfp")
    vs_ls = {m: r.versus["ls"] for m, r in outcome.methods.items() if "ls" in r.versus}
    return {"metadata": {"benchmark": outcome.benchmark, "data_hash": outcome.data_hash,
                         "pareto_set": list(outcome.pareto_set),
                         "pareto_set_confident": list(outcome.pareto_set_confident),
                         "best_method": outcome.best_method, "warnings": list(outcome.warnings),
                         "verdicts_vs_ls": {m: v.delta_m.verdict for m, v in vs_ls.items() if v.delta_m is not None},
                         # over the shared test examples, on the mean over tasks (or why there is no paired one)
                         "paired_verdicts_vs_ls": {m: v.paired.short_verdict for m, v in vs_ls.items()}},
            "metrics": flat,
            "scores": {m: _row_scores(r) for m, r in outcome.methods.items()}}


#: the Kubeflow metric name of each score of a summary row
SHOWN = {"delta_m": "delta_m_pct", "delta_m_paper": "delta_m_paper_pct", "mean_rank": "mean_rank",
         "hypervolume": "hypervolume"}


def _row_scores(row: MethodRow) -> dict[str, float]:
    """A row's scores in results.json's order (hypervolume, Δm%, paper Δm%, mean rank), those it has."""
    scores = {"hypervolume": row.hypervolume, "delta_m": row.delta_m and row.delta_m.mean,
              "delta_m_paper": row.delta_m_paper and row.delta_m_paper.mean,
              "mean_rank": row.mean_rank and row.mean_rank.mean}
    return {k: v for k, v in scores.items() if v is not None}


def _scores(row: MethodRow) -> dict[str, float]:
    """A row's scores as floats, in the Kubeflow metrics' order (Δm%, paper Δm%, mean rank, hypervolume)."""
    scores = _row_scores(row)
    return {k: float(scores[k]) for k in SHOWN if k in scores}


def compare_to_champion(run: str, data: str, model_store: str, min_improvement: float, decision_out: str,
                        pushgateway: str = "", pipeline_name: str = "", run_name: str = "",
                        margins: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The retrain gate: evaluate the run and the champion of ``model_store`` on the test split of ``data``
    (the candidate's prepared data) and decide from the paired per-example errors
    (:func:`mtlflow.jobs.champion.decide`; ``margins``: the per-task non-inferiority margins). The decision
    record goes to the model store's ``decisions/`` (kept, or pending the promote step) and to
    ``decision_out`` (what ``promote`` settles and stores with the new champion); prints the reason. Only a
    kept champion is a final outcome here: Prometheus and the returned metrics show ``promoted`` 0 until
    :func:`promote` decides under the store's lock. Returns ``{"promote": bool, "decision": record, "metrics":
    flat}`` (``promote``: the gate's verdict, whether the promote step runs)."""
    decided = decide(run, data, model_store, min_improvement, margins)
    kept = store.record_decision(model_store, decided)
    decision = atomic.read_json(kept, "gate decision")
    atomic.write_json(decision_out, decision)
    export_decision({**decision, "promote": bool(decision["promoted"])}, pushgateway or None,
                    pipeline=pipeline_name or "kfp", run=run_name or "kfp")
    print(("the gate would promote (the promote step decides): " if decision["promote"] else "keep the champion: ")
          + decision["reason"] + f" (record: {kept})")
    metrics = decision_metrics(decision) if not decision["promote"] else pending_metrics(decision)
    return {"promote": bool(decision["promote"]), "decision": decision, "metrics": metrics}


def pending_metrics(decision: Mapping[str, Any]) -> dict[str, float]:
    """The gate's UI metrics while the promote step has not decided: all but ``promoted``, which the promote
    step logs with the outcome."""
    return {k: v for k, v in decision_metrics(decision).items() if k != "promoted"}


def decision_metrics(decision: Mapping[str, Any]) -> dict[str, float]:
    """A settled gate decision as the flat metrics the Kubeflow UI shows: ``promoted`` (the outcome),
    ``<model>.error`` and ``<model>.<task>.<primary metric>`` of both models on the shared test split, ``n``,
    per task and for the score (``all``) the error difference with its interval
    (``difference.<task>.{estimate,low,high}``) and the smallest difference the split could detect
    (``resolution.<task>``), and the test rows the champion had seen (``overlap_rows``)."""
    flat = {"promoted": float(bool(decision.get("promoted", decision["promote"])))}
    for role in ("candidate", "champion"):
        model = decision.get(role)
        if model:
            flat[f"{role}.error"] = float(model["error"])
            flat.update({f"{role}.{task}.{metric}": float(model["metrics"][task][metric])
                         for task, metric in model["primary_metrics"].items()})
    if decision.get("gate"):
        gate = decision["gate"]
        flat["n"] = float(gate["combined"]["n"])
        for task, diff in (("all", gate["combined"]), *gate["tasks"].items()):
            flat.update({f"difference.{task}.estimate": float(diff["mean_difference"]),
                         f"difference.{task}.low": float(diff["low"]), f"difference.{task}.high": float(diff["high"])})
        flat.update({f"resolution.{task}": float(value) for task, value in gate.get("resolution", {}).items()})
    if (decision.get("overlap") or {}).get("checked"):
        flat["overlap_rows"] = float(decision["overlap"]["rows"])
    return flat


def promote(run: str, evaluation: str, decision: str, data_metadata: Mapping[str, Any], model_store: str,
            data: str = "", pushgateway: str = "", pipeline_name: str = "", run_name: str = "") -> dict[str, Any]:
    """Store the run as the champion, with its gate ``decision`` (a file written by
    :func:`compare_to_champion`), its data version and the digests of the rows of ``data`` it has seen, if the
    decision still holds under the store's lock, and settle the decision there. The outcome (promoted, or
    "kept: another retrain promoted X first") goes to the decision record, Prometheus and the returned
    metrics. Returns ``{"path": version path or "", "promoted", "outcome", "metrics"}``."""
    data_version = {k: data_metadata.get(k) for k in ("content_hash", "dvc_hash", "dvc_remote", "git_revision",
                                                      "benchmark", "data_options")}
    outcome = store.promote(model_store, run, atomic.read_json(Path(evaluation), "evaluation"),
                            atomic.read_json(Path(decision), "gate decision"), data=data_version,
                            seen_rows=seen_rows(data) if data else None)
    final = outcome["decision"]
    export_decision(final, pushgateway or None, pipeline=pipeline_name or "kfp", run=run_name or "kfp")
    if outcome["promoted"]:
        print(f"promoted {outcome['champion']['label']} as {outcome['version']} ({final['reason']})")
    return {"path": outcome["champion"]["path"] if outcome["promoted"] else "", "promoted": outcome["promoted"],
            "outcome": outcome["outcome"], "metrics": decision_metrics(final)}


def record_status(status_dir: str, pipeline: str, job_name: str, state: str, error_code: int | None,
                  error_message: str | None, exit_handler_task: str, resource_name: str,
                  pushgateway: str = "") -> str:
    """Record how a pipeline run ended (``<status_dir>/<job_name>.json``) and push it to Prometheus when a
    gateway is set; returns the record's path."""
    path = run_status.record(status_dir, pipeline=pipeline, job_name=job_name, state=state, error_code=error_code,
                             error_message=error_message, exit_handler_task=exit_handler_task,
                             resource_name=resource_name)
    finished = atomic.read_json(path, "run status record")["finished_unix"]
    export_run_status(pushgateway or None, pipeline=pipeline, run=job_name, state=state, finished_unix=finished)
    print(f"pipeline {pipeline} run {job_name} ended {state}; recorded in {path}")
    return str(path)
