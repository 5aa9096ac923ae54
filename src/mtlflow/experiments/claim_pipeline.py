"""The steps of the ``reproduce`` pipeline (``pipelines/reproduce.py``): a claim's seeds as tasks of their own.

``plan`` resolves the claim, scale and seeds; ``measure`` runs one seed (:func:`mtlflow.experiments.claims.
measure_seed`) and writes it as a JSON artifact; ``combine`` turns the seeds' artifacts into the claim's result
file (:func:`~mtlflow.experiments.claims.combine_seeds`: the record `mtlflow reproduce` writes, with the same
statistics and verdict) and the numbers the Kubeflow UI shows. The claims, their configurations and their
verdict rules are in :mod:`mtlflow.experiments.claims`, with their papers and tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments import claims

#: the verdicts as KFP metrics (numbers only): one indicator each
VERDICT_METRICS = {claims.REPRODUCED: "verdict_reproduced", claims.WITHIN: "verdict_within_interval",
                   claims.NOT_REPRODUCED: "verdict_not_reproduced"}


def plan(claim: str, scale: str, seeds: Sequence[int] = (), settings: Mapping[str, Any] | None = None) -> list[int]:
    """The seeds the pipeline's loop runs (``seeds``, or the scale's when empty); refuses bad input in one line
    before any seed runs."""
    _, _, seed_list = claims.resolve(claim, scale, list(seeds) or None, settings)
    return seed_list


def measure(out_path: str | Path, claim: str, scale: str, seed: int, device: str = "cpu",
            settings: Mapping[str, Any] | None = None, data_options: Mapping[str, Any] | None = None,
            work_root: str | Path = claims.WORK_DIR) -> dict[str, Any]:
    """Run one seed and write it (atomic) to ``out_path``; its runs are kept under ``work_root`` (the
    checkpoints volume on a cluster), where a retried task finds the finished ones."""
    measured = claims.measure_seed(claim, scale, int(seed), device=device, work_root=work_root,
                                   config_override=settings, data_options=data_options)
    atomic.write_json(out_path, measured)
    return measured


def combine(part_paths: Sequence[str | Path], out_path: str | Path, claim: str, scale: str, seeds: Sequence[int],
            device: str = "cpu", settings: Mapping[str, Any] | None = None,
            data_options: Mapping[str, Any] | None = None, command: str = "") -> dict[str, Any]:
    """The claim's result record from the seeds' artifacts, in the order of ``seeds`` (a loop's outputs come
    in any order), written (atomic) to ``out_path``."""
    by_seed: dict[int, dict[str, Any]] = {}
    for path in part_paths:
        measured = atomic.read_json(path, "measured seed")
        by_seed[int(measured["seed"])] = measured
    order = [int(s) for s in seeds]
    if sorted(by_seed) != sorted(order):
        raise InvalidParameterError(f"claim {claim}: the measured seeds {sorted(by_seed)} are not the planned "
                                    f"{sorted(order)}")
    record = claims.combine_seeds(claim, scale, [by_seed[s] for s in order], device=device,
                                  config_override=settings, data_options=data_options,
                                  command=command or f"{claims.get(claim).command(scale)} --pipeline")
    atomic.write_json(out_path, record)
    return record


def metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The result's numbers for the Kubeflow UI: mean, 95 % interval and n of the measured values, the
    baseline's and the difference's for a gain, the paper's number, and the verdict as a 0/1 indicator."""
    out: dict[str, float] = {}
    for prefix, estimate in (("", record["estimate"]), ("baseline_", record.get("baseline"))):
        if estimate:
            out.update({f"{prefix}{k}": float(estimate[k]) for k in ("mean", "low", "high", "n")
                        if estimate.get(k) is not None})
    difference = record.get("difference")
    if difference:
        names = {"difference": "difference", "low": "difference_low", "high": "difference_high",
                 "probability_of_improvement": "probability_of_improvement"}
        out.update({name: float(difference[k]) for k, name in names.items() if difference.get(k) is not None})
    if record.get("paper_value") is not None:
        out["paper_value"] = float(record["paper_value"])
    out.update({name: float(record["verdict"] == verdict) for verdict, name in VERDICT_METRICS.items()})
    return out
