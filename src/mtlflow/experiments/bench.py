"""``mtlflow bench``: the cost of every method and of every gradient backend, measured side by side.

For each task count K, on one model and one fixed batch:

* **methods** -- every requested method runs ``warmup + steps`` real trainer steps
  (:meth:`mtlflow.engine.trainer.Trainer.train_step`, so the numbers include exactly what training pays) and
  reports the median step time, the engine time (forward + per-task gradients + writing the update),
  the method's solver time (``combine`` / ``weights_from_gramian``, averaged over all steps so that
  amortised solvers count what they cost), the peak memory, and ratios to LS measured in the same run;
* **engine** -- forward + per-task gradient information with each backend: one backward of Σ L_i
  (``single``), a plain K-loop written inline (the yardstick), the engine's backends (``loop``,
  ``batched``, ``func``, ``autojac``, the Gramian-only ``autogram``) and representation gradients.

The default model is the CelebA network of the FairGrad/FAMO/COST setup (a "9-layer CNN": 7 conv
3x3 + BatchNorm + ReLU with 3 max-pools and global average pooling, 2 fully connected layers of 512,
one Linear(512, 1) head per attribute; 64x64 inputs) with K synthetic binary tasks on random inputs
and targets -- timing does not depend on the data. ``--width`` scales the channels (64 = the full
model, ~4.7 M trunk parameters); ``--benchmark NAME`` times a registered benchmark's own model on a
batch of its prepared data instead.

Writes ``bench.json`` and ``bench.md`` (tables and the issue's targets with pass/fail). Peak memory is
the CUDA allocator's peak on a GPU; on the CPU it is the process's peak resident set size since the
method started (an upper bound: freed memory is not always returned to the OS).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from mtlflow import jobs
from mtlflow import methods as method_registry
from mtlflow.benchmarks.base import Benchmark, BenchmarkData, MultiTaskTensorDataset
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.engine.step import GradientMode
from mtlflow.engine.telemetry import peak_memory_bytes, reset_peak_memory
from mtlflow.engine.trainer import Trainer
from mtlflow.grad_engine import (
    JACOBIAN_BACKENDS,
    AutogramGramian,
    backward_heads,
    jacobian_backend,
    representation_jacobian,
    resolve_backend,
)
from mtlflow.jobs import resolved_hparams
from mtlflow.jobs.cache import cached_data_dir
from mtlflow.methods.base import GramianWeighting
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.celeba_cnn import CelebACNN
from mtlflow.teleport import validate

SYNTHETIC = "synthetic-celeba"
ENGINE_ROWS = ("single", "plain-loop", *JACOBIAN_BACKENDS, "autogram", "representation")
#: the issue's targets
O1_TARGET, SOLVER_TARGET, REPRESENTATION_TARGET = 1.05, 0.10, 1.3
#: step-time ratios to LS that a method's paper claims (LDC-MTL Sec. 5.1: "at most a 1.11x increase")
PAPER_STEP_TARGETS = {"ldcmtl": 1.11}


def _binary_loss(pred: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(pred.squeeze(-1), target)


class SyntheticCelebA(Benchmark):
    """K random binary attributes on random 64x64 images (for timing only; not registered)."""

    name = SYNTHETIC
    description = "K synthetic binary tasks on the CelebA CNN (timing only)"

    def __init__(self, n_tasks: int, width: int = 64, image_size: int = 64):
        super().__init__()
        self.n_tasks, self.width, self.image_size = n_tasks, width, image_size

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(f"attr{i:02d}", _binary_loss, (), primary="loss", hv_reference=1.0)
                for i in range(self.n_tasks)]

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = CelebACNN(width=self.width)  # the network the celeba benchmark trains, at this width
        return MultiTaskModel(trunk, [nn.Linear(trunk.out_features, 1) for _ in names], names)

    def data(self, batch_size: int, seed: int = 0) -> BenchmarkData:
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn(batch_size, 3, self.image_size, self.image_size, generator=generator)
        targets = [torch.randint(0, 2, (batch_size,), generator=generator).float() for _ in range(self.n_tasks)]
        split: Dataset = MultiTaskTensorDataset(images, targets)
        return BenchmarkData({"train": split, "val": split, "test": split}, content_hash="synthetic")


def _batch_of(dataset: Dataset, batch_size: int) -> Any:
    return next(iter(DataLoader(dataset, batch_size=batch_size, shuffle=False)))


def _setting(benchmark: str, k: int | None, width: int, image_size: int, batch_size: int):
    """(bench, data) for one column of the benchmark."""
    if benchmark == SYNTHETIC:
        bench = SyntheticCelebA(k, width, image_size)
        return bench, bench.data(batch_size)

    return jobs.load_prepared(cached_data_dir(benchmark, {}))


def _time(fn: Callable[[], Any], steps: int, warmup: int, sync: Callable[[], None]) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    return times


def _sync_for(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def _trainer(bench: Benchmark, data: BenchmarkData, method: str, device: str, grad_wrt: str = "parameters",
             batch_size: int = 32, seed: int = 0, grad_backend: str = "auto",
             hparams: Mapping[str, Any] | None = None, teleport_options: Mapping[str, Any] | None = None):
    """A real trainer for timing its steps (no run directory is written); ``teleport_options`` adds COST."""
    extra = {} if teleport_options is None else {"teleport": "cost", "teleport_options": dict(teleport_options)}
    config = RunConfig(method=method, batch_size=batch_size, device=device, seed=seed, grad_wrt=grad_wrt,
                         grad_backend=grad_backend, hparams=resolved_hparams(bench, method, hparams), **extra)
    return Trainer(bench, data, config, out_dir=Path("/nonexistent-bench-run"), progress=False)


def measure_method(bench: Benchmark, data: BenchmarkData, batch: Any, method: str, steps: int, warmup: int,
                   device: str, grad_wrt: str = "parameters", hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Median step time, engine and solver time, peak memory of ``method`` (real trainer steps)."""
    trainer = _trainer(bench, data, method, device, grad_wrt, batch_size=len(batch[0]), hparams=hparams)
    sync = _sync_for(trainer.device)
    infos: list[dict[str, Any]] = []

    def step() -> None:
        infos.append(trainer.train_step(batch, epoch=1))

    reset_peak_memory(trainer.device)
    times = _time(step, steps, warmup, sync)
    timed = infos[warmup:]
    solver = [i.get("solver_seconds", 0.0) for i in timed]
    engine = [i["engine_seconds"] for i in timed if "engine_seconds" in i]
    return {
        "step_seconds_median": statistics.median(times),
        # the mean counts the solve steps of amortised methods: time a multiple of update_weights_every
        "step_seconds_mean": statistics.fmean(times),
        "engine_seconds_median": statistics.median(engine) if engine else None,
        "solver_seconds_per_step": sum(solver) / len(solver),
        "solver_seconds_median": statistics.median(s for s in solver if s) if any(solver) else 0.0,
        "peak_memory_bytes": peak_memory_bytes(trainer.device),
        "gradient_mode": trainer.gradient_mode,
        "grad_backend": trainer.grad_backend,
    }


def measure_engine(bench: Benchmark, data: BenchmarkData, batch: Any, rows: Sequence[str], steps: int,
                   warmup: int, device: str) -> dict[str, dict[str, Any]]:
    """Forward + per-task gradient information with each backend on the same model and batch."""
    trainer = _trainer(bench, data, "ls", device, batch_size=len(batch[0]))
    trainer.model.train()
    sync = _sync_for(trainer.device)
    shared, heads = trainer.shared, trainer.task_params
    autogram = AutogramGramian(trainer.model.trunk) if "autogram" in rows else None

    def single() -> None:
        trainer.model.zero_grad(set_to_none=True)
        trainer.forward_pass(batch).stacked.sum().backward()

    def plain_loop() -> None:
        # the yardstick, as one would write it: K autograd.grad calls, each row flattened, then stacked
        trainer.model.zero_grad(set_to_none=True)
        losses = trainer.forward_pass(batch).losses
        rows = []
        for i, loss in enumerate(losses):
            grads = torch.autograd.grad(loss, [*shared, *heads[i]], retain_graph=i < len(losses) - 1)
            rows.append(torch.cat([g.reshape(-1) for g in grads[:len(shared)]]))
        torch.stack(rows)

    def backend(name: str) -> Callable[[], None]:
        engine = jacobian_backend(name)

        def run() -> None:
            trainer.model.zero_grad(set_to_none=True)
            engine.jacobian(trainer.step_problem(batch))
        return run

    def gramian() -> None:
        trainer.model.zero_grad(set_to_none=True)
        with autogram.hooked(trainer.model):
            forward = trainer.forward_pass(batch)
        autogram.gramian(forward.stacked)
        backward_heads(forward.losses, heads)

    def representation() -> None:
        trainer.model.zero_grad(set_to_none=True)
        representation_jacobian(trainer.forward_pass(batch), heads)

    runners: dict[str, Callable[[], None]] = {"single": single, "plain-loop": plain_loop, "autogram": gramian,
                                              "representation": representation}
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        fn = runners.get(row) or backend(row)
        try:
            out[row] = {"seconds_median": statistics.median(_time(fn, steps, warmup, sync)), "status": "ok"}
        except Exception as exc:  # a backend that cannot run this model is reported, not fatal
            out[row] = {"seconds_median": None, "status": f"failed: {type(exc).__name__}: {exc}"[:300]}
    loop = out.get("plain-loop", {}).get("seconds_median")
    one = out.get("single", {}).get("seconds_median")
    for row in out.values():
        t = row["seconds_median"]
        row["ratio_to_plain_loop"] = t / loop if t and loop else None
        row["ratio_to_single"] = t / one if t and one else None
    return out


def parse_task_counts(spec: str) -> list[int]:
    try:
        counts = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or any(k < 1 for k in counts):
        raise InvalidParameterError(f"--tasks must be a comma-separated list of positive integers, got {spec!r}")
    return counts


def run_bench(out_dir: str | Path, methods: Sequence[str], task_counts: Sequence[int] = (2, 10, 40),
              benchmark: str = SYNTHETIC, steps: int = 10, warmup: int = 2, batch_size: int = 32,
              width: int = 64, image_size: int = 64, device: str = "cpu",
              engine_rows: Sequence[str] = ENGINE_ROWS, grad_wrt: Sequence[str] = ("parameters",),
              threads: int | None = None, progress: bool = True,
              hparams: dict[str, dict[str, Any]] | None = None, teleport: str | None = None,
              teleport_options: dict[str, Any] | None = None, cost_epoch_steps: int | None = None,
              cost_epochs: int = 2) -> dict[str, Any]:
    """Measure every method (and the engine rows) for every K; write ``bench.json`` and ``bench.md``.
    ``hparams`` maps method names to hyper-parameters (e.g. ``{"nashmtl": {"update_weights_every": 10}}``).
    ``teleport="cost"`` adds COST's overhead per epoch over each method (:func:`add_cost_overhead`)."""
    if steps < 1 or warmup < 0:
        raise InvalidParameterError("--steps must be >= 1 and --warmup >= 0")
    if batch_size < 1 or width < 1 or image_size < 8:
        raise InvalidParameterError("--batch-size and --width must be >= 1 and --image-size >= 8")
    unknown = [r for r in engine_rows if r not in ENGINE_ROWS]
    if unknown:
        raise InvalidParameterError(f"unknown engine row(s) {', '.join(unknown)}; valid: {', '.join(ENGINE_ROWS)}")
    for mode in grad_wrt:
        if mode not in ("parameters", "representation"):
            raise InvalidParameterError(f"--grad-wrt takes parameters and/or representation, got {mode!r}")
    hparams = hparams or {}
    for name, hp in hparams.items():  # validated before anything is measured
        method_registry.build(name, 2, **hp)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    if teleport:
        validate(teleport, teleport_options)
        if cost_epoch_steps is not None and cost_epoch_steps < 1 or cost_epochs < 1:
            raise InvalidParameterError("--cost-epoch-steps and --cost-epochs must be >= 1")
    try:
        summary = _run_bench(out_dir, methods, task_counts, benchmark, steps, warmup, batch_size, width, image_size,
                             device, engine_rows, grad_wrt, progress, hparams)
        if teleport:
            add_cost_overhead(summary, out_dir, list(methods), teleport_options, cost_epoch_steps, cost_epochs,
                              hparams, progress)
        return summary
    finally:
        torch.set_num_threads(previous_threads)


def _run_bench(out_dir: str | Path, methods: Sequence[str], task_counts: Sequence[int], benchmark: str, steps: int,
               warmup: int, batch_size: int, width: int, image_size: int, device: str,
               engine_rows: Sequence[str], grad_wrt: Sequence[str], progress: bool,
               hparams: dict[str, dict[str, Any]]) -> dict[str, Any]:
    methods = ["ls", *[m for m in methods if m != "ls"]]  # LS first: every ratio is to LS of the same run
    for m in methods:
        method_registry.get(m)
    counts = list(task_counts) if benchmark == SYNTHETIC else [None]
    resolved_device = str(torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                       ("cpu" if device == "auto" else device)))
    results: list[dict[str, Any]] = []
    engine: dict[str, Any] = {}
    for k in counts:
        bench, data = _setting(benchmark, k, width, image_size, batch_size)
        batch = _batch_of(data.splits["train"], batch_size)
        n_tasks = len(bench.tasks)
        ls_time = None
        for name in methods:
            cls = method_registry.get(name)
            modes = ["parameters"]
            if "representation" in grad_wrt and issubclass(cls, GramianWeighting) and cls.name != "mgdaub":
                modes.append("representation")
            if "parameters" not in grad_wrt and len(modes) > 1:
                modes.remove("parameters")
            for mode in modes:
                row: dict[str, Any] = {"tasks": n_tasks, "method": name, "grad_wrt": mode, "family": cls.family,
                                       "cost": cls.cost, "requires": cls.requires.value,
                                       "hparams": hparams.get(name, {})}
                try:
                    row.update(measure_method(bench, data, batch, name, steps, warmup, resolved_device, mode,
                                              hparams.get(name)))
                    row["status"] = "ok"
                    if row["gradient_mode"] == GradientMode.REPRESENTATION:  # MGDA-UB always is
                        row["grad_wrt"] = "representation"
                except Exception as exc:  # reported in the table; one broken method does not stop the run
                    row["status"] = f"failed: {type(exc).__name__}: {exc}"[:300]
                if name == "ls" and row["status"] == "ok":
                    ls_time = row["step_seconds_median"]
                step_time = row.get("step_seconds_median")
                row["ratio_to_ls"] = step_time / ls_time if step_time and ls_time else None
                mean_step = row.get("step_seconds_mean")  # both means: amortised solves count once per N steps
                row["solver_fraction"] = (row["solver_seconds_per_step"] / mean_step
                                          if mean_step and row.get("solver_seconds_per_step") is not None else None)
                results.append(row)
                if progress:
                    ratio = f"{row['ratio_to_ls']:.2f}x LS" if row["ratio_to_ls"] else row["status"]
                    ms = f"{1e3 * step_time:9.1f} ms" if step_time else " " * 12
                    print(f"bench: K={n_tasks:<3} {name:<12} {row['grad_wrt']:<14} {ms}  {ratio}", flush=True)
        if engine_rows:
            engine[str(n_tasks)] = measure_engine(bench, data, batch, engine_rows, steps, warmup, resolved_device)
            if progress:
                for row_name, row in engine[str(n_tasks)].items():
                    t = row["seconds_median"]
                    print(f"bench: K={n_tasks:<3} engine {row_name:<15} "
                          f"{(f'{1e3 * t:9.1f} ms' if t else row['status'])}", flush=True)
    summary = {
        "schema": 1,
        "benchmark": benchmark,
        "setting": {"task_counts": [r for r in counts], "batch_size": batch_size, "width": width,
                    "image_size": image_size, "steps": steps, "warmup": warmup, "device": resolved_device,
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "auto_backend": resolve_backend("auto")},
        "methods": results,
        "engine": engine,
    }
    summary["targets"] = check_targets(summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "bench.json", summary)
    atomic.write_text(out / "bench.md", markdown_report(summary))
    return summary


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's four targets, evaluated at the largest K measured."""
    rows = [r for r in summary["methods"] if r["status"] == "ok"]
    if not rows:
        return []
    k_max = max(r["tasks"] for r in rows)
    at_max = [r for r in rows if r["tasks"] == k_max]
    checks: list[dict[str, Any]] = []
    for r in at_max:
        label = r["method"] if r["grad_wrt"] == "parameters" else f"{r['method']}[{r['grad_wrt']}]"
        label += _hparams_label(r["hparams"])
        if r["cost"] == "O(1)" and r["method"] != "ls":
            ratio = r["ratio_to_ls"]
            checks.append({"target": f"O(1) step <= {O1_TARGET}x LS", "method": label, "tasks": k_max,
                           "value": ratio, "pass": ratio is not None and ratio <= O1_TARGET})
        elif r["cost"].startswith("O(K)") and r["family"] != "loss-weighting":
            checks.append({"target": f"O(K) solver <= {SOLVER_TARGET:.0%} of the step", "method": label,
                           "tasks": k_max, "value": r["solver_fraction"],
                           "pass": r["solver_fraction"] is not None and r["solver_fraction"] <= SOLVER_TARGET})
        if r["method"] in PAPER_STEP_TARGETS and r["grad_wrt"] == "parameters":
            target = PAPER_STEP_TARGETS[r["method"]]
            checks.append({"target": f"paper: step <= {target}x LS", "method": label, "tasks": k_max,
                           "value": r["ratio_to_ls"],
                           "pass": r["ratio_to_ls"] is not None and r["ratio_to_ls"] <= target})
        if r["gradient_mode"] == GradientMode.REPRESENTATION:
            checks.append({"target": f"representation mode <= {REPRESENTATION_TARGET}x LS", "method": label,
                           "tasks": k_max, "value": r["ratio_to_ls"],
                           "pass": r["ratio_to_ls"] is not None and r["ratio_to_ls"] <= REPRESENTATION_TARGET})
    engine = summary["engine"].get(str(k_max), {})
    auto = summary["setting"]["auto_backend"]
    ours, plain, autojac = (engine.get(n, {}).get("seconds_median") for n in (auto, "plain-loop", "autojac"))
    if ours and plain:
        checks.append({"target": "engine (auto) <= plain K-loop", "method": auto, "tasks": k_max,
                       "value": ours / plain, "pass": ours <= plain * 1.02})  # 2 %: timer noise
    if ours and autojac:
        checks.append({"target": "engine (auto) faster than TorchJD autojac", "method": auto, "tasks": k_max,
                       "value": ours / autojac, "pass": ours < autojac})
    return checks


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value * scale, spec)


def _hparams_label(hparams: dict[str, Any]) -> str:
    return "(" + ",".join(f"{k}={v}" for k, v in sorted(hparams.items())) + ")" if hparams else ""


def markdown_report(summary: dict[str, Any]) -> str:
    s = summary["setting"]
    lines = [f"# mtlflow bench: {summary['benchmark']}", "",
             f"batch {s['batch_size']}, width {s['width']}, image {s['image_size']}, {s['steps']} timed steps "
             f"after {s['warmup']} warm-up, device {s['device']}, {s['threads']} threads, torch {s['torch']}; "
             f"auto backend = {s['auto_backend']}.", "",
             "## Methods (real trainer steps)", "",
             "| K | method | grad wrt | mode | cost | step ms | × LS | mean step ms | engine ms | solver ms/step | "
             "solver % | peak MB | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["methods"]:
        lines.append(
            f"| {r['tasks']} | {r['method']}{_hparams_label(r['hparams'])} | {r['grad_wrt']} | "
            f"{r.get('gradient_mode', '-')} | {r['cost']} | "
            f"{_fmt(r.get('step_seconds_median'), '.1f', 1e3)} | {_fmt(r.get('ratio_to_ls'), '.2f')} | "
            f"{_fmt(r.get('step_seconds_mean'), '.1f', 1e3)} | "
            f"{_fmt(r.get('engine_seconds_median'), '.1f', 1e3)} | "
            f"{_fmt(r.get('solver_seconds_per_step'), '.2f', 1e3)} | "
            f"{_fmt(r.get('solver_fraction'), '.1f', 100)} | {_fmt(r.get('peak_memory_bytes'), '.0f', 2**-20)} | "
            f"{r['status']} |")
    if summary["engine"]:
        lines += ["", "## Per-task gradient engine (forward + per-task gradients)", "",
                  "| K | backend | ms | × plain loop | × single backward | status |", "|---|---|---|---|---|---|"]
        for k, rows in summary["engine"].items():
            for name, r in rows.items():
                lines.append(f"| {k} | {name} | {_fmt(r['seconds_median'], '.1f', 1e3)} | "
                             f"{_fmt(r['ratio_to_plain_loop'], '.2f')} | {_fmt(r['ratio_to_single'], '.2f')} | "
                             f"{r['status']} |")
    if summary["targets"]:
        lines += ["", "## Targets (largest K)", "", "| target | method | K | value | pass |", "|---|---|---|---|---|"]
        for t in summary["targets"]:
            lines.append(f"| {t['target']} | {t['method']} | {t['tasks']} | {_fmt(t['value'], '.3f')} | "
                         f"{'yes' if t['pass'] else 'NO'} |")
    return "\n".join(lines) + "\n"


# -- COST's overhead per epoch (``mtlflow bench --teleport cost``) ---------------------------------

#: the issue's target for the default budget
OVERHEAD_TARGET = 0.15


def _epoch(trainer, batch: Any, epoch: int, steps: int, sync) -> float:
    for cb in trainer.callbacks:
        cb.on_epoch_start(trainer, epoch)
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(batch, epoch)
    sync()
    return time.perf_counter() - started


def measure_cost_overhead(bench: Benchmark, data: BenchmarkData, batch: Any, method: str, epoch_steps: int,
                          epochs: int = 2, device: str = "cpu", hparams: Mapping[str, Any] | None = None,
                          teleport_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Median epoch seconds of ``method`` and ``method`` + COST, the overhead and the teleport telemetry."""
    options = {"trigger": "always", **dict(teleport_options or {})}
    batch_size = len(batch[0]) if hasattr(batch[0], "__len__") else 1
    base = _trainer(bench, data, method, device, batch_size=batch_size, hparams=hparams)
    cost = _trainer(bench, data, method, device, batch_size=batch_size, hparams=hparams, teleport_options=options)
    for trainer in (base, cost):
        for cb in trainer.callbacks:
            cb.on_train_start(trainer)
    sync = _sync_for(base.device)
    times: dict[str, list[float]] = {"base": [], "cost": []}
    for epoch in range(1, epochs + 2):  # epoch 1: warm-up
        for name, trainer in (("base", base), ("cost", cost)):
            seconds = _epoch(trainer, batch, epoch, epoch_steps, sync)
            if epoch > 1:
                times[name].append(seconds)
    wrapper = cost.callbacks[-1]
    events = wrapper._events  # the last epoch's teleports
    base_epoch, cost_epoch = statistics.median(times["base"]), statistics.median(times["cost"])
    resolved = wrapper.resolved
    # what COST adds, accounted from its parts (robust to load drift between epochs): the teleports, the
    # redone steps (one base step each) and the trigger checks; for loss-weighting bases the per-task
    # gradients of the checked steps are inside the step and only the wall-clock ratio counts them
    added = sum(e["seconds"] for e in events) + len(events) * base_epoch / epoch_steps + wrapper._check_seconds
    return {
        "method": method, "tasks": len(base.tasks), "epoch_steps": epoch_steps, "timed_epochs": epochs,
        "base_epoch_seconds": base_epoch, "cost_epoch_seconds": cost_epoch,
        "overhead": cost_epoch / base_epoch - 1.0,
        "accounted_overhead": added / base_epoch,
        "check_seconds": wrapper._check_seconds,
        "base_step_seconds": base_epoch / epoch_steps,
        "teleports_per_epoch": len(events),
        "teleport_seconds": statistics.fmean(e["seconds"] for e in events) if events else None,
        "budget": {"steps": resolved.steps, "batch_size": resolved.batch_size,
                   "perturbations": resolved.perturbations, "max_per_epoch": resolved.max_per_epoch,
                   "check_every": resolved.check_every, "trigger": resolved.trigger},
        "base_gradient_mode": base.gradient_mode,
        "pass": cost_epoch / base_epoch - 1.0 <= OVERHEAD_TARGET,
    }


def overhead_markdown(rows: list[dict[str, Any]]) -> str:
    budgets = {json.dumps(r["budget"], sort_keys=True) for r in rows if "budget" in r}
    lines = ["## COST overhead per epoch (`--teleport cost`)", "",
             f"COST budget {', '.join(sorted(budgets)) or '-'}; an epoch = the steps shown; base and COST epochs "
             "alternate, the first of each is a warm-up.",
             "", "| K | base method | steps/epoch | base epoch s | + COST epoch s | overhead (wall clock) | "
             f"overhead (accounted) | teleports/epoch | s/teleport | ≤ {OVERHEAD_TARGET:.0%} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tasks']} | {r['method']} | – | – | – | – | – | – | – | {r['error']} |")
            continue
        tele = "–" if r["teleport_seconds"] is None else f"{r['teleport_seconds']:.2f}"
        lines.append(f"| {r['tasks']} | {r['method']} ({r['base_gradient_mode']}) | {r['epoch_steps']} | "
                     f"{r['base_epoch_seconds']:.2f} | {r['cost_epoch_seconds']:.2f} | {100 * r['overhead']:.1f} % | "
                     f"{100 * r['accounted_overhead']:.1f} % | {r['teleports_per_epoch']} | {tele} | "
                     f"{'yes' if r['pass'] else 'NO'} |")
    return "\n".join(lines) + "\n"


#: steps of a timing "epoch" on the synthetic CelebA model (MultiMNIST's 10,000 images at batch 256)
SYNTHETIC_EPOCH_STEPS = 40


def add_cost_overhead(summary: dict[str, Any], out_dir, methods: list[str], teleport_options: Mapping[str, Any] | None,
                      epoch_steps: int | None, epochs: int, hparams: Mapping[str, Mapping[str, Any]],
                      progress: bool = True) -> list[dict[str, Any]]:
    """``mtlflow bench --teleport cost``: COST's overhead rows for every method and task count of
    ``summary``; adds them (and their target checks) to ``bench.json`` and ``bench.md``."""
    s = summary["setting"]
    rows = []
    for k in s["task_counts"]:
        bench, data = _setting(summary["benchmark"], k, s["width"], s["image_size"], s["batch_size"])
        batch = _batch_of(data.splits["train"], s["batch_size"])
        steps = epoch_steps or (SYNTHETIC_EPOCH_STEPS if summary["benchmark"] == SYNTHETIC
                                else math.ceil(len(data.splits["train"]) / s["batch_size"]))
        for method in methods:
            try:
                row = measure_cost_overhead(bench, data, batch, method, steps, epochs, s["device"],
                                            hparams.get(method), teleport_options)
            except Exception as exc:  # reported in the table, like the other bench rows
                row = {"method": method, "tasks": len(bench.tasks), "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            if progress and "error" not in row:
                print(f"bench: K={row['tasks']:<3} {method}+cost  epoch {row['base_epoch_seconds']:.2f} s -> "
                      f"{row['cost_epoch_seconds']:.2f} s ({100 * row['overhead']:+.1f} %)", flush=True)
    summary["cost_overhead"] = rows
    summary["targets"] += [{"target": f"COST overhead per epoch <= {OVERHEAD_TARGET:.0%}", "method": r["method"],
                            "tasks": r["tasks"], "value": r["overhead"], "pass": r["pass"]}
                           for r in rows if "error" not in r]
    out = Path(out_dir)
    atomic.write_json(out / "bench.json", summary)
    atomic.write_text(out / "bench.md", markdown_report(summary) + "\n" + overhead_markdown(rows))
    return rows
