"""What the ``train`` and ``compare_to_champion`` components copy into their kfp outputs beyond their step's
result (:mod:`mtlflow.jobs.pipeline_steps`): whether a trained run converged, and the metadata of a gate
decision. No kfp import here, so the components' bodies only copy values."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtlflow.core import atomic

#: the fields of run.json's training record copied to the metadata of the run and model artifacts
METADATA_FIELDS = ("converged", "convergence", "best_epoch", "epochs_run")


def convergence_outputs(run_dir: str | Path) -> dict[str, Any]:
    """``{"metadata": {converged, convergence, best_epoch, epochs_run}, "metrics": {"converged": 1.0 | 0.0},
    "warning": the convergence note of a run that did not converge, else ""}`` from ``<run_dir>/run.json``;
    all empty for a run without a training record (a reused run trained before it was recorded)."""
    training = atomic.read_json(Path(run_dir) / "run.json", "run description").get("training")
    if not training:
        return {"metadata": {}, "metrics": {}, "warning": ""}
    return {"metadata": {field: training[field] for field in METADATA_FIELDS},
            "metrics": {"converged": float(training["converged"])},
            "warning": "" if training["converged"] else training["convergence"]}


def decision_metadata(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The ``decision`` artifact's metadata from :func:`mtlflow.jobs.pipeline_steps.compare_to_champion`'s
    ``outcome``: whether to promote, the reason, split and data hash, the champion's version (None: there was
    none) and the gate's rule."""
    record = outcome["decision"]
    return {"promote": outcome["promote"], "reason": record["reason"], "split": record["split"],
            "data_hash": record["data_hash"],
            "champion": record["champion"]["version"] if record["champion"] else None,
            "rule": record["gate"]["rule"] if record["gate"] else "no champion: promote"}
