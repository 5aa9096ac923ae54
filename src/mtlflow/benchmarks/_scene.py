"""Shared implementation of the dense scene-understanding benchmarks (NYUv2, CityScapes) on the MTAN
preprocessed ``.npy`` layout (Liu et al. 2019; Nash-MTL/FAMO/FairGrad/COST)::

    <data_dir>/{train,val}/image/<i>.npy     # H x W x 3 float
    <data_dir>/{train,val}/<label dir>/<i>.npy  # H x W, -1 = ignore (label: NYUv2 13 classes, label_7: CityScapes)
    <data_dir>/{train,val}/depth/<i>.npy     # H x W x 1 (or H x W)
    <data_dir>/{train,val}/normal/<i>.npy    # H x W x 3 (NYUv2 only)

The papers have no held-out validation set: MTAN's ``val`` folder is the test set and the reported
numbers are the mean of the last 10 epochs. Here the test split is the ``val`` folder; the validation
split is the same folder by default (``n_val_from_train = 0``, the papers' protocol -- the selection
rule never chooses an epoch by it) or ``n_val_from_train`` training images held out (PaLoRA's NYUv2
protocol holds out 95 of 795).

Training augmentation (on by default, as in the papers' code): one joint random scale-crop -- scale
s drawn from {1, 1.2, 1.5}, a crop of (H/s, W/s) at a random position resized back to (H, W),
bilinear for the image and nearest for labels, depth and normals, depth divided by s -- and a
horizontal flip with probability 0.5 that negates the normals' x component. It uses torchvision
transforms v2 on ``tv_tensors`` and the torch RNG (seeded and checkpointed by the trainer).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import Benchmark, ConfigField, PublishedReferences
from mtlflow.core.errors import DataError
from mtlflow.core.hashing import file_sha256
from mtlflow.core.hparams import one_of
from mtlflow.metrics.dense import (
    DEPTH_METRICS,
    NORMAL_METRICS,
    depth_loss,
    normal_loss,
    segmentation_loss,
    segmentation_metrics,
)
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.segnet import DenseHead, build_segnet, filters

SCALES = (1.0, 1.2, 1.5)
MODELS = ("mtan", "segnet")


def _optional_positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _non_negative_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def count_items(folder: Path) -> int:
    """Number of ``<i>.npy`` files, checking that they are numbered 0..n-1."""
    if not folder.is_dir():
        raise DataError(f"MTAN data folder missing: expected {folder}; point --data-dir at the preprocessed "
                        "dataset ({train,val}/{image,label|label_7,depth,normal}/N.npy)")
    ids = sorted(int(p.stem) for p in folder.glob("*.npy") if p.stem.isdigit())
    if ids != list(range(len(ids))):
        raise DataError(f"{folder} must hold 0.npy .. N-1.npy without gaps")
    return len(ids)


def random_scale_crop_flip(image: Tensor, targets: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The joint augmentation of the module docstring; ``targets`` keys: segmentation, depth, normal."""
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as TF

    height, width = image.shape[-2:]
    scale = SCALES[int(torch.randint(len(SCALES), ()))]
    h, w = int(height / scale), int(width / scale)
    top = int(torch.randint(height - h + 1, ()))
    left = int(torch.randint(width - w + 1, ()))
    flip = bool(torch.rand(()) < 0.5)

    def apply(x: Tensor, as_mask: bool) -> Tensor:
        wrapped = tv_tensors.Mask(x) if as_mask else tv_tensors.Image(x)
        out = TF.resized_crop(wrapped, top, left, h, w, [height, width], antialias=True)
        if flip:
            out = TF.horizontal_flip(out)
        return out.as_subclass(Tensor)

    image = apply(image, as_mask=False)
    out = {}
    for name, value in targets.items():
        value = apply(value, as_mask=True)
        if name == "depth":
            value = value / scale
        if name == "normal" and flip:
            value = value.clone()
            value[0] = -value[0]
        out[name] = value
    return image, out


def mtan_recipe(batch_size: int, ldcmtl_lr: float) -> dict[str, Any]:
    """Training defaults of Nash-MTL/FAMO/FairGrad/COST on both data sets (methods-cost.md §3.1): Adam 1e-4,
    StepLR(100, 0.5), 200 epochs, the mean of the last 10 epochs; the batch size and LDC-MTL Table 5's step
    size differ per data set."""
    return {"epochs": 200, "batch_size": batch_size, "lr": 1e-4, "optimizer": "adam", "select": "last-k:10",
            "scheduler": "step", "scheduler_options": {"step_size": 100, "gamma": 0.5},
            "per_method": {"ldcmtl": {"lr": ldcmtl_lr}}}


class SceneDataset(Dataset):
    """Items ``(image [3, H, W], (target per task))`` from one MTAN folder (``train`` or ``val``)."""

    def __init__(self, folder: Path, ids: Sequence[int], task_dirs: dict[str, str], augment: bool):
        self.folder, self.ids, self.task_dirs, self.augment = folder, list(ids), dict(task_dirs), augment

    def __len__(self) -> int:
        return len(self.ids)

    def _load(self, sub: str, i: int) -> np.ndarray:
        path = self.folder / sub / f"{i}.npy"
        try:
            return np.load(path)
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read {path} ({exc}); check the mounted data folder") from None

    def __getitem__(self, idx: int):
        i = self.ids[idx]
        image = torch.from_numpy(np.moveaxis(self._load("image", i), -1, 0).astype(np.float32))
        targets = {}
        for task, sub in self.task_dirs.items():
            raw = self._load(sub, i)
            if task == "segmentation":
                targets[task] = torch.from_numpy(raw.astype(np.float32)).unsqueeze(0)
            else:
                arr = raw[..., None] if raw.ndim == 2 else raw
                targets[task] = torch.from_numpy(np.moveaxis(arr, -1, 0).astype(np.float32))
        if self.augment:
            image, targets = random_scale_crop_flip(image, targets)
        targets["segmentation"] = targets["segmentation"].squeeze(0).round().long()
        return image, tuple(targets[t] for t in self.task_dirs)


class SceneBenchmark(Benchmark):
    """Subclasses set the label folder, the class count, the tasks and the published references."""

    n_classes: ClassVar[int]
    #: task name -> sub-folder of its targets, in task order
    task_dirs: ClassVar[dict[str, str]]
    #: hypervolume reference of the depth absolute error (in the data's depth units)
    depth_hv_reference: ClassVar[float] = 1.0
    #: LDC-MTL Table 5 / App. A.1 for this data set: λ, and whether the MLP router's layers have biases
    ldcmtl_penalty: ClassVar[float]
    ldcmtl_router_bias: ClassVar[bool]
    #: single-task metrics of the papers' code (``metrics[task][metric]``) and where they stand
    paper_stl: ClassVar[dict[str, dict[str, float]]]
    paper_stl_source: ClassVar[str]

    config_fields = {
        "data_dir": ConfigField(None, "MTAN preprocessed folder ({train,val}/{image,label...,depth,normal}/N.npy)",
                                lambda v: v is None or isinstance(v, str), "a folder path"),
        "model": ConfigField("mtan", "mtan (SegNet-MTAN, the papers' model) or segnet", one_of(*MODELS)),
        "augment": ConfigField(True, "random scale-crop + flip on the training split", lambda v: isinstance(v, bool),
                               "true or false"),
        "n_val_from_train": ConfigField(0, "hold out this many training images as validation (0: validate on the "
                                        "test folder, as the papers)", _non_negative_int, "an integer >= 0"),
        "max_items": ConfigField(None, "use only the first N images of each folder (smoke runs)",
                                 _optional_positive_int, "a positive integer or null"),
        "hash_files": ConfigField(False, "SHA-256 every .npy file at preparation (default: sizes only)",
                                  lambda v: isinstance(v, bool), "true or false"),
        "seed": ConfigField(0, "seed of the validation hold-out", lambda v: isinstance(v, int), "an integer"),
        "width_divisor": ConfigField(1, "divide the SegNet widths 64-128-256-512-512 by this (1 = the papers; CPU "
                                     "smoke runs use 8)", lambda v: isinstance(v, int) and v in (1, 2, 4, 8, 16),
                                     "1, 2, 4, 8 or 16"),
    }

    cpu_smoke = {"data_options": {"max_items": 4, "width_divisor": 8},
                 "train_options": {"epochs": 1, "batch_size": 2, "select": "last"}}

    def method_defaults(self, method: str) -> dict[str, Any]:
        # LDC-MTL Table 5 / App. A.1 on both data sets: τ = 1, no normalisation, a 3-layer MLP router
        if method == "ldcmtl":
            # Table 5's λ multiplies the discrepancy in the authors' code: form="code" (see methods/ldcmtl.py)
            return {"penalty": self.ldcmtl_penalty, "form": "code",
                    "tau": "one", "normalization": "none", "router": "mlp", "router_bias": self.ldcmtl_router_bias}
        if method == "palora":  # PaLoRA Table 1: rank 4 on scene understanding
            return {"rank": 4}
        return {}

    def published_references(self) -> PublishedReferences:
        return PublishedReferences(label="paper STL", metrics={t: dict(v) for t, v in self.paper_stl.items()},
                                   source=self.paper_stl_source)

    def _data_dir(self) -> Path:
        return self.mounted_data_dir("(MTAN preprocessed layout {train,val}/{image,...}/N.npy)")

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        root = self._data_dir()
        counts = {}
        for folder in ("train", "val"):
            per_dir = {sub: count_items(root / folder / sub) for sub in ("image", *self.task_dirs.values())}
            if len(set(per_dir.values())) != 1:
                raise DataError(f"{root / folder} has different numbers of files per sub-folder: {per_dir}")
            counts[folder] = per_dir["image"]
        limit = self.config["max_items"]
        train_ids = list(range(min(counts["train"], limit or counts["train"])))
        test_ids = list(range(min(counts["val"], limit or counts["val"])))
        n_val = self.config["n_val_from_train"]
        if n_val >= len(train_ids):
            raise DataError(f"n_val_from_train={n_val} leaves no training images out of {len(train_ids)}")
        if n_val:
            held = sorted(random.Random(self.config["seed"]).sample(train_ids, n_val))
            index = {"train": [("train", i) for i in train_ids if i not in set(held)],
                     "val": [("train", i) for i in held], "test": [("val", i) for i in test_ids]}
        else:
            index = {"train": [("train", i) for i in train_ids], "val": [("val", i) for i in test_ids],
                     "test": [("val", i) for i in test_ids]}
        files = {}
        for folder, ids in (("train", train_ids), ("val", test_ids)):
            for sub in ("image", *self.task_dirs.values()):
                for i in ids:
                    path = root / folder / sub / f"{i}.npy"
                    key = f"{folder}/{sub}/{i}.npy"
                    files[key] = file_sha256(path) if self.config["hash_files"] else path.stat().st_size
        (out_dir / "index.json").write_text(json.dumps({s: [list(e) for e in v] for s, v in index.items()}) + "\n")
        (out_dir / "source.json").write_text(json.dumps({"data_dir": str(root), "files": files}, sort_keys=True) + "\n")
        return {"sizes": {s: len(v) for s, v in index.items()}, "folders": counts,
                "validation": "held out from train" if n_val else "the test folder (papers' protocol)",
                "file_fingerprint": "sha256" if self.config["hash_files"] else "sizes"}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        fix = f"re-run `mtlflow prepare --benchmark {self.name} --data-dir DIR --out {data_dir}`"
        path = data_dir / "index.json"
        try:
            index = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise DataError(f"{self.name} index missing or corrupt: expected {path}; {fix}") from None
        root = self._data_dir()
        splits = {}
        for split in ("train", "val", "test"):
            entries = index.get(split)
            if not entries or len({folder for folder, _ in entries}) != 1:
                raise DataError(f"{path} lacks the {split} split or mixes folders; {fix}")
            augment = split == "train" and self.config["augment"]
            splits[split] = SceneDataset(root / entries[0][0], [i for _, i in entries], self.task_dirs, augment)
        return splits

    def scene_tasks(self) -> list[TaskSpec]:
        """Segmentation (mIoU, pixel accuracy), depth (absolute, relative error), normals (angles)."""
        specs = {
            "segmentation": TaskSpec("segmentation", segmentation_loss, segmentation_metrics(self.n_classes),
                                     primary="miou", hv_reference=1.0),
            "depth": TaskSpec("depth", depth_loss, DEPTH_METRICS, primary="abs_err", hv_reference=self.depth_hv_reference),
            "normal": TaskSpec("normal", normal_loss, NORMAL_METRICS, primary="angle_mean", hv_reference=90.0),
        }
        return [specs[t] for t in self.task_dirs]

    @property
    def tasks(self) -> list[TaskSpec]:
        return self.scene_tasks()

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        channels = {"segmentation": self.n_classes, "depth": 1, "normal": 3}
        divisor = self.config["width_divisor"]
        heads = [DenseHead(channels[n], normalise=(n == "normal"), width=filters(divisor)[0]) for n in names]
        return build_segnet(self.config["model"], heads, names, divisor)
