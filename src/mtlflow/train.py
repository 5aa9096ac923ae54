"""The training engine shared by every method.

One step: forward through the shared trunk and the heads, K task losses, then by method family

* loss weighting: back-propagate ``method.objective(losses)``;
* gradient methods: per-task gradients w.r.t. the shared parameters (K-loop engine; heads get their
  plain gradients in the same autograd calls), ``direction = method.combine(grads, losses)``,
  written into the shared parameters' ``.grad``;

then, identically for every method and in this order: global rescaling (x K for methods whose
direction is a convex combination, see ``Method.natural_scale``), gradient clipping (after the
backward pass, on all parameters, when ``clip_grad_norm`` is set), ``optimizer.step()`` and the
method's ``after_optimizer_step`` hook.

After every epoch the trainer evaluates the val and test splits, writes ``metrics.json`` and a
checkpoint (model, optimizer, method state, RNG states) atomically; ``resume=True`` continues from
the last checkpoint and reaches the same final metrics as an uninterrupted run (the data order of
epoch e depends only on (seed, e)).

Run directory layout (the contract with ``evaluate``, ``aggregate`` and the pipeline components):

* ``run.json``     -- configuration, status (running/completed/failed), data hash, versions;
* ``metrics.json`` -- per-epoch metrics per split and task, timing and memory, the selection rule and
  the selected ``final`` metrics;
* ``checkpoint.pt`` -- the last completed epoch (for ``--resume``);
* ``model.pt``     -- final weights with the benchmark name and configuration to rebuild the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader

import mtlflow
from mtlflow import atomic
from mtlflow import methods as method_registry
from mtlflow.benchmarks.base import Benchmark, BenchmarkData
from mtlflow.callbacks import Callback, StepState
from mtlflow.errors import DataError, InvalidParameterError, NonFiniteLossError
from mtlflow.evaluation import evaluate_model
from mtlflow.grad_engine import task_jacobian, write_flat_grad
from mtlflow.methods.base import GradientMethod, Method, StepContext
from mtlflow.seeding import capture_rng_state, epoch_generator, restore_rng_state, seed_everything

OPTIMIZERS = ("adam", "adamw", "sgd")
EVAL_SPLITS = ("val", "test")


@dataclass
class TrainConfig:
    """Everything that determines a training run (recorded in ``run.json``)."""

    method: str = "ls"
    hparams: dict[str, Any] = field(default_factory=dict)
    epochs: int = 10
    batch_size: int = 256
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    method_lr: float = 0.025
    clip_grad_norm: float | None = None
    rescale: bool = True
    seed: int = 0
    tasks: list[str] | None = None
    select: str = "last"
    eval_batch_size: int = 512
    max_steps_per_epoch: int | None = None
    device: str = "cpu"

    def resolved_device(self) -> torch.device:
        """``auto`` means the GPU when one is visible, else the CPU."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidParameterError(msg)

        if not isinstance(self.epochs, int) or self.epochs < 1:
            bad(f"epochs must be a positive integer, got {self.epochs!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            bad(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            bad(f"lr must be a positive finite number, got {self.lr!r}")
        if self.optimizer not in OPTIMIZERS:
            bad(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.weight_decay < 0 or not math.isfinite(self.weight_decay):
            bad(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.method_lr <= 0:
            bad(f"method_lr must be > 0, got {self.method_lr!r}")
        if self.clip_grad_norm is not None and not (self.clip_grad_norm > 0):
            bad(f"clip_grad_norm must be > 0 when set, got {self.clip_grad_norm!r}")
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch < 1:
            bad(f"max_steps_per_epoch must be >= 1 when set, got {self.max_steps_per_epoch!r}")
        _, window = parse_selection(self.select)
        if window > self.epochs:
            bad(f"selection rule {self.select!r} averages {window} epochs but the run has only {self.epochs}")
        try:
            device = self.resolved_device()
        except RuntimeError:
            bad(f"device {self.device!r} is not valid; use auto, cpu or cuda[:N]")
        if device.type == "cuda" and not torch.cuda.is_available():
            bad(f"device {self.device!r} requested but no CUDA GPU is visible; use --device auto or cpu")

    def fingerprint(self) -> str:
        """Hash of everything but ``epochs`` and ``device``: a resumed run must match it."""
        data = dataclasses.asdict(self)
        data.pop("epochs")
        data.pop("device")
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_selection(rule: str) -> tuple[str, int]:
    """``"last"`` or ``"last-k:K"`` (mean of the last K epochs)."""
    if rule == "last":
        return "last", 1
    if rule.startswith("last-k:"):
        try:
            k = int(rule.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "last-k", k
    raise InvalidParameterError(f"selection rule {rule!r} is invalid; use 'last' or 'last-k:K' with K >= 1")


def select_final(history: list[dict[str, Any]], rule: str) -> dict[str, dict[str, dict[str, float]]]:
    """Apply the selection rule to the per-epoch metrics of every evaluated split.

    The rule never looks at the test split to choose an epoch: it is either the last epoch or the
    mean over the last K epochs.
    """
    _, k = parse_selection(rule)
    window = history[-k:]
    final: dict[str, dict[str, dict[str, float]]] = {}
    for split in window[-1]["splits"]:
        final[split] = {}
        for task, values in window[-1]["splits"][split].items():
            final[split][task] = {m: statistics.fmean(e["splits"][split][task][m] for e in window) for m in values}
    return final


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since the last reset: CUDA allocator peak, or the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _cosines_to_mean(grads: Tensor) -> Tensor:
    gram = grads @ grads.T
    norms = gram.diagonal().clamp_min(0).sqrt()
    mean_dot = gram.mean(dim=1)
    mean_norm = gram.mean().clamp_min(0).sqrt()
    return mean_dot / (norms * mean_norm).clamp_min(1e-30)


class Trainer:
    """Train one method on one prepared benchmark into one run directory."""

    def __init__(self, bench: Benchmark, data: BenchmarkData, config: TrainConfig, out_dir: str | Path,
                 progress: bool = True, callbacks: Sequence[Callback] = ()):
        config.validate()
        self.bench, self.data, self.config = bench, data, config
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.tasks = bench.select_tasks(config.tasks)
        self.task_index = [bench.task_names.index(t.name) for t in self.tasks]
        self.device = config.resolved_device()
        for split in ("train", *EVAL_SPLITS):
            if split not in data.splits:
                raise DataError(f"prepared data lacks the {split!r} split; re-run `mtlflow prepare`")
        seed_everything(config.seed)
        self.model = bench.make_model([t.name for t in self.tasks]).to(self.device)
        self.method: Method = method_registry.build(config.method, len(self.tasks), **config.hparams)
        self.method.to(self.device)
        self.callbacks: list[Callback] = list(callbacks)
        self.method.setup(self)
        self.optimizer = self._build_optimizer()
        self.shared = self.model.shared_parameters()
        self.task_params = [self.model.task_parameters(i) for i in range(len(self.tasks))]
        self.history: list[dict[str, Any]] = []
        self.global_step = 0

    # -- setup ---------------------------------------------------------------------------------
    def _build_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        groups: list[dict[str, Any]] = [{"params": [p for p in self.model.parameters() if p.requires_grad]}]
        method_params = self.method.parameters()
        if method_params:
            groups.append({"params": method_params, "lr": cfg.method_lr, "weight_decay": 0.0})
        if cfg.optimizer == "adam":
            return torch.optim.Adam(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        if cfg.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)

    def _loader(self, epoch: int) -> DataLoader:
        return DataLoader(self.data.splits["train"], batch_size=self.config.batch_size, shuffle=True,
                          generator=epoch_generator(self.config.seed, epoch), drop_last=False)

    # -- one step ------------------------------------------------------------------------------
    def _losses(self, batch: Any) -> tuple[Tensor, list[Tensor]]:
        inputs, targets = self.bench.unpack(batch)
        inputs = inputs.to(self.device) if hasattr(inputs, "to") else inputs
        preds = self.model(inputs)
        losses = [task.loss(pred, targets[idx].to(self.device))
                  for task, pred, idx in zip(self.tasks, preds, self.task_index)]
        return torch.stack(losses), losses

    def _check_finite(self, losses: Tensor, epoch: int) -> None:
        if not torch.isfinite(losses).all():
            bad = [f"{t.name}={float(v)}" for t, v in zip(self.tasks, losses.detach()) if not math.isfinite(float(v))]
            raise NonFiniteLossError(
                f"non-finite loss ({', '.join(bad)}) at epoch {epoch}, step {self.global_step}; "
                f"lower --lr, set --clip-grad-norm, or check the data")

    def forward_losses(self, batch: Any) -> tuple[Tensor, list[Tensor]]:
        """Per-task losses of ``batch`` as a stacked tensor and as the list of separate graph nodes."""
        return self._losses(batch)

    def train_step(self, batch: Any, epoch: int) -> dict[str, Any]:
        """One optimisation step on ``batch``; returns step telemetry (at least ``losses``)."""
        self.model.train()
        if self.method.custom_step:
            info = self.method.training_step(self, batch, epoch)
            self.global_step += 1
            return info
        need_jacobian = isinstance(self.method, GradientMethod) or any(cb.needs_jacobian for cb in self.callbacks)
        # A callback may change the parameters (a teleport) and ask for the step to be redone there.
        for attempt in (0, 1):
            self.optimizer.zero_grad(set_to_none=True)
            stacked, losses = self._losses(batch)
            self._check_finite(stacked, epoch)
            grads = None
            if need_jacobian:
                gradient_method = isinstance(self.method, GradientMethod)
                # heads get their plain gradients inside the loop only for gradient methods; a loss
                # weighting method back-propagates its objective afterwards, so the graph is kept.
                grads = task_jacobian(losses, self.shared, self.task_params if gradient_method else None,
                                      retain_graph=not gradient_method)
            state = StepState(epoch=epoch, step=self.global_step, batch=batch, losses=stacked.detach(), grads=grads)
            if attempt == 0 and any([cb.after_gradients(self, state) for cb in self.callbacks]):
                continue
            break

        def recompute() -> Tensor:
            with torch.no_grad():
                return self._losses(batch)[0]

        ctx = StepContext(step=self.global_step, epoch=epoch, losses=stacked.detach(), recompute_losses=recompute)
        self.method.before_backward(ctx)
        info: dict[str, Any] = {"losses": stacked.detach()}
        k = len(self.tasks)
        if isinstance(self.method, GradientMethod):
            t0 = time.perf_counter()
            direction = self.method.combine(grads, stacked.detach())
            info["solver_seconds"] = time.perf_counter() - t0
            if not torch.isfinite(direction).all():
                raise NonFiniteLossError(f"{self.method.name} produced a non-finite update at step "
                                         f"{self.global_step}; check the losses or lower --lr")
            if self.config.rescale and self.method.natural_scale == "mean":
                direction = direction * k
            write_flat_grad(self.shared, direction)
            state.direction = direction
        else:
            self.method.objective(stacked).backward()
        if grads is not None and k > 1:
            info["cosines"] = _cosines_to_mean(grads)
        if self.config.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad_norm)
        for cb in self.callbacks:
            cb.before_optimizer_step(self, state)
        self.optimizer.step()
        self.method.after_optimizer_step(ctx)
        for cb in self.callbacks:
            cb.after_optimizer_step(self, state)
        self.global_step += 1
        if self.method.last_weights is not None:
            info["weights"] = self.method.last_weights.detach().to("cpu", torch.float64)
        info.update(state.info)
        return info

    # -- epochs --------------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> dict[str, Any]:
        start_epoch = 1
        if resume and (self.out_dir / "checkpoint.pt").is_file():
            start_epoch = self._load_checkpoint() + 1
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._write_run_json("running")
        for cb in self.callbacks:
            cb.on_train_start(self)
        bar = self._progress_bar(start_epoch)
        try:
            for epoch in range(start_epoch, self.config.epochs + 1):
                self._run_epoch(epoch, bar)
        except BaseException as exc:
            self._write_run_json("failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if bar is not None:
                bar.close()
        result = self._finish()
        self._write_run_json("completed")
        for cb in self.callbacks:
            cb.on_train_end(self, result)
        return result

    def _steps_per_epoch(self) -> int:
        n = math.ceil(len(self.data.splits["train"]) / self.config.batch_size)
        return min(n, self.config.max_steps_per_epoch or n)

    def _progress_bar(self, start_epoch: int):
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        steps = self._steps_per_epoch()
        return tqdm(total=steps * self.config.epochs, initial=steps * (start_epoch - 1), unit="step",
                    desc=f"{self.bench.name}/{self.config.method}", dynamic_ncols=True, mininterval=1.0)

    def _run_epoch(self, epoch: int, bar) -> None:
        started = time.perf_counter()
        step_times: list[float] = []
        solver_times: list[float] = []
        loss_sums = torch.zeros(len(self.tasks), dtype=torch.float64)
        weight_sums: Tensor | None = None
        cos_sum = torch.zeros(len(self.tasks), dtype=torch.float64)
        conflict_steps = cos_steps = 0
        _reset_peak_memory(self.device)
        for cb in self.callbacks:
            cb.on_epoch_start(self, epoch)
        limit = self._steps_per_epoch()
        n_steps = 0
        for batch in self._loader(epoch):
            if n_steps >= limit:
                break
            t0 = time.perf_counter()
            info = self.train_step(batch, epoch)
            step_times.append(time.perf_counter() - t0)
            n_steps += 1
            loss_sums += info["losses"].to("cpu", torch.float64)
            if "solver_seconds" in info:
                solver_times.append(info["solver_seconds"])
            if "weights" in info:
                weight_sums = info["weights"] if weight_sums is None else weight_sums + info["weights"]
            if "cosines" in info:
                cos = info["cosines"].to("cpu", torch.float64)
                cos_sum += cos
                cos_steps += 1
                conflict_steps += int((cos < 0).any())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{float(info['losses'].sum()):.4f}", refresh=False)
        train_seconds = time.perf_counter() - started
        splits = {split: evaluate_model(self.model, self.bench, self.data.splits[split], self.tasks,
                                        self.task_index, self.config.eval_batch_size, self.device)
                  for split in EVAL_SPLITS}
        record: dict[str, Any] = {
            "epoch": epoch,
            "splits": splits,
            "train_loss": {t.name: float(v) for t, v in zip(self.tasks, loss_sums / max(n_steps, 1))},
            "steps": n_steps,
            "train_seconds": train_seconds,
            "epoch_seconds": time.perf_counter() - started,
            "step_seconds_median": statistics.median(step_times) if step_times else 0.0,
            "samples_per_second": (n_steps * self.config.batch_size) / max(train_seconds, 1e-9),
            "peak_memory_bytes": _peak_memory_bytes(self.device),
        }
        if solver_times:
            record["solver_seconds_median"] = statistics.median(solver_times)
        if weight_sums is not None:
            record["method_weights_mean"] = {t.name: float(v) for t, v in zip(self.tasks, weight_sums / n_steps)}
        if cos_steps:
            record["conflict_ratio"] = conflict_steps / cos_steps
            record["cosine_to_mean"] = {t.name: float(v) for t, v in zip(self.tasks, cos_sum / cos_steps)}
        self.method.on_epoch_end(epoch)
        for cb in self.callbacks:
            cb.on_epoch_end(self, record)
        self.history.append(record)
        self._write_metrics()
        self._save_checkpoint(epoch)

    # -- outputs -------------------------------------------------------------------------------
    def _metric_specs(self) -> dict[str, dict[str, dict[str, bool]]]:
        return {t.name: t.metric_specs() for t in self.tasks}

    def _write_metrics(self, final: dict[str, Any] | None = None) -> None:
        payload = {
            "schema": 1,
            "benchmark": self.bench.name,
            "method": self.config.method,
            "seed": self.config.seed,
            "tasks": [t.name for t in self.tasks],
            "primary_metrics": {t.name: t.primary for t in self.tasks},
            "hv_reference": {t.name: t.hv_reference for t in self.tasks},
            "metric_specs": self._metric_specs(),
            "data_hash": self.data.content_hash,
            "selection": {"rule": self.config.select, "split_used_for_selection": None,
                          "note": "final = last epoch or mean of the last K epochs; test never selects"},
            "epochs": self.history,
        }
        if final is not None:
            payload["final"] = final
        atomic.write_json(self.out_dir / "metrics.json", payload)

    def _run_info(self) -> dict[str, Any]:
        return {
            "benchmark": self.bench.name,
            "benchmark_config": self.bench.config,
            "data_hash": self.data.content_hash,
            "kind": "single-task" if len(self.tasks) == 1 and len(self.bench.tasks) > 1 else "multi-task",
            "tasks": [t.name for t in self.tasks],
            "config": dataclasses.asdict(self.config),
            "fingerprint": self.config.fingerprint(),
            "versions": {"mtlflow": mtlflow.__version__, "torch": torch.__version__,
                         "python": platform.python_version()},
        }

    def _write_run_json(self, status: str, error: str | None = None) -> None:
        info = self._run_info()
        info["status"] = status
        if error:
            info["error"] = error
        atomic.write_json(self.out_dir / "run.json", info)

    def _save_checkpoint(self, epoch: int) -> None:
        atomic.torch_save({
            "epoch": epoch,
            "global_step": self.global_step,
            "fingerprint": self.config.fingerprint(),
            "data_hash": self.data.content_hash,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "method": self.method.state_dict(),
            "callbacks": {cb.name: cb.state_dict() for cb in self.callbacks},
            "rng": capture_rng_state(),
            "history": self.history,
        }, self.out_dir / "checkpoint.pt")

    def _load_checkpoint(self) -> int:
        path = self.out_dir / "checkpoint.pt"
        try:
            ckpt = torch.load(path, map_location=self.device, weights_only=False)
        except Exception as exc:
            raise DataError(f"checkpoint {path} is corrupt ({type(exc).__name__}); delete it to start over") from None
        if ckpt.get("fingerprint") != self.config.fingerprint():
            raise InvalidParameterError(
                f"checkpoint {path} was written with a different configuration; use the same options "
                "to resume or another --out directory")
        if ckpt.get("data_hash") != self.data.content_hash:
            raise DataError(f"checkpoint {path} was trained on other data (hash {ckpt.get('data_hash')}); "
                            "resume with the same prepared data")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.method.load_state_dict(ckpt["method"])
        for cb in self.callbacks:
            cb.load_state_dict(ckpt.get("callbacks", {}).get(cb.name, {}))
        restore_rng_state(ckpt["rng"])
        self.history = list(ckpt["history"])
        self.global_step = int(ckpt["global_step"])
        return int(ckpt["epoch"])

    def _finish(self) -> dict[str, Any]:
        final = select_final(self.history, self.config.select)
        self._write_metrics(final)
        atomic.torch_save({"state_dict": self.model.state_dict(), "benchmark": self.bench.name,
                           "benchmark_config": self.bench.config, "tasks": [t.name for t in self.tasks],
                           "method": self.config.method, "data_hash": self.data.content_hash},
                          self.out_dir / "model.pt")
        return {"final": final, "epochs": len(self.history)}


def load_model(model_path: str | Path, device: str = "cpu"):
    """Rebuild the benchmark model saved by :class:`Trainer` (returns ``(bench, model, blob)``)."""
    from mtlflow import benchmarks

    path = Path(model_path)
    if not path.is_file():
        raise DataError(f"model file not found: expected {path}; train a run first")
    try:
        blob = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:
        raise DataError(f"model file {path} is corrupt ({type(exc).__name__}); retrain the run") from None
    bench = benchmarks.build(blob["benchmark"], **blob["benchmark_config"])
    model = bench.make_model(blob["tasks"])
    model.load_state_dict(blob["state_dict"])
    return bench, model.to(device), blob


def resolve_task_names(bench: Benchmark, tasks: Sequence[str] | None) -> list[str]:
    return [t.name for t in bench.select_tasks(tasks)]
