"""The benchmark abstraction.

A benchmark is (1) a way to *prepare* its data into a directory with a manifest and content hash,
(2) a way to *load* that directory into train/val/test splits, (3) task specifications (loss, metrics
and for each metric whether higher is better) and (4) a model factory that builds a shared trunk with
one head per task. The trainer, the CLI, the DVC stages and the Kubeflow components all go through
this interface, so a new benchmark is one new file.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.core.hashing import MANIFEST_NAME, combine_hashes, file_hashes
from mtlflow.core.hparams import ConfigField
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel


class MultiTaskTensorDataset(Dataset):
    """``(x, (y_1, ..., y_K))`` samples from one input tensor and K target tensors."""

    def __init__(self, inputs: Tensor, targets: Sequence[Tensor]):
        if any(len(t) != len(inputs) for t in targets):
            raise DataError("inputs and targets have different lengths; re-run prepare")
        self.inputs = inputs
        self.targets = list(targets)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, idx: int) -> tuple[Tensor, tuple[Tensor, ...]]:
        return self.inputs[idx], tuple(t[idx] for t in self.targets)


@dataclass
class BenchmarkData:
    """Loaded splits of a prepared benchmark, with the content hash of the files they came from."""

    splits: dict[str, Dataset]
    content_hash: str
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PublishedReferences:
    """Single-task metrics from the literature: ``metrics[task][metric]``, with where they come from."""

    label: str
    source: str
    metrics: dict[str, dict[str, float]]
    note: str = ""

    def restricted(self, tasks: Sequence[str]) -> dict[str, dict[str, float]]:
        """The reference metrics of ``tasks`` (those the papers report)."""
        return {t: dict(self.metrics[t]) for t in tasks if t in self.metrics}


def seed_worker(worker_id: int) -> None:
    """Seed ``random`` and NumPy in a DataLoader worker from the seed torch gave it."""
    seed = torch.initial_seed() % (2**32)
    random.seed(seed)
    np.random.seed(seed)


class Benchmark:
    """Base class of benchmarks; subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Preparation options with defaults, overridable from the CLI, params.yaml or the pipeline.
    config_fields: ClassVar[dict[str, ConfigField]] = {}
    #: Training defaults of the benchmark's recipe (epochs, batch_size, lr, ...).
    train_defaults: ClassVar[dict[str, Any]] = {}
    #: Non-empty when the tasks come from a preparation option instead of the class (the spec benchmark):
    #: says where, for listings. Such a benchmark cannot be built without that option.
    tasks_from: ClassVar[str] = ""
    #: A configuration that runs on a laptop CPU in seconds to minutes (the tests use it):
    #: ``{"data_options": {preparation options}, "train_options": {training overrides}}``.
    cpu_smoke: ClassVar[dict[str, Any]] = {}

    def __init__(self, **config: Any):
        unknown = sorted(set(config) - set(self.config_fields))
        if unknown:
            raise InvalidParameterError(
                f"unknown option(s) {', '.join(unknown)} for benchmark {self.name!r}; "
                f"valid: {', '.join(sorted(self.config_fields)) or 'none'}")
        resolved = {k: f.default for k, f in self.config_fields.items()}
        resolved.update({k: v for k, v in config.items() if v is not None})
        for key, value in resolved.items():
            spec = self.config_fields[key]
            if not spec.accepts(value):
                raise InvalidParameterError(
                    f"benchmark {self.name!r} option {key}={value!r} is invalid: must be {spec.requirement}")
        self.config = resolved

    # -- to implement -------------------------------------------------------------------------
    @property
    def tasks(self) -> list[TaskSpec]:
        raise NotImplementedError

    def write_data(self, out_dir: Path) -> dict[str, Any]:
        """Write the prepared files into ``out_dir``; return extra manifest fields (sources, sizes)."""
        raise NotImplementedError

    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        raise NotImplementedError

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        raise NotImplementedError

    def method_defaults(self, method: str) -> dict[str, Any]:
        """Benchmark-specific hyper-parameter defaults of ``method`` (from the papers' recipes)."""
        return {}

    @property
    def loss_lower_bounds(self) -> list[float] | None:
        """Lower bounds of the task losses when they can be negative (methods working on log-losses or
        loss ratios take them as ``min_losses``); None when the losses are non-negative."""
        return None

    # -- shared behaviour -----------------------------------------------------------------------
    @property
    def label(self) -> str:
        """The data set's name in reports, metrics labels and the model store (a spec's own name)."""
        return self.name

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def select_tasks(self, names: Sequence[str] | None) -> list[TaskSpec]:
        if not names:
            return self.tasks
        by_name = {t.name: t for t in self.tasks}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise InvalidParameterError(
                f"unknown task(s) {', '.join(missing)} for benchmark {self.name!r}; valid tasks: "
                f"{', '.join(by_name)}")
        return [by_name[n] for n in names]

    def unpack(self, batch: Any) -> tuple[Any, list[Tensor]]:
        """Split a collated batch into model inputs and the list of per-task targets."""
        inputs, targets = batch
        return inputs, list(targets)

    def make_loader(self, dataset: Dataset, batch_size: int, shuffle: bool = False,
                    generator: torch.Generator | None = None, num_workers: int = 0,
                    pin_memory: bool = False) -> DataLoader:
        """The DataLoader of one split; the trainer and the evaluation use it for every split.

        Override it for custom batching (graph benchmarks return torch_geometric's loader). Workers
        draw their seeds from ``generator``, so the data order and augmentations stay deterministic.
        """
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                          num_workers=num_workers, pin_memory=pin_memory,
                          worker_init_fn=seed_worker if num_workers else None)

    def data_identity(self) -> dict[str, Any]:
        """What decides this benchmark's prepared data (the data cache's key, DVC's source stage): the
        configuration; a benchmark whose source can change under one configuration adds the source's hash."""
        return dict(self.config)

    def published_references(self) -> PublishedReferences | None:
        """Single-task reference metrics published by the papers, for a labelled "paper STL" Δm%."""
        return None

    @classmethod
    def headline_metrics(cls, config: Mapping[str, Any]) -> str:
        """Which metrics of each task Δm% and the mean rank average (:mod:`mtlflow.jobs.compare.headline`) for
        runs recorded with ``config``: ``"primary"`` (each task's primary metric) or ``"all"`` (every metric but
        the loss). A class method: the comparison reads it from the runs' records without building the data."""
        return "primary"

    def mounted_data_dir(self, layout: str) -> Path:
        """The existing folder of the ``data_dir`` option, for benchmarks whose data is mounted (never
        downloaded); ``layout`` ends the error message by saying what the folder must hold."""
        if not self.config.get("data_dir"):
            raise DataError(f"{self.name} needs its data folder: pass --data-dir DIR {layout}")
        root = Path(self.config["data_dir"])
        if not root.is_dir():
            raise DataError(f"{self.name} folder not found: {root}; pass the mounted dataset folder to --data-dir")
        return root

    def prepare(self, out_dir: str | Path) -> dict[str, Any]:
        """Write the benchmark data atomically into ``out_dir`` with a manifest and content hash."""
        out_dir = Path(out_dir)
        started = time.time()
        with atomic.atomic_dir(out_dir) as tmp:
            extra = self.write_data(tmp)
            files = file_hashes(tmp)
            manifest = {
                "benchmark": self.name,
                "config": self.config,
                "tasks": self.task_names,
                "content_hash": combine_hashes(files),
                "files": files,
                "created_unix": round(started, 3),
                **extra,
            }
            atomic.write_json(tmp / MANIFEST_NAME, manifest)
        return manifest

    def load(self, data_dir: str | Path, verify: bool = True,
             manifest: Mapping[str, Any] | None = None) -> BenchmarkData:
        """Load prepared data, checking that it belongs to this benchmark and is intact (``manifest``: the
        directory's manifest when the caller has read it already)."""
        data_dir = Path(data_dir)
        manifest = read_manifest(data_dir) if manifest is None else manifest
        if manifest.get("benchmark") != self.name:
            raise DataError(f"{data_dir} holds data of benchmark {manifest.get('benchmark')!r}, not "
                            f"{self.name!r}; prepare it with `mtlflow prepare --benchmark {self.name}`")
        if verify:
            actual = file_hashes(data_dir)
            if combine_hashes(actual) != manifest["content_hash"]:
                recorded = manifest.get("files", {})
                changed = sorted(n for n in set(actual) | set(recorded) if actual.get(n) != recorded.get(n))
                what = ", ".join(str(data_dir / n) for n in changed) if recorded else f"files in {data_dir}"
                verb = "does" if len(changed) == 1 else "do"
                if recorded and not changed:  # every file matches, so the recorded content_hash was edited
                    what, verb = f"the content_hash recorded in {data_dir / MANIFEST_NAME}", "does"
                raise DataError(f"{what} {verb} not match its manifest hash (corrupt, missing or edited); "
                                f"re-run `mtlflow prepare --benchmark {self.name} --out {data_dir}`")
        return BenchmarkData(self.read_splits(data_dir), manifest["content_hash"], manifest)


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST_NAME
    if not path.is_file():
        raise DataError(f"no prepared data in {data_dir}: expected {path}; create it with "
                        f"`mtlflow prepare --benchmark NAME --out {data_dir}`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise DataError(f"{path} is corrupt; re-run `mtlflow prepare` into {data_dir}") from None
    if "content_hash" not in manifest or "benchmark" not in manifest:
        raise DataError(f"{path} lacks benchmark/content_hash; re-run `mtlflow prepare` into {data_dir}")
    return manifest


def load_tensor_file(path: Path, what: str, fix: str) -> Any:
    """``torch.load`` a prepared tensor file, turning a missing or corrupt file into a DataError."""
    if not path.is_file():
        raise DataError(f"{what} missing: expected {path}; {fix}")
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for truncated files
        raise DataError(f"{what} {path} is corrupt ({type(exc).__name__}); {fix}") from None


def read_resized_image(path: Path, size: int) -> Tensor:
    """An image file as ``uint8 [3, size, size]`` RGB (bilinear, antialiased), a DataError if unreadable."""
    from PIL import Image
    from torchvision.transforms.v2 import functional as TF

    try:
        with Image.open(path) as img:
            image = TF.pil_to_tensor(img.convert("RGB"))
    except OSError as exc:
        raise DataError(f"cannot read image {path} ({exc}); check the mounted data folder") from None
    return TF.resize(image, [size, size], antialias=True)
