"""The image-folder source of a spec: a label table whose ``source.image_column`` names each row's image,
relative to the ``source.images`` folder.

Preparing decodes every image once (PIL, RGB, resized to ``features.image.size`` with torchvision) into
one ``uint8 [N, 3, S, S]`` array, ``images.npy``, written row by row into a memory-mapped file, so the
prepared data is content-hashed like a table's features and preparation holds one image in memory at a
time. Training reads the array memory-mapped and gathers a batch with one index operation; the
augmentations (torchvision transforms v2, train split only) then run per image, and every image is
scaled to [0, 1] and normalised.

Rows whose image file is missing or unreadable are counted and skipped; above ``source.max_missing_share``
of the rows preparation fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.lib.format import open_memmap
from torch import Tensor

from mtlflow.benchmarks._spec.schema import DataSpec, ImageFeatures, location_of
from mtlflow.benchmarks._spec.tables import as_strings, column
from mtlflow.benchmarks.base import MultiTaskTensorDataset, read_resized_image
from mtlflow.core.errors import DataError

IMAGES_FILE = "images.npy"


def image_folder(spec: DataSpec) -> Path:
    folder = Path(spec.source.images)
    if not folder.is_dir():
        raise location_of(spec).error(("source", "images"), f"image folder not found: {folder}; fix the path (a "
                                                            "relative path is relative to the spec file)")
    return folder


def image_paths(spec: DataSpec, table: Any) -> list[str | None]:
    """Each row's image path relative to the image folder (None where the cell is empty)."""
    where = location_of(spec)
    key = ("source", "image_column") if spec.source.image_column else ("source", "images")
    return as_strings(column(table, spec.source.image_path_column, where, key)).tolist()


def images_digest(spec: DataSpec, table: Any) -> str:
    """SHA-256 over the image files the table names (path and content; a missing file counts as missing):
    a changed image is new data even when the table is unchanged."""
    folder = image_folder(spec)
    digest = hashlib.sha256()
    for relative in sorted({p for p in image_paths(spec, table) if p is not None}):
        path = folder / relative
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        digest.update(f"{relative}\0{content}\n".encode())
    return digest.hexdigest()


def write_images(spec: DataSpec, table: Any, out_dir: Path) -> tuple[Any, int]:
    """Decode the rows' images into ``out_dir/images.npy``; return the table of the rows kept and how many
    rows were skipped (image missing or unreadable)."""
    folder = image_folder(spec)
    paths = image_paths(spec, table)
    size = spec.features.image.size
    found = [i for i, p in enumerate(paths) if p is not None and (folder / p).is_file()]
    _check_missing(spec, paths, found)  # before decoding: a wrong folder or column fails at once
    array = open_memmap(out_dir / IMAGES_FILE, mode="w+", dtype=np.uint8, shape=(len(found), 3, size, size))
    keep = []
    for row in found:
        image = decoded(folder / paths[row], size)
        if image is not None:
            array[len(keep)] = image
            keep.append(row)
    _check_missing(spec, paths, keep)
    if len(keep) < len(found):  # unreadable files left unused rows at the end: copy the written rows over
        compact = open_memmap(out_dir / f"kept-{IMAGES_FILE}", mode="w+", dtype=np.uint8,
                              shape=(len(keep), 3, size, size))
        for start in range(0, len(keep), 1024):  # a block at a time: memory stays bounded
            compact[start:start + 1024] = array[start:min(start + 1024, len(keep))]
        compact.flush()
        del compact
        (out_dir / f"kept-{IMAGES_FILE}").replace(out_dir / IMAGES_FILE)
    else:
        array.flush()
    del array
    return table.take(keep), len(paths) - len(keep)


def _check_missing(spec: DataSpec, paths: list[str | None], kept: list[int]) -> None:
    """A SpecError when more than ``source.max_missing_share`` of the rows have no usable image."""
    skipped = len(paths) - len(kept)
    if skipped > spec.source.max_missing_share * len(paths):
        present = set(kept)
        first = next(p for i, p in enumerate(paths) if i not in present)
        raise location_of(spec).error(("source", "images"), f"{skipped} of {len(paths)} images are missing or "
                                                            f"unreadable (first: {first}; above max_missing_share "
                                                            f"{spec.source.max_missing_share:g}); fix the folder or "
                                                            f"the {spec.source.image_path_column!r} column, or raise "
                                                            "source.max_missing_share")


def decoded(path: Path, size: int) -> np.ndarray | None:
    """An image file as ``uint8 [3, size, size]`` RGB; None if it cannot be read as an image."""
    try:
        return read_resized_image(path, size).numpy()
    except DataError:
        return None


class ImageBatches(MultiTaskTensorDataset):
    """Rows of a prepared ``uint8`` image array, a whole batch gathered at a time: augmented per image
    (the train split), scaled to [0, 1] and normalised."""

    def __init__(self, images: np.ndarray, rows: Tensor, targets: Sequence[Tensor], image: ImageFeatures,
                 augment: bool):
        super().__init__(rows, [t[rows] for t in targets])
        self.images = images  # memory-mapped: only the gathered batch is read
        self.mean = torch.tensor(image.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(image.std).view(1, 3, 1, 1)
        self.transforms = [a.build() for a in image.augment] if augment else []

    def __getitem__(self, idx: int) -> tuple[Tensor, tuple[Tensor, ...]]:
        images, targets = self.__getitems__([idx])
        return images[0], tuple(t[0] for t in targets)

    def __getitems__(self, indices: Sequence[int] | Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        batch = torch.from_numpy(np.asarray(self.images[self.inputs[index].numpy()]))
        if self.transforms:
            from torchvision.transforms import v2

            augment = v2.Compose(self.transforms)
            batch = torch.stack([augment(image) for image in batch])  # own random parameters per image
        batch = (batch.float() / 255.0 - self.mean) / self.std
        return batch, tuple(t[index] for t in self.targets)
