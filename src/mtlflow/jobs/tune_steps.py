"""``mtlflow tune`` as the steps of the ``tuned_sweep`` pipeline, the DVC ``tune`` stage's metrics and the tuned
candidate of ``retrain``: plain functions the components and stages call (no kfp import here).

The local pipeline runs one :func:`mtlflow.jobs.tune.tune` in steps on one shared work directory (on the
checkpoints volume, keyed by the data and the request): :func:`plan_studies` claims it and names the studies, one
:func:`search_study` per study runs that study's trials (a worker of it alone, :func:`~mtlflow.jobs.tune.tune`'s
``studies``), and :func:`compare_tuned` -- the same call with ``resume`` -- finds every budget spent, retrains the
chosen configurations with fresh seeds and compares them: the ``tune.json`` that ``mtlflow tune`` writes for the
same request, each study's trials being seeded by their own numbers whatever order the tasks ran in.

On the cluster Katib runs the studies (:mod:`mtlflow.jobs.katib_launch`) and :func:`tuned_run_plans` turns its best
trials into the retrained runs the pipeline's train components run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.config.pipeline import canonical_hparams, from_struct, plan_run
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.jobs import tune
from mtlflow.ops import dvc as dvc_io

#: where the local pipeline's tuning runs live under the checkpoints root
TUNE_ROOT = "tune"


def tune_kwargs(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    """:func:`~mtlflow.config.pipeline.tune_arguments` (plain values; as JSON between pipeline steps) as
    :func:`mtlflow.jobs.tune.tune`'s keyword arguments: no ``tasks`` means all, a zero ``budget_steps`` whole
    trials."""
    args = from_struct(json.loads(arguments) if isinstance(arguments, str) else dict(arguments))
    return {**args, "tasks": args.get("tasks") or None, "budget_steps": args.get("budget_steps") or None}


def work_dir(work_root: str | Path, data_metadata: Mapping[str, Any], arguments: str | Mapping[str, Any],
             run_name: str) -> Path:
    """The tuning run's directory: ``<work_root>/tune/<key>``, the key a hash of the data's content hash, the
    request and the pipeline run's name (a retried task of the same run finds its studies again; another run
    never shares them)."""
    identity = {"data": data_metadata.get("content_hash"), "arguments": tune_kwargs(arguments), "run": run_name}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(work_root) / TUNE_ROOT / f"tune-{digest}"


def _checked(data: str, data_metadata: Mapping[str, Any]) -> None:
    """Refuse a dataset whose DVC hash is not the one prepare_data recorded (as the train step does)."""
    if data_metadata.get("dvc_hash"):
        dvc_io.verify_directory(data, data_metadata["dvc_hash"])


def plan_studies(data: str, data_metadata: Mapping[str, Any], work_root: str, run_name: str,
                 arguments: str | Mapping[str, Any]) -> list[str]:
    """Claim the work directory (:func:`work_dir`) for the request (its ``plan.json``; a retried task resumes it)
    and return one loop item per study, LS first, then the methods, then one reference per task: JSON
    ``{"study", "arguments"}``, each study task's whole input (a loop body then needs no other task's output)."""
    _checked(data, data_metadata)
    work = work_dir(work_root, data_metadata, arguments, run_name)
    tune.tune(work, data_dir=data, studies=[], resume=True, compare=False, progress=False, **tune_kwargs(arguments))
    request = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    return [json.dumps({"study": study, "arguments": request}, sort_keys=True)
            for study in atomic.read_json(Path(work) / tune.PLAN_NAME, "tuning plan")["studies"]]


def search_study(data: str, data_metadata: Mapping[str, Any], work_root: str, run_name: str,
                 item: str) -> dict[str, Any]:
    """Run the trials of the study of ``item`` (from :func:`plan_studies`) until its budget is spent (a killed
    task's trial is adopted and resumed by its retry); returns ``{"study", "worker"}``."""
    _checked(data, data_metadata)
    planned = json.loads(item)
    study, arguments = planned["study"], planned["arguments"]
    work = work_dir(work_root, data_metadata, arguments, run_name)
    done = tune.tune(work, data_dir=data, studies=[study], resume=True, compare=False, progress=True,
                     **tune_kwargs(arguments))
    return {"study": study, "worker": done["worker"]}


def compare_tuned(data: str, data_metadata: Mapping[str, Any], work_root: str, run_name: str,
                  arguments: str | Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Retrain every study's chosen configuration with the fresh seeds and compare them; returns the work directory
    and its ``tune.json`` (the comparison under it). The studies' budgets are spent by then: no trial runs here."""
    _checked(data, data_metadata)
    work = work_dir(work_root, data_metadata, arguments, run_name)
    return work, tune.tune(work, data_dir=data, resume=True, compare=True, progress=False, **tune_kwargs(arguments))


def tuned_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The flat metrics of a tuning result the Kubeflow UI and DVC show: per study its best validation score, the
    steps it spent and its trials, and every chosen numeric setting."""
    flat: dict[str, float] = {}
    for name, study in result["studies"].items():
        flat[f"{name}.best_value"] = float(study["best_value"])
        flat[f"{name}.steps"] = float(study["spent"]["steps"])
        flat[f"{name}.trials"] = float(study["spent"]["trials"])
        for group in ("train_options", "hparams"):
            flat.update({f"{name}.{k}": float(v) for k, v in study["chosen"][group].items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return flat


def trial_options(train_options: Mapping[str, Any], epochs: int) -> dict[str, Any]:
    """The training options of every trial: ``train_options`` with ``epochs``, as
    :func:`~mtlflow.config.pipeline.tune_arguments` gives them
    (``launch_katib`` sizes its budget and its trials from them)."""
    return {**from_struct(dict(train_options)), "epochs": int(epochs)}


def retrain_seeds(seed: int, count: int) -> list[int]:
    """The fresh seeds of the retrained runs, as ``mtlflow tune`` draws them: ``seed + 1 ... seed + count``."""
    return [int(seed) + i for i in range(1, int(count) + 1)]


def tuned_run_plans(studies: Mapping[str, Mapping[str, Any]], seed: int, count: int, task_names: Sequence[str],
                    tasks: Sequence[str] | None, train_options: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The retrained runs of Katib's best trials (``launch_katib``'s studies): per method and fresh seed
    ``{"run_spec", "train_options"}`` -- the train component's spec and the pipeline's ``train_options`` with the
    chosen settings over them -- and per task and seed a single-task LS reference with tuned LS's settings (the
    Katib launcher tunes the methods only)."""
    studies, options = from_struct(dict(studies)), from_struct(dict(train_options))
    if tune.BASELINE not in studies:
        raise InvalidParameterError(f"the tuning result has no {tune.BASELINE} study (the baseline); it holds "
                                    f"{', '.join(studies) or 'none'}")
    seeds = retrain_seeds(seed, count)
    chosen_tasks = {"tasks": list(tasks)} if tasks else {}
    runs = [{"run_spec": json.dumps({"method": study["method"], "seed": s, **chosen_tasks,
                                     "hparams": canonical_hparams(study["method"], study.get("hparams") or {})},
                                    sort_keys=True),
             "train_options": {**options, **study.get("train_options", {})}}
            for study in studies.values() for s in seeds]
    baseline = {**options, **studies[tune.BASELINE].get("train_options", {})}
    references = [{"run_spec": json.dumps({"method": tune.BASELINE, "seed": s, "hparams": {}, "tasks": [t],
                                           "reference": True}, sort_keys=True), "train_options": baseline}
                  for t in (tasks or task_names) for s in seeds] if len(tasks or task_names) > 1 else []
    return {"runs": runs, "references": references}


def tuned_candidate(path: str | Path) -> dict[str, Any]:
    """The candidate a tuning result (``tune.json``) names for ``retrain``: the method its comparison ranks best
    (lowest Δm%, else mean rank: the comparison's ``best_method``) with that study's chosen ``train_options`` and
    ``hparams`` (its fixed ones included) and the options every trial trained with (``epochs`` and ``device``
    excepted: the retrain's own)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"tuned: {path} not found; give the tune.json of `mtlflow tune` or tuned_sweep")
    result = atomic.read_json(path, "tuning result")
    if "studies" not in result or "comparison" not in result:
        raise InvalidParameterError(f"tuned: {path} holds no compared tuning result (run mtlflow tune with "
                                    "--retrain-seeds >= 1 and the comparison on)")
    summary = atomic.read_json(path.parent / result["comparison"]["results"], "tuned comparison")
    best = summary.get("best_method")
    labels = {}
    for name, study in result["studies"].items():
        if study["kind"] == "method" and study.get("retrained"):
            run_dir = Path(study["retrained"][0])
            run_dir = run_dir if run_dir.is_absolute() else path.parent / run_dir
            labels[jobs.run_label(jobs.read_run(run_dir)["run"])] = name
    if best not in labels:
        raise DataError(f"tuned: {path}'s comparison ranks {best!r} best, which is none of its tuned methods "
                        f"({', '.join(labels)}); the result is damaged: tune again")
    study = result["studies"][labels[best]]
    fixed = {k: v for k, v in result.get("train_options", {}).items() if k not in ("epochs", "device")}
    return {"method": study["method"], "study": labels[best], "label": best,
            "hparams": {**study.get("fixed_hparams", {}), **study["chosen"]["hparams"]},
            "train_options": {**fixed, **study["chosen"]["train_options"]}}


def candidate_run(tuned: str, method: str, seed: int, hparams: Mapping[str, Any],
                  train_options: Mapping[str, Any]) -> dict[str, Any]:
    """``retrain``'s run: ``{"run_spec", "train_options", "note"}``; with ``tuned`` (a tune.json) its winning
    method, hyper-parameters and chosen settings over ``train_options``, else ``method`` and ``hparams`` as given."""
    options = from_struct(dict(train_options))
    if not tuned:
        return {"run_spec": plan_run(method, seed, hparams), "train_options": options, "note": ""}
    candidate = tuned_candidate(tuned)
    note = (f"retrain candidate from {tuned}: {candidate['label']} (study {candidate['study']}, the comparison's best) "
            f"with {candidate['train_options']}, in place of method {method}")
    return {"run_spec": plan_run(candidate["method"], seed, candidate["hparams"]),
            "train_options": {**options, **candidate["train_options"]}, "note": note}
