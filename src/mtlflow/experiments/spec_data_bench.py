"""``mtlflow bench --spec-data``: the cost of the user's-data path on a large synthetic table.

1. **Prepare**: a ``rows x columns`` CSV (numeric and categorical features, a binary and a regression
   label, 5 % of the labels missing) is prepared from its task spec in a separate process; the wall
   time and the process's peak resident memory are recorded, next to the peak of a process that only
   imports the same modules (the fixed cost of Python, torch and pyarrow).
2. **Train**: LS on the prepared table through mtlflow's trainer (its data loader, step and
   bookkeeping), against a hand-written PyTorch loop over the same tensors with the same model,
   batch size and optimizer (``torch.randperm`` batches, summed losses, Adam): samples per second of
   each and their ratio. Both take ``steps`` steps after ``warmup`` untimed ones.

Writes ``spec_data.json`` and ``spec_data.md`` into the output folder.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtlflow.core import atomic

#: what the prepare process imports before it reads anything (the baseline of its peak memory)
IMPORTS = "import mtlflow.benchmarks.spec, mtlflow.jobs, pyarrow.csv"


def write_table(path: Path, rows: int, columns: int, seed: int = 0) -> None:
    """A synthetic table: ``columns - 4`` numeric features, 2 categorical ones (12 values), a binary label
    ``churned`` and a regression label ``spend`` that depend on the features; 5 % of each label missing."""
    import pyarrow as pa
    from pyarrow import csv

    rng = np.random.default_rng(seed)
    numeric = rng.standard_normal((rows, columns - 4)).astype(np.float32)
    signal = numeric[:, : min(8, columns - 4)].sum(axis=1)
    churned = (signal + rng.standard_normal(rows) > 0).astype(np.float64)
    spend = 3.0 * signal + rng.standard_normal(rows)
    churned[rng.random(rows) < 0.05] = np.nan
    spend[rng.random(rows) < 0.05] = np.nan
    categories = np.array([f"c{i}" for i in range(12)])
    data = {f"x{i}": numeric[:, i] for i in range(columns - 4)}
    data.update(region=categories[rng.integers(0, 12, rows)], plan=categories[rng.integers(0, 12, rows)],
                churned=churned, spend=spend)
    csv.write_csv(pa.table(data), str(path))


def measure_prepare(folder: Path, rows: int, columns: int) -> dict[str, Any]:
    table = folder / "table.csv"
    started = time.perf_counter()
    write_table(table, rows, columns)
    written = time.perf_counter() - started
    spec = {"name": "synthetic", "source": {"table": str(table)},
            "tasks": [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"}],
            "features": {"categorical": ["region", "plan"]}, "model": {"hidden": [256, 256]}}
    (folder / "spec.json").write_text(json.dumps(spec))
    out = folder / "data"
    prepare_code = (f"{IMPORTS}, json, time; t = time.perf_counter(); "
                    f"mtlflow.jobs.prepare('spec', {str(out)!r}, spec=json.load(open({str(folder / 'spec.json')!r}))); "
                    f"print(time.perf_counter() - t)")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", prepare_code], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    # the largest child process so far: this is the first one the bench starts
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024.0
    return {"rows": rows, "columns": columns, "csv_bytes": table.stat().st_size, "write_seconds": written,
            "prepare_seconds": float(result.stdout.strip().splitlines()[-1]), "process_seconds": wall,
            "peak_rss_bytes": peak, "baseline_rss_bytes": baseline_rss(), "data_dir": str(out)}


def hand_written_loop(model: torch.nn.Module, inputs: torch.Tensor, targets: list[torch.Tensor], losses: list,
                      batch_size: int, lr: float, steps: int, warmup: int, seed: int) -> float:
    """Samples per second of a plain PyTorch loop over the same tensors: randperm batches, summed task
    losses, Adam."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(inputs), generator=generator).split(batch_size)
    started = 0.0
    for step, index in enumerate(order[: warmup + steps]):
        if step == warmup:
            started = time.perf_counter()
        predictions = model(inputs[index])
        loss = sum(loss_fn(p, t[index]) for loss_fn, p, t in zip(losses, predictions, targets))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return steps * batch_size / (time.perf_counter() - started)


def mtlflow_seconds(data_dir: Path, run_dir: Path, batch_size: int, lr: float, steps: int) -> float:
    """The training loop's seconds (``train_seconds``: loader, steps, bookkeeping) of an LS run of ``steps``."""
    from mtlflow import jobs

    jobs.train(data_dir, run_dir, method="ls", epochs=1, batch_size=batch_size, lr=lr, max_steps_per_epoch=steps,
               progress=False, overwrite=True)
    return json.loads((run_dir / "metrics.json").read_text())["epochs"][-1]["train_seconds"]


def measure_training(data_dir: Path, run_dir: Path, batch_size: int, steps: int, warmup: int,
                     rounds: int = 5) -> dict[str, Any]:
    """Samples per second of both loops, each the median of ``rounds`` alternating measurements. mtlflow's is
    taken from the difference of a ``warmup + steps`` and a ``warmup`` run, so that what a run does once
    (the first batches, the optimizer's state) cancels as the hand-written loop's untimed warm-up does."""
    from mtlflow import jobs

    lr = 1e-3
    bench, loaded = jobs.load_prepared(data_dir)
    train = loaded.splits["train"]
    ours, hand = [], []
    for round_ in range(rounds):
        short = mtlflow_seconds(data_dir, run_dir / "short", batch_size, lr, warmup)
        long = mtlflow_seconds(data_dir, run_dir / "long", batch_size, lr, warmup + steps)
        ours.append(steps * batch_size / (long - short))
        torch.manual_seed(round_)
        hand.append(hand_written_loop(bench.make_model(), train.inputs, train.targets, [t.loss for t in bench.tasks],
                                      batch_size, lr, steps, warmup, seed=round_))
    mtlflow_rate, hand_rate = float(np.median(ours)), float(np.median(hand))
    return {"batch_size": batch_size, "steps": steps, "rounds": rounds, "mtlflow_samples_per_second": mtlflow_rate,
            "hand_written_samples_per_second": hand_rate, "ratio": mtlflow_rate / hand_rate,
            "mtlflow_rounds": ours, "hand_written_rounds": hand}


def run_spec_data_bench(out_dir: str | Path, rows: int = 1_000_000, columns: int = 50, batch_size: int = 256,
                        steps: int = 300, warmup: int = 20) -> dict[str, Any]:
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="mtlflow-spec-bench-") as scratch:
        folder = Path(scratch)
        prepare = measure_prepare(folder, rows, columns)
        training = measure_training(Path(prepare.pop("data_dir")), folder / "runs", batch_size, steps, warmup)
    summary = {"threads": torch.get_num_threads(), "prepare": prepare, "train": training}
    atomic.write_json(out_dir / "spec_data.json", summary)
    atomic.write_text(out_dir / "spec_data.md", spec_data_markdown(summary))
    return summary


def baseline_rss() -> float:
    """Peak memory (bytes) of a process that only imports what prepare imports (its own getrusage)."""
    code = f"{IMPORTS}, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1]) * 1024.0


def spec_data_markdown(summary: dict[str, Any]) -> str:
    p, t = summary["prepare"], summary["train"]
    mib = 1024.0 ** 2
    return "\n".join([
        f"# Your-data path: {p['rows']:,} rows x {p['columns']} columns",
        "",
        "| measure | value |",
        "|---|---|",
        f"| CSV size | {p['csv_bytes'] / mib:,.0f} MiB |",
        f"| prepare (read, encode, split, write, hash) | {p['prepare_seconds']:.1f} s |",
        f"| prepare process, start to exit | {p['process_seconds']:.1f} s |",
        f"| peak memory of the prepare process | {p['peak_rss_bytes'] / mib:,.0f} MiB |",
        f"| peak memory of the same imports alone | {p['baseline_rss_bytes'] / mib:,.0f} MiB |",
        f"| training, mtlflow (LS, batch {t['batch_size']}, {t['steps']} steps, median of {t['rounds']}) | "
        f"{t['mtlflow_samples_per_second']:,.0f} samples/s |",
        f"| training, hand-written loop, same tensors/model/optimizer | {t['hand_written_samples_per_second']:,.0f} "
        "samples/s |",
        f"| ratio mtlflow / hand-written | {t['ratio']:.3f} |",
        "",
    ])
