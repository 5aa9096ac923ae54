"""Shared storage and loading of molecular-graph benchmarks (QM9, QM8, Tox21).

Prepared graphs live in one ``graphs.pt`` of concatenated tensors (node features, positions, bonds,
targets, source ids, with per-molecule offsets); a split file lists the source ids of every split.
Items are built on access as ``torch_geometric.data.Data``, either on the bond graph or -- as the
Nash-MTL/FAMO QM9 transforms ``Complete()`` + ``Distance(norm=False)`` do -- on the complete graph
without self-loops with the bond one-hot (zeros between non-bonded atoms) and the interatomic
distance as edge attributes. Batches are collated by torch_geometric's DataLoader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from mtlflow.benchmarks._molgraphs import QM9_BOND_TYPES, MolGraph
from mtlflow.benchmarks.base import Benchmark, load_tensor_file, seed_worker
from mtlflow.core.errors import DataError
from mtlflow.metrics.regression import with_scale

GRAPHS_FILE = "graphs.pt"
SPLIT_FILE = "split.json"
SPLITS = ("train", "val", "test")


def pack_graphs(graphs: Sequence[MolGraph], targets: np.ndarray, ids: Sequence[int]) -> dict[str, Tensor]:
    """Concatenate graphs into flat tensors with offsets (``atom_ptr``, ``bond_ptr``)."""
    atom_counts = [len(g.x) for g in graphs]
    bond_counts = [len(g.bonds) for g in graphs]
    store = {
        "atom_ptr": torch.tensor(np.concatenate([[0], np.cumsum(atom_counts)]), dtype=torch.int64),
        "bond_ptr": torch.tensor(np.concatenate([[0], np.cumsum(bond_counts)]), dtype=torch.int64),
        "x": torch.from_numpy(np.concatenate([g.x for g in graphs])),
        "bonds": torch.from_numpy(np.concatenate([g.bonds.reshape(-1, 2) for g in graphs]).astype(np.int64)),
        "bond_attr": torch.from_numpy(np.concatenate([g.bond_attr for g in graphs])),
        "y": torch.from_numpy(np.asarray(targets, dtype=np.float64)),
        "ids": torch.tensor(list(ids), dtype=torch.int64),
    }
    if all(g.pos is not None for g in graphs):
        store["pos"] = torch.from_numpy(np.concatenate([g.pos for g in graphs]).astype(np.float32))
    return store


def random_split_ids(ids: Sequence[int], n_val: int, n_test: int, seed: int) -> dict[str, list[int]]:
    """Shuffle with ``seed``; the first ``n_test`` ids are the test split, the next ``n_val`` validation,
    the rest training (the order of Nash-MTL/FAMO's ``dataset.shuffle()`` split of QM9)."""
    order = np.random.default_rng(seed).permutation(len(ids))
    ids = np.asarray(ids)[order]
    return {"test": ids[:n_test].tolist(), "val": ids[n_test:n_test + n_val].tolist(),
            "train": ids[n_test + n_val:].tolist()}


def write_split(path: Path, split: dict[str, list[int]], seed: int | None, how: str) -> None:
    path.write_text(json.dumps({"seed": seed, "how": how, **{s: split[s] for s in SPLITS}}) + "\n")


def read_split(path: Path, fix: str) -> dict[str, list[int]]:
    if not path.is_file():
        raise DataError(f"split file missing: expected {path}; {fix}")
    try:
        blob = json.loads(path.read_text())
        return {s: [int(i) for i in blob[s]] for s in SPLITS}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise DataError(f"split file {path} is corrupt or lacks train/val/test id lists; {fix}") from None


def save_graph_data(out_dir: Path, store: dict[str, Tensor], split: dict[str, list[int]], seed: int | None,
                    how: str) -> None:
    """Write the packed graphs and the split file of a prepared graph benchmark."""
    torch.save(store, out_dir / GRAPHS_FILE)
    write_split(out_dir / SPLIT_FILE, split, seed, how)


def load_graph_data(data_dir: Path, what: str, fix: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The packed graphs of a prepared graph benchmark and the store rows of every split."""
    store = load_store(data_dir, what, fix)
    return store, rows_of(store, read_split(data_dir / SPLIT_FILE, fix), fix)


def load_store(data_dir: Path, what: str, fix: str) -> dict[str, Tensor]:
    store = load_tensor_file(data_dir / GRAPHS_FILE, f"{what} graphs", fix)
    needed = {"atom_ptr", "bond_ptr", "x", "bonds", "bond_attr", "y", "ids"}
    if not isinstance(store, dict) or not needed <= set(store):
        raise DataError(f"{what} graphs in {data_dir / GRAPHS_FILE} lack {sorted(needed - set(store or {}))}; {fix}")
    return store


def rows_of(store: dict[str, Tensor], split: dict[str, list[int]], fix: str) -> dict[str, Tensor]:
    """Row positions in ``store`` of every split's ids."""
    position = {int(i): r for r, i in enumerate(store["ids"].tolist())}
    rows = {}
    for name in SPLITS:
        missing = [i for i in split[name] if i not in position]
        if missing:
            raise DataError(f"split {name} names {len(missing)} molecule id(s) absent from the graphs "
                            f"(first: {missing[0]}); {fix}")
        rows[name] = torch.tensor([position[i] for i in split[name]], dtype=torch.int64)
    return rows


class GraphDataset(Dataset):
    """Molecules ``rows`` of a packed store as ``torch_geometric.data.Data`` with targets ``y [1, K]``.

    ``complete=True`` gives the complete directed graph without self-loops (row-major order, as
    ``Complete()``) with edge attributes ``[bond one-hot (4), distance]`` as ``Distance(norm=False)``
    appends it; otherwise the bond graph in both directions with the stored bond attributes.
    """

    def __init__(self, store: dict[str, Tensor], rows: Tensor, targets: Tensor, complete: bool):
        self.store, self.rows, self.targets, self.complete = store, rows, targets, complete
        if complete and "pos" not in store:
            raise DataError("complete graphs with distances need 3-D positions; re-run prepare")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int):
        from torch_geometric.data import Data

        s = self.store
        row = int(self.rows[idx])
        a0, a1 = int(s["atom_ptr"][row]), int(s["atom_ptr"][row + 1])
        b0, b1 = int(s["bond_ptr"][row]), int(s["bond_ptr"][row + 1])
        x = s["x"][a0:a1]
        bonds = s["bonds"][b0:b1]
        bond_attr = s["bond_attr"][b0:b1]
        y = self.targets[row].unsqueeze(0)
        if not self.complete:
            edge_index = torch.cat([bonds.T, bonds.T.flip(0)], dim=1)
            edge_attr = torch.cat([bond_attr, bond_attr], dim=0)
            return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, y=y, idx=row)
        x = x.float()
        pos = s["pos"][a0:a1]
        n = a1 - a0
        src = torch.arange(n).repeat_interleave(n)
        dst = torch.arange(n).repeat(n)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        one_hot = torch.zeros(n, n, QM9_BOND_TYPES)
        types = bond_attr.long()
        one_hot[bonds[:, 0], bonds[:, 1], types] = 1.0
        one_hot[bonds[:, 1], bonds[:, 0], types] = 1.0
        distance = (pos[dst] - pos[src]).norm(dim=-1, keepdim=True)
        edge_attr = torch.cat([one_hot[src, dst], distance], dim=1)
        return Data(x=x, pos=pos, edge_index=torch.stack([src, dst]), edge_attr=edge_attr, y=y, idx=row)


class GraphBenchmark(Benchmark):
    """A benchmark whose samples are molecular graphs (``Data``), batched by torch_geometric's loader;
    the targets of a batch are the columns of ``batch.y``."""

    def unpack(self, batch: Any) -> tuple[Any, list[Tensor]]:
        return batch, list(batch.y.unbind(dim=1))

    def make_loader(self, dataset: Dataset, batch_size: int, shuffle: bool = False,
                    generator: torch.Generator | None = None, num_workers: int = 0,
                    pin_memory: bool = False) -> DataLoader:
        from torch_geometric.loader import DataLoader as GraphDataLoader

        return GraphDataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                               num_workers=num_workers, pin_memory=pin_memory,
                               worker_init_fn=seed_worker if num_workers else None)


def training_statistics(store: dict[str, Tensor], split: dict[str, list[int]], names: Sequence[str],
                        fix: str) -> dict[str, dict[str, float]]:
    """Mean and standard deviation of every target over the training split, by target name."""
    _, mean, std = standardise(store["y"], rows_of(store, split, fix)["train"])
    return {"train_mean": dict(zip(names, mean, strict=True)), "train_std": dict(zip(names, std, strict=True))}


def standardised_targets(y: Tensor, train_rows: Tensor) -> Tensor:
    """Targets standardised with the training rows' statistics, paired with their scales so that the
    metrics report original units (:func:`mtlflow.metrics.regression.with_scale`)."""
    standard, _, std = standardise(y, train_rows)
    return with_scale(standard, torch.tensor(std))


def standardise(y: Tensor, train_rows: Tensor) -> tuple[Tensor, list[float], list[float]]:
    """``(y - mean) / std`` per column with statistics of the training rows (NaN-aware)."""
    train = y[train_rows]
    mean = torch.nanmean(train, dim=0)
    centred = torch.where(torch.isnan(train), torch.zeros_like(train), train - mean)
    counts = (~torch.isnan(train)).sum(0).clamp_min(2)
    std = (centred.pow(2).sum(0) / (counts - 1)).sqrt()
    if bool((std == 0).any()):
        raise DataError("a target is constant on the training split; it cannot be standardised")
    return ((y - mean) / std).float(), mean.tolist(), std.tolist()
