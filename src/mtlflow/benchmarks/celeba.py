"""CelebA: 40 binary face attributes (Liu et al. 2015) in the setting of Nash-MTL/FAMO/FairGrad/COST.

The data cannot be downloaded here: point ``data_dir`` (``--data-dir``) at a folder with the official
layout::

    Anno/list_attr_celeba.txt       # image count, the 40 attribute names, then "<file> ±1 x 40" per image
    Eval/list_eval_partition.txt    # "<file> 0|1|2" (train / val / test)
    Img/img_align_celeba/*.jpg      # the aligned 178x218 JPEGs

Preparation parses the two annotation files, checks that the images exist and writes the index
(files and 0/1 labels per split) with the SHA-256 of the annotation files; images are read from
``data_dir`` when training, resized to 64x64 (bilinear) and scaled to [0, 1] (the papers' transform:
``Resize((64, 64))`` + ``ToTensor``). Model: the 9-layer CNN of :mod:`mtlflow.models.celeba_cnn` with
40 logit heads; BCE per attribute; F1 per attribute (threshold 0.5). Recipe: Adam 3e-4, batch 256,
15 epochs. Paper STL references: the 40 single-task F1s posted by the FAMO authors (FAMO issue #2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from mtlflow.benchmarks.base import (
    Benchmark,
    ConfigField,
    PublishedReferences,
    load_tensor_file,
    read_resized_image,
)
from mtlflow.core.errors import DataError
from mtlflow.core.hashing import file_sha256
from mtlflow.metrics.classification import BinaryAccuracy, BinaryF1, masked_binary_cross_entropy
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.celeba_cnn import CelebACNN

ATTRIBUTES = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips", "Big_Nose",
    "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin", "Eyeglasses",
    "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache",
    "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks",
    "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young")
#: Single-task F1 per attribute posted by the FAMO authors (FAMO issue #2; methods-cost.md §3.2).
PAPER_STL_F1 = dict(zip(ATTRIBUTES, (
    0.6737, 0.6812, 0.8152, 0.5760, 0.7206, 0.8555, 0.3820, 0.5823, 0.7876, 0.8321, 0.5030, 0.6869, 0.6781, 0.5240,
    0.5162, 0.9569, 0.6969, 0.6798, 0.8808, 0.8582, 0.9703, 0.9327, 0.5058, 0.4031, 0.9704, 0.4864, 0.6079, 0.5261,
    0.5691, 0.5982, 0.6858, 0.9241, 0.5425, 0.7406, 0.7102, 0.8737, 0.9306, 0.3370, 0.7648, 0.9191), strict=True))
ATTR_FILE = Path("Anno") / "list_attr_celeba.txt"
PARTITION_FILE = Path("Eval") / "list_eval_partition.txt"
IMAGE_DIR = Path("Img") / "img_align_celeba"
SPLIT_CODES = {"0": "train", "1": "val", "2": "test"}
SPLITS = ("train", "val", "test")


def _optional_positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)


def read_attributes(path: Path) -> tuple[list[str], dict[str, list[int]]]:
    """``(names, {file: [0/1 x 40]})`` from ``list_attr_celeba.txt`` (the count line is optional)."""
    if not path.is_file():
        raise DataError(f"CelebA attribute file missing: expected {path}; point --data-dir at the CelebA folder")
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    if lines and len(lines[0]) == 1 and lines[0][0].isdigit():
        lines = lines[1:]
    if not lines:
        raise DataError(f"{path} is empty; restore the CelebA annotation files")
    names, rows = lines[0], {}
    for fields in lines[1:]:
        if len(fields) != len(names) + 1 or any(v not in ("1", "-1") for v in fields[1:]):
            raise DataError(f"{path}: malformed line for {fields[0] if fields else '?'} (expected a file name and "
                            f"{len(names)} values of ±1)")
        rows[fields[0]] = [1 if v == "1" else 0 for v in fields[1:]]
    return names, rows


def read_partition(path: Path) -> dict[str, str]:
    """``{file: train|val|test}`` from ``list_eval_partition.txt``."""
    if not path.is_file():
        raise DataError(f"CelebA partition file missing: expected {path}; point --data-dir at the CelebA folder")
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in SPLIT_CODES:
            raise DataError(f"{path}: malformed line {line!r} (expected '<file> 0|1|2')")
        out[fields[0]] = SPLIT_CODES[fields[1]]
    return out


class CelebAImages(Dataset):
    """``(image [3, S, S] in [0, 1], (label_1, ..., label_40))`` read from the aligned JPEGs."""

    def __init__(self, image_dir: Path, files: Sequence[str], labels: Tensor, image_size: int):
        self.image_dir, self.files, self.labels, self.image_size = image_dir, list(files), labels, image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, idx: int):
        image = read_resized_image(self.image_dir / self.files[idx], self.image_size)
        return image.float().div_(255.0), tuple(self.labels[idx].float().unbind())


class CelebA(Benchmark):
    name = "celeba"
    description = "CelebA: 40 binary attributes, 64x64 aligned faces, 9-layer CNN + 40 heads; F1 (mounted data)"
    config_fields = {
        "data_dir": ConfigField(None, "CelebA folder (Anno/, Eval/, Img/img_align_celeba/)",
                                lambda v: v is None or isinstance(v, str), "a folder path"),
        "image_size": ConfigField(64, "side of the resized square image", lambda v: isinstance(v, int) and v >= 8,
                                  "an integer >= 8"),
        "max_per_split": ConfigField(None, "keep only the first N images of each split (smoke runs)",
                                     _optional_positive_int, "a positive integer or null"),
    }
    train_defaults = {"epochs": 15, "batch_size": 256, "lr": 3e-4, "optimizer": "adam",
                      "per_method": {"ldcmtl": {"lr": 1e-3}}}  # LDC-MTL Table 5's step size
    cpu_smoke = {"data_options": {"image_size": 32, "max_per_split": 64},
                 "train_options": {"epochs": 1, "batch_size": 32}}

    def method_defaults(self, method: str) -> dict[str, Any]:
        # LDC-MTL Table 5 / App. A.1 (CelebA): λ = 0.01, τ = σ(W), no normalisation, a [40, 1] trainable vector
        if method == "ldcmtl":
            # Table 5's λ multiplies the discrepancy in the authors' code: form="code" (see methods/ldcmtl.py)
            return {"penalty": 0.01, "form": "code",
                    "tau": "sigma", "normalization": "none", "router": "vector"}
        return {}

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(name, masked_binary_cross_entropy, (BinaryF1, BinaryAccuracy), primary="f1",
                         hv_reference=1.0) for name in ATTRIBUTES]

    def published_references(self) -> PublishedReferences:
        return PublishedReferences(label="paper STL", metrics={a: {"f1": f} for a, f in PAPER_STL_F1.items()},
                                   source="single-task F1 posted by the FAMO authors (FAMO issue #2, 2023-12-17; "
                                          "methods-cost.md §3.2), rounded to 4 decimals")

    def _data_dir(self) -> Path:
        return self.mounted_data_dir("(or --data-option data_dir=DIR) with Anno/list_attr_celeba.txt, "
                                     "Eval/list_eval_partition.txt and Img/img_align_celeba/")

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        root = self._data_dir()
        names, labels = read_attributes(root / ATTR_FILE)
        if tuple(names) != ATTRIBUTES:
            raise DataError(f"{root / ATTR_FILE} names attributes {names[:3]}..., not the 40 CelebA attributes in "
                            "their standard order; restore the official annotation file")
        partition = read_partition(root / PARTITION_FILE)
        missing_labels = sorted(set(partition) - set(labels))
        if missing_labels:
            raise DataError(f"{len(missing_labels)} image(s) of the partition have no attributes (first: "
                            f"{missing_labels[0]}); the annotation files do not match")
        files = {s: [f for f in sorted(partition) if partition[f] == s] for s in SPLITS}
        if self.config["max_per_split"]:
            files = {s: v[:self.config["max_per_split"]] for s, v in files.items()}
        image_dir = root / IMAGE_DIR
        absent = [f for s in SPLITS for f in files[s] if not (image_dir / f).is_file()]
        if absent:
            raise DataError(f"{len(absent)} CelebA image(s) missing under {image_dir} (first: {absent[0]}); "
                            "check the mounted data folder")
        index = {s: {"files": files[s], "labels": torch.tensor([labels[f] for f in files[s]], dtype=torch.uint8)}
                 for s in SPLITS}
        torch.save(index, out_dir / "index.pt")
        sources = {"data_dir": str(root), "sha256": {str(ATTR_FILE): file_sha256(root / ATTR_FILE),
                                                       str(PARTITION_FILE): file_sha256(root / PARTITION_FILE)}}
        (out_dir / "source.json").write_text(json.dumps(sources, indent=2) + "\n")
        return {"sizes": {s: len(files[s]) for s in SPLITS}, "source": sources,
                "note": "images stay in data_dir; the content hash covers the index and the annotation hashes"}

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        fix = f"re-run `mtlflow prepare --benchmark celeba --data-dir DIR --out {data_dir}`"
        index = load_tensor_file(data_dir / "index.pt", "CelebA index", fix)
        image_dir = self._data_dir() / IMAGE_DIR
        splits = {}
        for s in SPLITS:
            entry = index.get(s) if isinstance(index, dict) else None
            if entry is None or entry["labels"].shape[1:] != (len(ATTRIBUTES),):
                raise DataError(f"CelebA index in {data_dir} lacks the {s} split or has the wrong shape; {fix}")
            splits[s] = CelebAImages(image_dir, entry["files"], entry["labels"], self.config["image_size"])
        return splits

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = CelebACNN()
        return MultiTaskModel(trunk, [nn.Linear(trunk.out_features, 1) for _ in names], names)
