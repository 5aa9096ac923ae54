"""Shared implementation of the multi-input domain benchmarks Office-31 and Office-Home (LibMTL's setting).

One classification task per domain, each with its own images (multi-input MTL). The images are
mounted at ``--data-dir`` in the datasets' standard layouts (Office-31 ``amazon/images/<class>/*.jpg``;
Office-Home ``Art/<class>/*.jpg``, ``Real_World`` or ``Real World``). Splits are LibMTL-style list
files ``<Domain>_{train,val,test}.txt`` of lines ``<path relative to data_dir> <label>``: taken from
``split_dir`` when given (e.g. LibMTL's ``examples/office/data_txt/office-31``), otherwise drawn here,
60/20/20 per class and domain with a seeded shuffle (classes numbered in sorted folder order). The
lists are written into the prepared data, so the split never changes.

A training row holds one image of every domain (shorter domains cycle, as LibMTL draws a batch from
every task's loader at every step); validation/test rows pad the shorter domains with an empty image
labelled -1, which the masked loss and accuracy skip, so every image is evaluated exactly once.
Images are resized to 224x224 and normalised with the ImageNet statistics (LibMTL's transform).
Model: :class:`mtlflow.models.resnet.ResNet18Encoder` shared, one ``Linear(512, classes)`` per task.
Recipe (LibMTL defaults): Adam lr 1e-4, weight decay 1e-5, batch 64, 100 epochs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, read_resized_image
from mtlflow.core.errors import DataError
from mtlflow.metrics.classification import MaskedAccuracy, masked_cross_entropy
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.multi_input import MultiInputModel
from mtlflow.models.resnet import ResNet18Encoder

SPLITS = ("train", "val", "test")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}


def _optional_positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)


def read_list(path: Path) -> list[tuple[str, int]]:
    """``[(relative path, label)]`` of a LibMTL-style list file."""
    if not path.is_file():
        raise DataError(f"split list missing: expected {path}; pass a split_dir with <Domain>_{{train,val,test}}.txt "
                        "or omit split_dir to draw the 60/20/20 split")
    entries = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rel, _, label = line.strip().rpartition(" ")
        if not rel or not label.lstrip("-").isdigit():
            raise DataError(f"{path}: malformed line {line!r} (expected '<path> <label>')")
        entries.append((rel.lstrip("/"), int(label)))
    return entries


class ImageList(Dataset):
    """``(image [3, S, S], label)`` for a list of (relative path, label)."""

    def __init__(self, root: Path, entries: Sequence[tuple[str, int]], image_size: int):
        self.root, self.entries, self.image_size = root, list(entries), image_size

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, idx: int) -> tuple[Tensor, int]:
        from torchvision.transforms.v2 import functional as TF

        rel, label = self.entries[idx]
        image = read_resized_image(self.root / rel, self.image_size)
        return TF.normalize(image.float().div_(255.0), IMAGENET_MEAN, IMAGENET_STD), label


class MultiInputDataset(Dataset):
    """Row i: ``(images [K, 3, S, S], (label_1, ..., label_K))``, one image per task.

    ``pad=False`` (training): length = the largest task, shorter tasks cycle. ``pad=True``
    (evaluation): shorter tasks are padded with a zero image and label -1.
    """

    def __init__(self, datasets: Sequence[ImageList], pad: bool):
        self.datasets, self.pad = list(datasets), pad
        if any(len(d) == 0 for d in self.datasets):
            raise DataError("a domain has no images in this split; check the split lists")

    def __len__(self) -> int:
        return max(len(d) for d in self.datasets)

    def __getitem__(self, idx: int):
        images, labels = [], []
        for data in self.datasets:
            if idx < len(data) or not self.pad:
                image, label = data[idx % len(data)]
            else:
                size = data.image_size
                image, label = torch.zeros(3, size, size), -1
            images.append(image)
            labels.append(torch.tensor(label, dtype=torch.int64))
        return torch.stack(images), tuple(labels)


class OfficeBenchmark(Benchmark):
    """Subclasses name the domains (task name -> folder candidates and list-file stem) and the classes."""

    #: task name -> (list-file stem, candidate image folders relative to data_dir)
    domains: ClassVar[dict[str, tuple[str, tuple[str, ...]]]]
    n_classes: ClassVar[int]

    config_fields = {
        "data_dir": ConfigField(None, "dataset folder with one sub-folder per domain",
                                lambda v: v is None or isinstance(v, str), "a folder path"),
        "split_dir": ConfigField(None, "folder of LibMTL-style <Domain>_{train,val,test}.txt lists (default: draw a "
                                 "seeded 60/20/20 split)", lambda v: v is None or isinstance(v, str), "a folder path"),
        "image_size": ConfigField(224, "side of the resized square image", lambda v: isinstance(v, int) and v >= 16,
                                  "an integer >= 16"),
        "max_per_class": ConfigField(None, "keep at most N images per class and domain before splitting (smoke runs)",
                                     _optional_positive_int, "a positive integer or null"),
        "weights_path": ConfigField(None, "torchvision ResNet-18 state_dict to start from (ImageNet weights as in "
                                    "LibMTL; nothing is downloaded)", lambda v: v is None or isinstance(v, str),
                                    "a file path"),
        "seed": ConfigField(0, "seed of the drawn split", lambda v: isinstance(v, int), "an integer"),
    }
    train_defaults = {"epochs": 100, "batch_size": 64, "lr": 1e-4, "weight_decay": 1e-5, "optimizer": "adam"}
    cpu_smoke = {"data_options": {"image_size": 32, "max_per_class": 5},
                 "train_options": {"epochs": 1, "batch_size": 8}}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(name, masked_cross_entropy, (MaskedAccuracy,), primary="acc", hv_reference=1.0)
                for name in self.domains]

    def _data_dir(self) -> Path:
        return self.mounted_data_dir("with one image folder per domain")

    def _domain_folder(self, root: Path, task: str) -> Path:
        for candidate in self.domains[task][1]:
            if (root / candidate).is_dir():
                return root / candidate
        raise DataError(f"{self.name} domain {task!r} not found: expected {root / self.domains[task][1][0]}")

    def _drawn_split(self, root: Path) -> dict[str, dict[str, list[tuple[str, int]]]]:
        folders = {t: self._domain_folder(root, t) for t in self.domains}
        classes = sorted(p.name for p in next(iter(folders.values())).iterdir() if p.is_dir())
        if len(classes) != self.n_classes:
            raise DataError(f"{next(iter(folders.values()))} has {len(classes)} class folders, expected {self.n_classes}")
        rng = random.Random(self.config["seed"])
        out: dict[str, dict[str, list[tuple[str, int]]]] = {t: {s: [] for s in SPLITS} for t in self.domains}
        for task, folder in folders.items():
            for label, cls in enumerate(classes):
                if not (folder / cls).is_dir():
                    raise DataError(f"class folder missing: expected {folder / cls} (every domain has the same classes)")
                files = sorted(p for p in (folder / cls).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
                rng.shuffle(files)
                if self.config["max_per_class"]:
                    files = files[:self.config["max_per_class"]]
                n_train, n_val = int(round(0.6 * len(files))), int(round(0.2 * len(files)))
                parts = {"train": files[:n_train], "val": files[n_train:n_train + n_val],
                         "test": files[n_train + n_val:]}
                for split, chosen in parts.items():
                    out[task][split] += [(p.relative_to(root).as_posix(), label) for p in chosen]
        return out

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        root = self._data_dir()
        if self.config["split_dir"]:
            split_dir = Path(self.config["split_dir"])
            lists = {t: {s: read_list(split_dir / f"{stem}_{s}.txt") for s in SPLITS}
                     for t, (stem, _) in self.domains.items()}
            how = f"lists from {split_dir}"
        else:
            lists = self._drawn_split(root)
            how = f"seeded 60/20/20 per class and domain (seed {self.config['seed']})"
        sizes = {}
        (out_dir / "splits").mkdir()
        for task, (stem, _) in self.domains.items():
            for split in SPLITS:
                entries = lists[task][split]
                absent = [rel for rel, _ in entries if not (root / rel).is_file()]
                if absent:
                    raise DataError(f"{len(absent)} image(s) of {task}/{split} missing under {root} (first: "
                                    f"{absent[0]}); check the data folder and split lists")
                bad = [lab for _, lab in entries if not 0 <= lab < self.n_classes]
                if bad:
                    raise DataError(f"{task}/{split} has label {bad[0]} outside 0..{self.n_classes - 1}")
                (out_dir / "splits" / f"{stem}_{split}.txt").write_text("".join(f"{r} {lab}\n" for r, lab in entries))
                sizes[f"{task}/{split}"] = len(entries)
        (out_dir / "source.json").write_text(json.dumps({"data_dir": str(root), "split": how}, indent=2) + "\n")
        return {"sizes": sizes, "split": how}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        root = self._data_dir()
        size = self.config["image_size"]
        splits = {}
        for split in SPLITS:
            per_task = [ImageList(root, read_list(data_dir / "splits" / f"{stem}_{split}.txt"), size)
                        for stem, _ in self.domains.values()]
            splits[split] = MultiInputDataset(per_task, pad=split != "train")
        return splits

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = ResNet18Encoder(self.config["weights_path"])
        heads = [nn.Linear(trunk.out_features, self.n_classes) for _ in names]
        return MultiInputModel(trunk, heads, names, [self.task_names.index(n) for n in names])
