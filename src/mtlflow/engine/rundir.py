"""A run directory's files as one unit: ``run.json`` describes the run, ``metrics.json`` and ``model.pt``
must be that run's results, ``checkpoint.pt`` resumes it. The trainer writes them through this module
(the one place their formats are defined), from a :class:`RunRecord` of the run and its progress passed
explicitly, and every reader (evaluate, aggregate, reports) reads them here.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import mtlflow
from mtlflow import benchmarks
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError, StorageError
from mtlflow.models import architectures

if TYPE_CHECKING:  # annotations only: the run-directory readers stay light to import
    from mtlflow.config.run import RunConfig
    from mtlflow.engine.distributed import Distributed
    from mtlflow.metrics.task import TaskSpec


def check_run_consistent(run_dir: Path, require_completed: bool = True) -> None:
    """Refuse a run directory whose ``metrics.json`` or ``model.pt`` is not the result of the run
    ``run.json`` describes (an unfinished run, or files of two runs mixed by hand)."""
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

@dataclass(frozen=True)
class RunRecord:
    """What a run directory's files say of the run besides its progress; the trainer fills one when it is
    built, and the writers here read it (never the trainer)."""

    out_dir: Path
    #: the process topology: rank 0 writes (``is_main``); ``run.json`` describes it; checkpoints load through it
    dist: Distributed
    config: RunConfig
    benchmark: str
    benchmark_config: dict[str, Any]
    dataset: str
    #: the benchmark's number of tasks (a run of one of several tasks is a single-task run)
    benchmark_tasks: int
    tasks: tuple[TaskSpec, ...]
    data_hash: str
    #: the budget fitted to the training rows (``mtlflow.engine.trainer.fit_budget``)
    budget: dict[str, Any]

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]


@dataclass
class Checkpoint:
    """The training state in ``checkpoint.pt``: everything a resumed run needs to continue bit for bit."""

    epoch: int
    global_step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    method: dict[str, Any]
    #: each callback's state by its name
    callbacks: dict[str, dict[str, Any]]
    #: the last solved weights of an amortised Gramian-weighting method
    reused_weights: torch.Tensor | None
    #: the weights of the best validation epoch so far (select best-val), on the CPU
    best_state: dict[str, torch.Tensor] | None
    scheduler: dict[str, Any] | None
    rng: dict[str, Any]
    history: list[dict[str, Any]]


def write_metrics(record: RunRecord, history: list[dict[str, Any]], outcome: dict[str, Any] | None = None,
                  final: dict[str, Any] | None = None) -> None:
    """``metrics.json``: every epoch's metrics so far and, at the end, how training ended (``outcome``) and
    the selected final ones (rank 0 writes)."""
    if not record.dist.is_main:  # every rank holds the same history; rank 0 writes it
        return
    payload = {
        "schema": 1,
        "benchmark": record.benchmark,
        "method": record.config.method,
        "seed": record.config.seed,
        "tasks": record.task_names,
        "primary_metrics": {t.name: t.primary for t in record.tasks},
        "hv_reference": {t.name: t.hv_reference for t in record.tasks},
        "metric_specs": {t.name: t.metric_specs() for t in record.tasks},
        "data_hash": record.data_hash,
        "selection": {"rule": record.config.selection,
                      "split_used_for_selection": "val" if record.config.selection == "best-val" else None,
                      "note": "final = last epoch, mean of the last K epochs, or the epoch of the best validation "
                              "score (val_score); test never selects"},
        "budget": record.budget,
        "epochs": history,
    }
    if final is not None:
        payload["final"] = final
    if outcome is not None:
        payload["training"] = outcome
    atomic.write_json(record.out_dir / "metrics.json", payload)

def run_info(record: RunRecord, outcome: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``run.json`` says of the run besides its status (``outcome``: how training ended, once it did)."""
    return {
        "benchmark": record.benchmark,
        "benchmark_config": record.benchmark_config,
        "dataset": record.dataset,
        "data_hash": record.data_hash,
        "kind": "single-task" if len(record.tasks) == 1 and record.benchmark_tasks > 1 else "multi-task",
        "tasks": record.task_names,
        "config": dataclasses.asdict(record.config),
        "fingerprint": record.config.fingerprint(),
        "versions": {"mtlflow": mtlflow.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "distributed": record.dist.describe(),
        # the CPU threads of torch's kernels: reductions split differently with another count
        "threads": torch.get_num_threads(),
        "budget": record.budget,
        **({"training": outcome, "converged": outcome["converged"]} if outcome else {}),
    }

def write_run_json(record: RunRecord, status: str, outcome: dict[str, Any] | None = None,
                   error: str | None = None) -> None:
    if not record.dist.is_main:
        return
    info = run_info(record, outcome)
    info["status"] = status
    if error:
        info["error"] = error
    path = record.out_dir / "run.json"
    try:
        atomic.write_json(path, info)
    except StorageError:
        if status == "running" or not path.is_file():
            raise
        atomic.rewrite_json_in_place(path, info)  # a full disk must not leave the run saying "running"

def save_checkpoint(record: RunRecord, checkpoint: Checkpoint) -> None:
    """``checkpoint.pt``: the training state with what :func:`load_checkpoint` checks it against (rank 0 writes)."""
    if not record.dist.is_main:
        return
    atomic.torch_save({
        "epoch": checkpoint.epoch,
        "world_size": record.dist.world_size,
        "global_step": checkpoint.global_step,
        "fingerprint": record.config.fingerprint(),
        "data_hash": record.data_hash,
        "model": checkpoint.model,
        "optimizer": checkpoint.optimizer,
        "method": checkpoint.method,
        "callbacks": checkpoint.callbacks,
        "reused_weights": checkpoint.reused_weights,
        "best_state": checkpoint.best_state,
        "scheduler": checkpoint.scheduler,
        "rng": checkpoint.rng,
        "history": checkpoint.history,
    }, record.out_dir / "checkpoint.pt")

def load_checkpoint(record: RunRecord, device: torch.device) -> Checkpoint:
    """``checkpoint.pt`` onto ``device``, refused unless written by this configuration, data and topology."""
    path = record.out_dir / "checkpoint.pt"
    try:
        ckpt = record.dist.load(path, device)
    except Exception as exc:
        raise DataError(f"checkpoint {path} is corrupt ({type(exc).__name__}); delete it to start over") from None
    record.dist.check_checkpoint(ckpt, path)
    if ckpt.get("fingerprint") != record.config.fingerprint():
        raise InvalidParameterError(
            f"checkpoint {path} was written with a different configuration; use the same options "
            "to resume or another --out directory")
    if ckpt.get("data_hash") != record.data_hash:
        raise DataError(f"checkpoint {path} was trained on other data (hash {ckpt.get('data_hash')}); "
                        "resume with the same prepared data")
    # callbacks, reused weights, best state and scheduler: absent from the checkpoints of older versions
    return Checkpoint(epoch=int(ckpt["epoch"]), global_step=int(ckpt["global_step"]), model=ckpt["model"],
                      optimizer=ckpt["optimizer"], method=ckpt["method"], callbacks=ckpt.get("callbacks", {}),
                      reused_weights=ckpt.get("reused_weights"), best_state=ckpt.get("best_state"),
                      scheduler=ckpt.get("scheduler"), rng=ckpt["rng"], history=list(ckpt["history"]))

def save_model(record: RunRecord, model: torch.nn.Module) -> None:
    """``model.pt``: the final weights with what rebuilds the model without data (rank 0 writes)."""
    if not record.dist.is_main:
        return
    atomic.torch_save({"state_dict": model.state_dict(), "benchmark": record.benchmark,
                       "benchmark_config": record.benchmark_config, "tasks": record.task_names,
                       "method": record.config.method, "data_hash": record.data_hash,
                       "architecture": architectures.architecture_spec(model)},
                      record.out_dir / "model.pt")


def load_model(model_path: str | Path, device: str = "cpu"):
    """Rebuild the benchmark model of a ``model.pt`` (returns ``(bench, model, blob)``)."""
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
