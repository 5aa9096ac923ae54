"""``mtlflow train --dry-run``: what a run would be, without training it.

Reports the resolved configuration (recipe defaults + overrides, device), the parameter counts
(total, shared trunk, heads) and a memory estimate for one training step:

* weights, gradients and optimizer state (Adam/AdamW: 2 moments; SGD: momentum), in the parameters'
  dtype;
* for gradient methods, the per-task Jacobian ``K x shared parameters`` (float32);
* activations kept for the backward pass of one batch of ``batch_size``, measured by running the
  forward pass once on real data with ``saved_tensors_hooks`` (only when prepared data is at hand;
  nothing is prepared for a dry run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtlflow import jobs, methods
from mtlflow.benchmarks.base import Benchmark
from mtlflow.config.run import RunConfig
from mtlflow.methods.base import GradientMethod


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def activation_bytes(bench: Benchmark, model: torch.nn.Module, data_dir: Path, batch_size: int) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass over one training batch."""
    _, data = jobs.load_prepared(data_dir)
    loader = bench.make_loader(data.splits["train"], batch_size, shuffle=False)
    inputs, _ = bench.unpack(next(iter(loader)))
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        if t.device.type != "meta":
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            seen[key] = t.untyped_storage().nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs)
    return sum(seen.values())


def describe_run(bench: Benchmark, config: RunConfig, hparams: Mapping[str, Any],
                 data_dir: Path | None = None) -> dict[str, Any]:
    """Everything ``--dry-run`` prints, as a dict."""
    tasks = [t.name for t in bench.select_tasks(config.tasks)]
    model = bench.make_model(tasks)
    method = methods.build(config.method, len(tasks), **dict(hparams))
    total = count_parameters(model)
    shared = sum(p.numel() for p in model.shared_parameters())
    itemsize = next(model.parameters()).element_size()
    optimizer_states = {"adam": 2, "adamw": 2, "sgd": 1}[config.optimizer]
    memory: dict[str, Any] = {
        "weights_bytes": total * itemsize,
        "gradients_bytes": total * itemsize,
        "optimizer_state_bytes": optimizer_states * total * itemsize,
        "jacobian_bytes": len(tasks) * shared * 4 if isinstance(method, GradientMethod) else 0,
    }
    if data_dir is not None and Path(data_dir).is_dir():
        memory["activations_bytes"] = activation_bytes(bench, model, Path(data_dir), config.batch_size)
        memory["activations_measured_on"] = f"one training batch of {config.batch_size} from {data_dir}"
    else:
        memory["activations_bytes"] = None
        memory["activations_measured_on"] = "not measured: no prepared data (pass --data DIR)"
    memory["total_estimate_bytes"] = sum(v for k, v in memory.items() if k.endswith("_bytes") and v)
    return {
        "benchmark": bench.name,
        "benchmark_config": bench.config,
        "tasks": tasks,
        "method": config.method,
        "method_family": method.family + (" (owns its training step)" if method.custom_step else ""),
        "hparams": dict(hparams),
        "device": str(config.resolved_device()),
        "train_config": dataclasses.asdict(config),
        "parameters": {"total": total, "shared": shared, "heads": total - shared,
                       "per_head": [count_parameters(h) for h in model.heads]},
        "memory_estimate": memory,
    }


def format_description(info: Mapping[str, Any]) -> str:
    """Human-readable summary for the terminal (the JSON follows it)."""
    mib = 1024 ** 2
    mem = info["memory_estimate"]
    lines = [f"dry run: {info['benchmark']} / {info['method']} ({info['method_family']}) on {info['device']}, "
             f"{len(info['tasks'])} task(s)",
             f"parameters: {info['parameters']['total']:,} total, {info['parameters']['shared']:,} shared, "
             f"{info['parameters']['heads']:,} in heads"]
    for key, value in mem.items():
        if key.endswith("_bytes"):
            lines.append(f"  {key[:-6]:<16} " + ("not measured" if value is None else f"{value / mib:10.1f} MiB"))
    lines.append(f"  activations: {mem['activations_measured_on']}")
    return "\n".join(lines)
