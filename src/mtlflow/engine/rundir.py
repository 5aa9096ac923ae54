"""A run directory's files as one unit: ``run.json`` describes the run, ``metrics.json`` and ``model.pt``
must be that run's results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from mtlflow.core import atomic
from mtlflow.core.errors import DataError


def check_run_consistent(run_dir: Path, require_completed: bool = True) -> None:
    """Refuse a run directory whose ``metrics.json`` or ``model.pt`` is not the result of the run
    ``run.json`` describes (an unfinished run, or files of two runs mixed by hand)."""
    import torch

    run = atomic.read_json(run_dir / "run.json", "run description")
    if require_completed and run.get("status") != "completed":
        raise DataError(f"run {run_dir} did not complete (status {run.get('status')!r}); finish it with "
                        "`mtlflow train ... --resume` or train it again with --overwrite")
    described = (run.get("config", {}).get("method"), run.get("data_hash"), run.get("tasks"))
    files = {"metrics.json": lambda p: atomic.read_json(p, "run metrics")}
    if require_completed or (run_dir / "model.pt").is_file():
        files["model.pt"] = lambda p: torch.load(p, map_location="cpu", weights_only=False)
    for name, load in files.items():
        path = run_dir / name
        if not path.is_file():
            raise DataError(f"{path} not found; train the run again with --overwrite")
        try:
            blob = load(path)
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"{path} is corrupt ({type(exc).__name__}); train the run again with --overwrite") from None
        if (blob.get("method"), blob.get("data_hash"), blob.get("tasks")) != described:
            raise DataError(f"{path} does not belong to the run in {run_dir / 'run.json'} (another method, data "
                            "or task set); train the run again with --overwrite")


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """``run.json`` and ``metrics.json`` of a completed run."""
    run_dir = Path(run_dir)
    run = atomic.read_json(run_dir / "run.json", "run description")
    metrics = atomic.read_json(run_dir / "metrics.json", "run metrics")
    if run.get("status") != "completed" or "final" not in metrics:
        raise DataError(f"run {run_dir} did not complete (status {run.get('status')!r}); "
                        "finish it with `mtlflow train ... --resume` or drop it from the aggregate")
    return {"dir": str(run_dir), "run": run, "metrics": metrics}


def run_label(run: Mapping[str, Any]) -> str:
    """Display name of a run's method: the method name plus its non-default hyper-parameters."""
    config = run["config"]
    label = config["method"]
    if config.get("hparams"):
        label += "(" + ",".join(f"{k}={v}" for k, v in sorted(config["hparams"].items())) + ")"
    if config.get("teleport"):
        label += f"+{config['teleport']}"
        if config.get("teleport_options"):  # a COST variant or ablation is another row
            label += "(" + ",".join(f"{k}={v}" for k, v in sorted(config["teleport_options"].items())) + ")"
    if config.get("architecture", "hps") != "hps":  # same method on another architecture: another row
        label += f"@{config['architecture']}"
    return label
