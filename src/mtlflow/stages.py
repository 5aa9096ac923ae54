"""DVC stages: ``mtlflow stage {prepare,train,reference,aggregate}`` read ``params.yaml`` and call
the same :mod:`mtlflow.jobs` functions as the CLI and the Kubeflow components.

Paths (relative to the DVC project root):

* ``data/prepared``                      -- prepared benchmark data;
* ``runs/mtl/<method>-s<seed>``          -- one run per (method, seed) of ``train.methods x train.seeds``;
* ``runs/reference/<task>-s<seed>``      -- single-task reference runs;
* ``metrics/train/<method>-s<seed>.json`` and ``metrics/summary.json`` -- DVC metrics;
* ``reports/latest``                     -- the aggregate report (HTML, plots, tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mtlflow import atomic, jobs
from mtlflow.errors import InvalidParameterError

DATA = Path("data/prepared")
RUNS = Path("runs/mtl")
REFERENCES = Path("runs/reference")


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"{path} not found; run DVC stages from the project root")
    params = yaml.safe_load(path.read_text()) or {}
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
    jobs.prepare(prep["benchmark"], DATA, **(prep.get("options") or {}))


def _train_options(params: dict[str, Any]) -> dict[str, Any]:
    train = params["train"]
    return {"epochs": train["epochs"], **(train.get("options") or {})}


def stage_train(params: dict[str, Any], method: str, seed: int) -> None:
    train = params["train"]
    out = RUNS / run_name(method, seed)
    result = jobs.train(DATA, out, method=method, seed=seed,
                        hparams=(train.get("method_hparams") or {}).get(method, {}),
                        progress=False, **_train_options(params))
    atomic.write_json(Path("metrics/train") / f"{run_name(method, seed)}.json", flat_metrics(result["final"]["test"]))


def stage_reference(params: dict[str, Any], task: str, seed: int) -> None:
    jobs.train(DATA, REFERENCES / f"{task}-s{seed}", method="ls", seed=seed, tasks=[task], progress=False,
               **_train_options(params))


def stage_aggregate(params: dict[str, Any]) -> None:
    train, ref = params["train"], params["reference"]
    runs = [RUNS / run_name(m, s) for m in train["methods"] for s in train["seeds"]]
    refs = [REFERENCES / f"{t}-s{s}" for t in ref["tasks"] for s in ref["seeds"]]
    summary = jobs.aggregate(runs, Path("reports/latest"), reference_dirs=refs)
    atomic.write_json(Path("metrics/summary.json"), {
        label: {k: row[k] for k in ("delta_m", "mean_rank", "hypervolume") if k in row}
        for label, row in summary["methods"].items()})
