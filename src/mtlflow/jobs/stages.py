"""DVC stages: ``mtlflow stage {prepare,train,reference,evaluate,aggregate,experiment}`` read
``params.yaml`` and call the same :mod:`mtlflow.jobs` functions as the CLI and the Kubeflow components.

Paths (relative to the DVC project root):

* ``data/prepared``                      -- prepared benchmark data (DVC-tracked, pushed with ``dvc push``);
* ``runs/mtl/<method>-s<seed>``          -- one run per (method, seed) of ``train.methods x train.seeds``;
* ``runs/reference/<task>-s<seed>``      -- single-task reference runs;
* ``runs/evaluation/<method>-s<seed>.json`` -- test-split evaluation of every sweep run;
* ``runs/experiment/<method>-s<seed>``   -- the research run of ``train.method`` (``dvc exp run -S train.method=X``);
* ``metrics/train/<method>-s<seed>.json``, ``metrics/evaluate.json``, ``metrics/summary.json`` and
  ``metrics/experiment.json`` -- DVC metrics;
* ``reports/latest`` and ``reports/experiment`` -- the aggregate reports (HTML, plots, tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError

DATA = Path("data/prepared")
RUNS = Path("runs/mtl")
REFERENCES = Path("runs/reference")
EVALUATIONS = Path("runs/evaluation")
EXPERIMENTS = Path("runs/experiment")


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise InvalidParameterError(f"{path} not found; run DVC stages from the project root")
    params = atomic.read_yaml(path, "params file") or {}
    if not isinstance(params, dict):
        raise InvalidParameterError(f"{path} must hold a mapping with prepare, train and reference sections")
    for section in ("prepare", "train", "reference"):
        if section not in params:
            raise InvalidParameterError(f"{path} lacks the '{section}' section")
    return params


def run_name(method: str, seed: int) -> str:
    return f"{method}-s{seed}"


def flat_metrics(final: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"{task}.{name}": value for task, values in final.items() for name, value in values.items()}


def stage_prepare(params: dict[str, Any]) -> None:
    prep = params["prepare"]
    jobs.prepare(prep["benchmark"], DATA, overwrite=True, **(prep.get("options") or {}))


def _train_options(params: dict[str, Any]) -> dict[str, Any]:
    train = params["train"]
    return {"epochs": train["epochs"], **(train.get("options") or {})}


def _teleport(params: dict[str, Any]) -> dict[str, Any]:
    """``train.teleport`` (COST around the method runs; references never teleport) and its options."""
    train = params["train"]
    if not train.get("teleport"):
        return {}
    return {"teleport": train["teleport"], "teleport_options": train.get("teleport_options") or {}}


def stage_train(params: dict[str, Any], method: str, seed: int) -> None:
    train = params["train"]
    out = RUNS / run_name(method, seed)
    result = jobs.train(DATA, out, method=method, seed=seed, overwrite=True,
                        hparams=(train.get("method_hparams") or {}).get(method, {}),
                        progress=False, **_train_options(params), **_teleport(params))
    atomic.write_json(Path("metrics/train") / f"{run_name(method, seed)}.json", flat_metrics(result["final"]["test"]))


def stage_reference(params: dict[str, Any], task: str, seed: int) -> None:
    jobs.train(DATA, REFERENCES / f"{task}-s{seed}", method="ls", seed=seed, tasks=[task], progress=False,
               overwrite=True, **_train_options(params))


def _reference_dirs(params: dict[str, Any]) -> list[Path]:
    ref = params["reference"]
    return [REFERENCES / f"{t}-s{s}" for t in ref["tasks"] for s in ref["seeds"]]


def _scores(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {label: {k: row[k] for k in ("delta_m", "mean_rank", "hypervolume") if k in row}
            for label, row in summary["methods"].items()}


def stage_evaluate(params: dict[str, Any]) -> None:
    """Evaluate the final model of every sweep run on the test split (checks the data version too)."""
    train = params["train"]
    flat = {}
    for method in train["methods"]:
        for seed in train["seeds"]:
            name = run_name(method, seed)
            result = jobs.evaluate(RUNS / name, DATA, split="test", out_file=EVALUATIONS / f"{name}.json")
            flat[name] = flat_metrics(result["metrics"])
    atomic.write_json(Path("metrics/evaluate.json"), flat)


def stage_aggregate(params: dict[str, Any]) -> None:
    train = params["train"]
    runs = [RUNS / run_name(m, s) for m in train["methods"] for s in train["seeds"]]
    summary = jobs.aggregate(runs, Path("reports/latest"), reference_dirs=_reference_dirs(params))
    atomic.write_json(Path("metrics/summary.json"), _scores(summary))


def stage_experiment(params: dict[str, Any]) -> None:
    """The research loop: train ``train.method`` (one run per seed of ``train.seeds``) and score it
    against the single-task references; ``dvc exp run -S train.method=X`` compares methods as experiments."""
    train = params["train"]
    method = train.get("method")
    if not method:
        raise InvalidParameterError("params.yaml lacks train.method; set it or run "
                                    "`dvc exp run -S train.method=<name>`")
    runs = []
    for seed in train["seeds"]:
        out = EXPERIMENTS / run_name(method, seed)
        jobs.train(DATA, out, method=method, seed=seed, hparams=(train.get("method_hparams") or {}).get(method, {}),
                   progress=False, overwrite=True, **_train_options(params), **_teleport(params))
        runs.append(out)
    summary = jobs.aggregate(runs, Path("reports/experiment"), reference_dirs=_reference_dirs(params))
    (label, row), = summary["methods"].items()
    atomic.write_json(Path("metrics/experiment.json"), {
        **_scores(summary)[label],
        **{f"test.{k}": v for k, v in flat_metrics(row["mean"]).items()}})
