"""Jobs on trained PaLoRA models (PaLoRA, Dimitriadis et al., ICLR 2025): evaluate a saved model's
preference front, merge the network of one preference (Eq. 2) into a plain model file, and report the
adapters' parameter overhead (Sec. 4.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.engine.rundir import load_model
from mtlflow.pareto.adapters import AdapterSpec, PreferenceAdapters, parameter_overhead
from mtlflow.pareto.front import evaluate_front, front_record, task_info


def load_palora_model(model_path: str | Path, device: str = "cpu") -> tuple[Any, nn.Module, PreferenceAdapters, dict]:
    """Rebuild a trained PaLoRA model with its adapters: ``(bench, model, adapters, blob)``."""
    bench, model, blob = load_model(model_path, device)
    if "palora" not in blob:
        raise InvalidParameterError(f"{model_path} is a {blob.get('method')!r} model without PaLoRA adapters; "
                                    "give the model.pt of a run trained with --method palora")
    adapters = PreferenceAdapters(model, AdapterSpec.from_dict(blob["palora"]["spec"]))
    model.load_state_dict(blob["palora"]["state_dict"])
    return bench, model.to(device), adapters, blob


def evaluate_saved_front(model_path: str | Path, dataset: Any, split: str) -> dict[str, Any]:
    """The front of a saved PaLoRA model on one split (``mtlflow evaluate``): the saved grid's points."""
    bench, model, adapters, blob = load_palora_model(model_path)
    tasks = bench.select_tasks(blob["tasks"])
    index = [bench.task_names.index(t.name) for t in tasks]
    prefs = torch.tensor(blob["palora"]["eval_preferences"], dtype=torch.float64)
    points = evaluate_front(model, adapters, bench, dataset, tasks, index, prefs)
    return front_record(prefs, {split: points}, *task_info(tasks))


def merge_saved_model(model_path: str | Path, preference: Sequence[float], out: str | Path) -> dict[str, Any]:
    """Write the plain network of ``preference`` (adapters merged, Eq. 2) as a model file that
    :func:`mtlflow.engine.rundir.load_model` and ``mtlflow evaluate`` read like any other run's model."""
    _, _, adapters, blob = load_palora_model(model_path)
    merged = {k: v for k, v in blob.items() if k != "palora"}
    merged["state_dict"] = adapters.merged_state_dict(preference)
    merged["merged_preference"] = [float(v) for v in preference]
    atomic.torch_save(merged, out)
    return {"out": str(out), "preference": merged["merged_preference"], "benchmark": blob["benchmark"],
            "tasks": blob["tasks"]}


def overhead_table(bench: Any, tasks: Sequence[str] | None, rank: int, layers: str = "trunk",
                   factorization: str = "matrix") -> dict[str, Any]:
    """PaLoRA's parameter overhead on ``bench``'s model (Sec. 4.1: mn + T·r(m+n) per layer)."""
    names = [t.name for t in bench.select_tasks(tasks)]
    if len(names) < 2:
        raise InvalidParameterError("the PaLoRA overhead needs at least 2 tasks")
    if rank < 1:
        raise InvalidParameterError(f"the adapter rank must be >= 1, got {rank}")
    report = parameter_overhead(bench.make_model(names), len(names), rank, layers, factorization)
    return {"benchmark": bench.name, "benchmark_config": bench.config, "tasks": names, **report}


def overhead_markdown(report: dict[str, Any]) -> str:
    lines = [f"PaLoRA parameter overhead on {report['benchmark']} ({len(report['tasks'])} tasks, rank "
             f"{report['rank']}, {report['factorization']} factorisation): {report['adapter_parameters']:,} adapter "
             f"parameters = "
             f"{report['overhead_percent']:.2f} % of the {report['model_parameters']:,} parameters of the "
             f"multi-task model ({report['adapted_weights_overhead_percent']:.2f} % of the adapted weights)", "",
             "| layer | type | n | m | mn | adapters |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['layer']} | {r['type']} | {r['n']} | {r['m']} | {r['base']:,} | {r['adapters']:,} |"
              for r in report["layers"]]
    return "\n".join(lines) + "\n"
