"""Table 3.2 of Ye's thesis (Section 3.7.1): multi-task data hyper-cleaning with MOML, MoCo and FORUM
against no cleaning, mean ± std over seeds (``mtlflow hypercleaning``). The benchmark itself is
:mod:`mtlflow.benchmarks.hypercleaning`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mtlflow import jobs
from mtlflow import methods as methods_registry
from mtlflow.benchmarks.base import load_tensor_file
from mtlflow.benchmarks.hypercleaning import HyperCleaning
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import resolved_hparams
from mtlflow.jobs.cache import cached_data_dir

#: rows of Table 3.2 (and the no-cleaning reference): label -> (method, hyper-parameters)
TABLE_METHODS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "moml": ("MOML", "moml", {}),
    "moco": ("MoCo", "moml", {"upper_solver": "moco"}),
    "forum": ("FORUM", "forum", {}),
    "ls": ("no cleaning (LS)", "ls", {}),
}


def sample_weight_separation(run_dir: str | Path, data_dir: str | Path,
                             tasks: Sequence[str]) -> dict[str, dict[str, float]] | None:
    """Mean learned weight σ(α) of the clean and of the corrupted training samples of each task, from the
    run's last checkpoint (None for a method without per-sample weights)."""
    ckpt = torch.load(Path(run_dir) / "checkpoint.pt", map_location="cpu", weights_only=False)
    bilevel = ckpt["method"].get("bilevel") if isinstance(ckpt.get("method"), dict) else None
    variable = None if bilevel is None else bilevel["variable"]
    if variable is None or variable.ndim != 2:
        return None
    corrupted = load_tensor_file(Path(data_dir) / "train.pt", "hypercleaning train split",
                                 "re-run `mtlflow prepare --benchmark hypercleaning`")["corrupted"]
    weights = torch.sigmoid(variable.double())
    return {task: {"clean": float(weights[i][~corrupted[:, i]].mean()),
                   "corrupted": float(weights[i][corrupted[:, i]].mean())} for i, task in enumerate(tasks)}


def table_hparams(methods: Sequence[str], hparams: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The hyper-parameters of every table row, validated (before any data is prepared or run trained)."""
    unknown = sorted(set(methods) - set(TABLE_METHODS))
    if unknown or not methods:
        raise InvalidParameterError(f"unknown hyper-cleaning method(s) {', '.join(unknown) or '(none given)'}; "
                                    f"valid: {', '.join(TABLE_METHODS)}")
    stray = sorted(set(hparams or {}) - {k for k in methods if TABLE_METHODS[k][1] != "ls"})
    if stray:
        raise InvalidParameterError(f"hyper-parameters given for {', '.join(stray)}, which is not a bi-level row of "
                                    f"the table ({', '.join(methods)})")
    defaults = HyperCleaning()
    rows = {}
    for key in methods:
        _, method, fixed = TABLE_METHODS[key]
        rows[key] = {**fixed, **(hparams or {}).get(key, {})}
        methods_registry.build(method, len(defaults.tasks), **resolved_hparams(defaults, method, rows[key]))
    return rows


def hypercleaning_table(out_dir: str | Path, data_dir: str | Path | None = None,
                        data_options: Mapping[str, Any] | None = None,
                        methods: Sequence[str] = ("moml", "moco", "forum", "ls"), seeds: Sequence[int] = (0, 1, 2),
                        epochs: int | None = None, hparams: dict[str, dict[str, Any]] | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """:func:`run_table` on prepared data (``data_dir``) or on hyper-cleaning data prepared into the cache
    with ``data_options``; the rows' hyper-parameters are checked before any data is prepared."""
    table_hparams(methods, hparams)
    data = Path(data_dir) if data_dir else cached_data_dir("hypercleaning", dict(data_options or {}))
    return run_table(data, out_dir, methods=methods, seeds=seeds, epochs=epochs, hparams=hparams, progress=progress)


def run_table(data_dir: str | Path, out_dir: str | Path, methods: Sequence[str] = ("moml", "moco", "forum", "ls"),
              seeds: Sequence[int] = (0, 1, 2), epochs: int | None = None,
              hparams: dict[str, dict[str, Any]] | None = None, progress: bool = True) -> dict[str, Any]:
    """Train every method of Table 3.2 with every seed on prepared hyper-cleaning data; write the table.

    ``hparams[row]`` (row: moml, moco, forum) override that row's hyper-parameters (e.g. ``inner_steps``
    for a CPU-sized run); all of them are validated before anything trains. Completed runs under
    ``out_dir/runs`` are reused, interrupted ones resumed. Writes ``table.md`` and ``table.json`` (mean ±
    std over seeds of the test accuracy and macro-F1 in %).
    """
    bench, data = jobs.load_prepared(data_dir)
    if bench.name != "hypercleaning":
        raise InvalidParameterError(f"{data_dir} holds {bench.name!r} data; prepare it with "
                                    "`mtlflow prepare --benchmark hypercleaning`")
    row_hparams = table_hparams(methods, hparams)
    out_dir = Path(out_dir)
    rows = []
    for key in methods:
        label, method, _ = TABLE_METHODS[key]
        hp = row_hparams[key]
        results, separations, step_seconds = [], [], []
        for seed in seeds:
            run = out_dir / "runs" / f"{key}-s{seed}"
            done = (run / "run.json").is_file() and atomic.read_json(run / "run.json").get("status") == "completed"
            if not done:
                jobs.train(data_dir, run, method=method, seed=seed, hparams=hp, epochs=epochs, progress=progress,
                           resume=True)
            metrics = atomic.read_json(run / "metrics.json", "run metrics")
            results.append(metrics["final"]["test"])
            step_seconds.append(statistics.median(e["step_seconds_median"] for e in metrics["epochs"]))
            separation = sample_weight_separation(run, data_dir, bench.task_names)
            if separation is not None:
                separations.append(separation)
        cells = {}
        for task in bench.task_names:
            for metric in ("acc", "f1"):
                values = [100.0 * r[task][metric] for r in results]
                cells[f"{task} {metric}"] = {"mean": statistics.fmean(values),
                                             "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        row = {"method": label, "key": key, "hparams": hp, "seeds": list(seeds), "metrics": cells,
               "step_seconds": statistics.fmean(step_seconds),
               "iterations": sum(e["steps"] for e in metrics["epochs"])}
        if separations:
            row["weights"] = {kind: statistics.fmean(s[t][kind] for s in separations for t in s)
                              for kind in ("clean", "corrupted")}
        rows.append(row)
    table = {"benchmark": "hypercleaning", "data": str(data_dir), "data_hash": data.content_hash,
             "config": bench.config, "tasks": bench.task_names, "rows": rows,
             "thesis_table_3_2": {"MOML": [88.64, 88.61, 80.64, 80.60], "MoCo": [88.05, 88.03, 80.94, 80.67],
                                  "FORUM": [90.81, 90.81, 82.07, 81.72],
                                  "columns": ["MNIST acc", "MNIST f1", "FMNIST acc", "FMNIST f1"]}}
    atomic.write_json(out_dir / "table.json", table)
    atomic.write_text(out_dir / "table.md", table_markdown(table))
    return table


def table_markdown(table: dict[str, Any]) -> str:
    """Table 3.2's shape: methods × (accuracy, F1) per dataset, mean ± std over seeds, in %."""
    columns = [f"{t} {m}" for t in table["tasks"] for m in ("acc", "f1")]
    header = ["method", *[c.replace(" acc", " Acc").replace(" f1", " F1") for c in columns],
              "UL iterations", "s/iteration", "σ(α) clean / corrupted"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table["rows"]:
        cells = [f"{row['metrics'][c]['mean']:.2f}±{row['metrics'][c]['std']:.2f}" for c in columns]
        weights = row.get("weights")
        sep = f"{weights['clean']:.3f} / {weights['corrupted']:.3f}" if weights else "-"
        lines.append("| " + " | ".join([row["method"], *cells, str(row["iterations"]), f"{row['step_seconds']:.3f}",
                                         sep]) + " |")
    ref = table["thesis_table_3_2"]
    lines += ["", f"Thesis Table 3.2 ({', '.join(ref['columns'])}; MNIST + FashionMNIST, 5000 training images, "
                  "K = 1200, T = 64):", ""]
    lines += [f"- {name}: " + ", ".join(f"{v:.2f}" for v in ref[name]) for name in ("MOML", "MoCo", "FORUM")]
    return "\n".join(lines) + "\n"
