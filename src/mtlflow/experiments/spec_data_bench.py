"""``mtlflow bench --spec-data``: the cost of the user's-data path on a large synthetic table.

1. **Prepare**: a ``rows x columns`` CSV (numeric and categorical features, a binary and a regression
   label, 5 % of the labels missing) is prepared from its task spec in a separate process; the wall
   time and the process's peak resident memory are recorded, next to the peak of a process that only
   imports the same modules (the fixed cost of Python, torch and pyarrow).
2. **Train**: LS on the prepared table through mtlflow's trainer (its data loader, step and
   bookkeeping), against a hand-written PyTorch loop over the same tensors with the same model,
   batch size and optimizer (``torch.randperm`` batches, summed losses, Adam): samples per second of
   each and their ratio. Both take ``steps`` steps after ``warmup`` untimed ones, timed in alternating
   chunks inside one run (:class:`AlternatingClock`).

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

from mtlflow import jobs
from mtlflow.core import atomic
from mtlflow.core.callbacks import Callback, StepState, TrainerView
from mtlflow.core.errors import InvalidParameterError

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


class HandWrittenLoop:
    """A plain PyTorch loop over the same tensors: randperm batches, summed task losses, Adam. ``gather``:
    how it takes a batch's rows, ``index`` (``x[index]``, what most loops write) or ``index_select`` (what
    mtlflow's loader does, 2.5-3.5x faster on the CPU): against the second, the ratio is the trainer's own
    per-step cost alone."""

    def __init__(self, model: torch.nn.Module, inputs: torch.Tensor, targets: list[torch.Tensor], losses: list,
                 batch_size: int, lr: float, seed: int, gather: str = "index"):
        self.model, self.inputs, self.targets, self.losses = model, inputs, targets, losses
        self.gather = gather
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(seed)).split(batch_size)
        self.next_batch = 0

    def run(self, steps: int) -> float:
        """Seconds of ``steps`` steps."""
        started = time.perf_counter()
        for _ in range(steps):
            index = self.order[self.next_batch % len(self.order)]
            self.next_batch += 1
            if self.gather == "index":
                predictions = self.model(self.inputs[index])
                loss = sum(loss_fn(p, t[index])
                           for loss_fn, p, t in zip(self.losses, predictions, self.targets, strict=True))
            else:
                predictions = self.model(torch.index_select(self.inputs, 0, index))
                loss = sum(loss_fn(p, torch.index_select(t, 0, index))
                           for loss_fn, p, t in zip(self.losses, predictions, self.targets, strict=True))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return time.perf_counter() - started


class AlternatingClock(Callback):
    """Times mtlflow's loop and the hand-written ones in alternating chunks of ``chunk`` steps inside one run,
    so that both see the same state of a shared machine (a round-to-round spread of ±15 % on the 2-core
    machine otherwise hides a 5 % difference).

    After mtlflow's step ``warmup - 1`` the hand-written loop takes its ``warmup`` untimed steps; from then on,
    every ``chunk`` mtlflow steps, the time since the last mark is mtlflow's (its loader, steps and per-step
    bookkeeping: everything between the ends of two optimizer steps) and each hand-written loop runs
    ``chunk`` timed steps, outside mtlflow's time."""

    def __init__(self, hands: dict[str, HandWrittenLoop], warmup: int, chunk: int):
        self.hands, self.warmup, self.chunk = hands, warmup, chunk
        self.mark: float | None = None
        self.ours: list[float] = []
        self.theirs: dict[str, list[float]] = {name: [] for name in hands}

    def after_optimizer_step(self, trainer: TrainerView, state: StepState) -> None:
        done = state.step + 1 - self.warmup  # mtlflow's timed steps so far
        if done == 0:
            for hand in self.hands.values():
                hand.run(self.warmup)
        elif done > 0 and done % self.chunk == 0:
            self.ours.append(time.perf_counter() - self.mark)
            for name, hand in self.hands.items():
                self.theirs[name].append(hand.run(self.chunk))
        else:
            return
        self.mark = time.perf_counter()


def measure_training(data_dir: Path, run_dir: Path, batch_size: int, steps: int, warmup: int,
                     chunk: int = 25) -> dict[str, Any]:
    """Samples per second of mtlflow's LS run (``jobs.train``) and of the hand-written loop, timed in
    alternating chunks (:class:`AlternatingClock`) after ``warmup`` untimed steps of each."""
    if warmup < 1 or steps < chunk or steps % chunk:
        raise InvalidParameterError(f"--spec-data needs --warmup >= 1 and --steps a multiple of {chunk}")
    lr = 1e-3
    bench, loaded = jobs.load_prepared(data_dir)
    train = loaded.splits["train"]
    if warmup + steps > len(train) // batch_size:
        raise InvalidParameterError(f"--warmup + --steps ({warmup + steps}) exceed the {len(train) // batch_size} "
                                    f"batches of {batch_size} of the training split; lower them or add --rows")
    hands = {}
    for gather in ("index", "index_select"):
        torch.manual_seed(1)
        hands[gather] = HandWrittenLoop(bench.make_model(), train.inputs, train.targets,
                                        [t.loss for t in bench.tasks], batch_size, lr, seed=1, gather=gather)
    clock = AlternatingClock(hands, warmup, chunk)
    jobs.train(data_dir, run_dir, method="ls", epochs=1, batch_size=batch_size, lr=lr,
               max_steps_per_epoch=warmup + steps, progress=False, overwrite=True, callbacks=[clock])
    samples = chunk * batch_size
    ours = np.array(clock.ours)
    mtlflow_rate = steps * batch_size / ours.sum()
    result: dict[str, Any] = {"batch_size": batch_size, "steps": steps, "chunk": chunk,
                              "mtlflow_samples_per_second": mtlflow_rate, "mtlflow_chunk_rates": (samples / ours).tolist(),
                              "hand_written": {}}
    for gather, times in clock.theirs.items():
        theirs = np.array(times)
        hand_rate = steps * batch_size / theirs.sum()
        result["hand_written"][gather] = {
            "samples_per_second": hand_rate, "ratio": mtlflow_rate / hand_rate,
            "chunk_ratio_median": float(np.median(theirs / ours)),
            "chunk_ratio_quartiles": [float(q) for q in np.quantile(theirs / ours, [0.25, 0.75])],
            "chunk_rates": (samples / theirs).tolist()}
    return result


def run_spec_data_bench(out_dir: str | Path, rows: int = 1_000_000, columns: int = 50, batch_size: int = 256,
                        steps: int = 1000, warmup: int = 50, threads: int | None = None) -> dict[str, Any]:
    """Both measurements; ``threads``: torch's CPU threads while training (default: torch's choice)."""
    out_dir = Path(out_dir)
    previous_threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="mtlflow-spec-bench-") as scratch:
        folder = Path(scratch)
        prepare = measure_prepare(folder, rows, columns)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            training = measure_training(Path(prepare.pop("data_dir")), folder / "runs", batch_size, steps, warmup)
        finally:
            torch.set_num_threads(previous_threads)
    summary = {"threads": threads or previous_threads, "prepare": prepare, "train": training}
    atomic.write_json(out_dir / "spec_data.json", summary)
    atomic.write_text(out_dir / "spec_data.md", spec_data_markdown(summary))
    return summary


def baseline_rss() -> float:
    """Peak memory (bytes) of a process that only imports what prepare imports (its own getrusage)."""
    code = f"{IMPORTS}, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1]) * 1024.0


def hand_written_rows(hand: dict[str, Any], label: str) -> list[str]:
    low, high = hand["chunk_ratio_quartiles"]
    return [f"| training, hand-written loop ({label}) | {hand['samples_per_second']:,.0f} samples/s |",
            f"| ratio mtlflow / that loop: all steps; per chunk, median (quartiles) | {hand['ratio']:.3f}; "
            f"{hand['chunk_ratio_median']:.3f} ({low:.3f}–{high:.3f}) |"]


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
        f"| training, mtlflow (LS, batch {t['batch_size']}, {t['steps']} steps, {summary['threads']} torch threads) | "
        f"{t['mtlflow_samples_per_second']:,.0f} samples/s |",
        *[line for gather, label in (("index", "rows gathered with x[index]"),
                                     ("index_select", "rows gathered with index_select, as mtlflow's loader does"))
          for line in hand_written_rows(t["hand_written"][gather], label)],
        f"| (both loops alternate in chunks of {t['chunk']} steps; a chunk's ratio is mtlflow's rate over the "
        "hand-written loop's in the chunks around it) | |",
        "",
    ])
