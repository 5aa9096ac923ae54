"""A run directory's files as one unit: ``run.json`` describes the run, ``metrics.json`` and ``model.pt``
must be that run's results, ``checkpoint.pt`` resumes it. The trainer writes them through this module
(the one place their formats are defined) and every reader (evaluate, aggregate, reports) reads them here.
"""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

import mtlflow
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError, StorageError
from mtlflow.core.seeding import capture_rng_state, restore_rng_state
from mtlflow.models import architectures

if TYPE_CHECKING:
    from mtlflow.engine.trainer import Trainer


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


# -- writing a run directory (the trainer) and reading its model --------------------------------------

def write_metrics(trainer: Trainer, final: dict[str, Any] | None = None) -> None:
    """``metrics.json``: every epoch's metrics so far and, at the end, the selected final ones (rank 0 writes)."""
    if not trainer.dist.is_main:  # every rank holds the same history; rank 0 writes it
        return
    payload = {
        "schema": 1,
        "benchmark": trainer.bench.name,
        "method": trainer.config.method,
        "seed": trainer.config.seed,
        "tasks": [t.name for t in trainer.tasks],
        "primary_metrics": {t.name: t.primary for t in trainer.tasks},
        "hv_reference": {t.name: t.hv_reference for t in trainer.tasks},
        "metric_specs": {t.name: t.metric_specs() for t in trainer.tasks},
        "data_hash": trainer.data.content_hash,
        "selection": {"rule": trainer.config.selection,
                      "split_used_for_selection": "val" if trainer.config.selection == "best-val" else None,
                      "note": "final = last epoch, mean of the last K epochs, or the epoch of the best validation "
                              "score (val_score); test never selects"},
        "budget": trainer.budget,
        "epochs": trainer.history,
    }
    if final is not None:
        payload["final"] = final
    if trainer.outcome is not None:
        payload["training"] = trainer.outcome
    atomic.write_json(trainer.out_dir / "metrics.json", payload)

def run_info(trainer: Trainer) -> dict[str, Any]:
    """What ``run.json`` says of the run besides its status."""
    return {
        "benchmark": trainer.bench.name,
        "benchmark_config": trainer.bench.config,
        "dataset": trainer.bench.label,
        "data_hash": trainer.data.content_hash,
        "kind": "single-task" if len(trainer.tasks) == 1 and len(trainer.bench.tasks) > 1 else "multi-task",
        "tasks": [t.name for t in trainer.tasks],
        "config": dataclasses.asdict(trainer.config),
        "fingerprint": trainer.config.fingerprint(),
        "versions": {"mtlflow": mtlflow.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "distributed": trainer.dist.describe(),
        # the CPU threads of torch's kernels: reductions split differently with another count
        "threads": torch.get_num_threads(),
        "budget": trainer.budget,
        **({"training": trainer.outcome, "converged": trainer.outcome["converged"]} if trainer.outcome else {}),
    }

def write_run_json(trainer: Trainer, status: str, error: str | None = None) -> None:
    if not trainer.dist.is_main:
        return
    info = run_info(trainer)
    info["status"] = status
    if error:
        info["error"] = error
    path = trainer.out_dir / "run.json"
    try:
        atomic.write_json(path, info)
    except StorageError:
        if status == "running" or not path.is_file():
            raise
        atomic.rewrite_json_in_place(path, info)  # a full disk must not leave the run saying "running"

def save_checkpoint(trainer: Trainer, epoch: int) -> None:
    """``checkpoint.pt``: everything a resumed run needs to continue bit for bit."""
    if not trainer.dist.is_main:
        return
    atomic.torch_save({
        "epoch": epoch,
        "world_size": trainer.dist.world_size,
        "global_step": trainer.global_step,
        "fingerprint": trainer.config.fingerprint(),
        "data_hash": trainer.data.content_hash,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "method": trainer.method.state_dict(),
        "callbacks": {cb.name: cb.state_dict() for cb in trainer.callbacks},
        "reused_weights": trainer.reused_weights,
        "best_state": trainer.best_state,
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "rng": capture_rng_state(),
        "history": trainer.history,
    }, trainer.out_dir / "checkpoint.pt")

def load_checkpoint(trainer: Trainer) -> int:
    """Restore the trainer from ``checkpoint.pt`` (same configuration and data required); returns its epoch."""
    path = trainer.out_dir / "checkpoint.pt"
    try:
        ckpt = trainer.dist.load(path, trainer.device)
    except Exception as exc:
        raise DataError(f"checkpoint {path} is corrupt ({type(exc).__name__}); delete it to start over") from None
    trainer.dist.check_checkpoint(ckpt, path)
    if ckpt.get("fingerprint") != trainer.config.fingerprint():
        raise InvalidParameterError(
            f"checkpoint {path} was written with a different configuration; use the same options "
            "to resume or another --out directory")
    if ckpt.get("data_hash") != trainer.data.content_hash:
        raise DataError(f"checkpoint {path} was trained on other data (hash {ckpt.get('data_hash')}); "
                        "resume with the same prepared data")
    trainer.model.load_state_dict(ckpt["model"])
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    trainer.method.load_state_dict(ckpt["method"])
    for cb in trainer.callbacks:
        cb.load_state_dict(ckpt.get("callbacks", {}).get(cb.name, {}))
    trainer.reused_weights = ckpt.get("reused_weights")
    trainer.best_state = ckpt.get("best_state")
    if trainer.scheduler is not None and ckpt.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(ckpt["scheduler"])
    restore_rng_state(ckpt["rng"])
    trainer.history = list(ckpt["history"])
    trainer.global_step = int(ckpt["global_step"])
    return int(ckpt["epoch"])

def save_model(trainer: Trainer) -> None:
    """``model.pt``: the final weights with what rebuilds the model without data (rank 0 writes)."""
    if not trainer.dist.is_main:
        return
    atomic.torch_save({"state_dict": trainer.model.state_dict(), "benchmark": trainer.bench.name,
                       "benchmark_config": trainer.bench.config, "tasks": [t.name for t in trainer.tasks],
                       "method": trainer.config.method, "data_hash": trainer.data.content_hash,
                       "architecture": architectures.architecture_spec(trainer.model)},
                      trainer.out_dir / "model.pt")


def load_model(model_path: str | Path, device: str = "cpu"):
    """Rebuild the benchmark model of a ``model.pt`` (returns ``(bench, model, blob)``)."""
    from mtlflow import benchmarks

    path = Path(model_path)
    if not path.is_file():
        raise DataError(f"model file not found: expected {path}; train a run first")
    try:
        blob = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:
        raise DataError(f"model file {path} is corrupt ({type(exc).__name__}); retrain the run") from None
    bench = benchmarks.build(blob["benchmark"], **blob["benchmark_config"])
    model = architectures.rebuild_model(bench, blob["tasks"], blob.get("architecture"))
    model.load_state_dict(blob["state_dict"])
    return bench, model.to(device), blob
