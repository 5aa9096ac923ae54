"""Evaluation of a multi-task model on one split: per-task loss and metrics, and optionally the
per-example values a paired comparison of two models needs (:mod:`mtlflow.metrics.paired`).

Per-example values (:func:`evaluate_examples`), for every task, in the split's order (so two models
evaluated on the same split are paired example by example):

- ``loss``: the task's loss on the example alone;
- ``error``: the example's error under the task's *paired statistic* (:func:`paired_statistic`): the
  primary metric's error when that metric is an average over examples -- a counting accuracy gives the
  0/1 error ``1 - correct`` (the share of the example's labels predicted wrongly when it has several),
  a lower-is-better streaming mean (MAE, depth error, mean angle) the example's own mean; otherwise
  (ROC-AUC, F1, mIoU, R², RMSE, a median) the primary metric has no per-example value and the
  example's loss is the paired statistic.

A task whose primary metric is ROC-AUC also keeps ``positives`` and ``negatives``: the example's present labels
of each class, so that the comparison can size the test split's sampling error of the AUC (Hanley & McNeil
1982) without the labels.

An example without a label for a task (a missing label: NaN or negative, see
:func:`mtlflow.metrics.classification.valid_label_mask`; a NaN regression target) is NaN in both,
never 0: the masked losses return 0 for a batch without labels, which would count as a perfect
prediction. Presence is what the task's metric counted: a counting accuracy's ``total``, a streaming
mean's ``count``.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from mtlflow.core import atomic
from mtlflow.core.errors import DataError
from mtlflow.metrics.classification import valid_label_mask
from mtlflow.metrics.task import CountingAccuracy, Metric, StreamingMean, TaskSpec

if TYPE_CHECKING:
    from mtlflow.benchmarks.base import Benchmark
    from mtlflow.models.base import MultiTaskModel


@torch.no_grad()
def evaluate_model(model: MultiTaskModel, bench: Benchmark, dataset: Dataset, tasks: Sequence[TaskSpec],
                   target_index: Sequence[int], batch_size: int = 512,
                   device: torch.device | str = "cpu") -> dict[str, dict[str, float]]:
    """``{task: {"loss": ..., metric: ...}}`` over the whole ``dataset``."""
    return _evaluate(model, bench, dataset, tasks, target_index, batch_size, device, keep_examples=False)[0]


@torch.no_grad()
def evaluate_examples(model: MultiTaskModel, bench: Benchmark, dataset: Dataset, tasks: Sequence[TaskSpec],
                      target_index: Sequence[int], batch_size: int = 512, device: torch.device | str = "cpu",
                      ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
    """The metrics of :func:`evaluate_model` and, from the same pass, ``{task: {"loss": [n], "error": [n]}}``
    (float64, the dataset's order, NaN where the example has no label for the task)."""
    metrics, examples = _evaluate(model, bench, dataset, tasks, target_index, batch_size, device, keep_examples=True)
    return metrics, {task: {name: np.asarray(values, dtype=np.float64) for name, values in per_task.items()}
                     for task, per_task in examples.items()}


def paired_statistic(task: TaskSpec) -> str:
    """The name of the per-example error a paired comparison uses for ``task``: ``"<primary>_error"``
    for a counting accuracy (0/1 error), ``"<primary>"`` for a lower-is-better mean over elements
    (absolute error, angle), ``"loss"`` when the primary metric is not an average over examples."""
    chosen = _per_example_metric(task)
    if chosen is None:
        return "loss"
    return f"{chosen.name}_error" if issubclass(chosen, CountingAccuracy) else chosen.name


def _per_example_metric(task: TaskSpec) -> type[Metric] | None:
    """The primary metric's class when it has a per-example value (see :func:`paired_statistic`)."""
    for metric in task.metrics:
        if metric.name == task.primary and _decomposes(metric):
            return metric
    return None


def _decomposes(metric: type[Metric]) -> bool:
    if issubclass(metric, CountingAccuracy):
        return metric.compute is CountingAccuracy.compute
    return issubclass(metric, StreamingMean) and not metric.higher_is_better and metric.compute is StreamingMean.compute


def _presence_metric(task: TaskSpec) -> type[Metric] | None:
    """A metric of the task that counts the labels it saw (None: every example is labelled)."""
    primary = _per_example_metric(task)
    if primary is not None:
        return primary
    return next((m for m in task.metrics if issubclass(m, (CountingAccuracy, StreamingMean))), None)


def _counted(metric: Metric) -> int:
    return metric.total if isinstance(metric, CountingAccuracy) else metric.count


def _example_error(metric: Metric) -> float:
    """The per-example error of a fresh metric updated with one example (its labels counted > 0)."""
    value = metric.compute()
    return 1.0 - value if isinstance(metric, CountingAccuracy) else value


def _evaluate(model, bench, dataset, tasks, target_index, batch_size, device, keep_examples: bool):
    was_training = model.training
    model.eval()
    metrics = {t.name: [m() for m in t.metrics] for t in tasks}
    loss_sum = {t.name: 0.0 for t in tasks}
    examples: dict[str, dict[str, list[float]]] = {
        t.name: {"loss": [], "error": [], **({"positives": [], "negatives": []} if t.primary == "roc_auc" else {})}
        for t in tasks}
    error_metric = {t.name: _per_example_metric(t) for t in tasks}
    presence_metric = {t.name: _presence_metric(t) for t in tasks}
    count = 0
    loader = bench.make_loader(dataset, batch_size=batch_size, shuffle=False)
    for batch in loader:
        inputs, targets = bench.unpack(batch)
        inputs = _to(inputs, device)
        preds = model(inputs)
        n = _batch_len(targets[0])
        count += n
        for task, pred, idx in zip(tasks, preds, target_index, strict=True):
            target = _to(targets[idx], device)
            loss_sum[task.name] += float(task.loss(pred, target)) * n
            for metric in metrics[task.name]:
                metric.update(pred, target)
            if keep_examples:
                _keep_examples(task, pred, target, n, error_metric[task.name], presence_metric[task.name],
                               examples[task.name])
    model.train(was_training)
    values = {t.name: {"loss": loss_sum[t.name] / max(count, 1),
                       **{m.name: m.compute() for m in metrics[t.name]}} for t in tasks}
    return values, examples if keep_examples else None


def _keep_examples(task: TaskSpec, pred, target, n: int, error_metric: type[Metric] | None,
                   presence_metric: type[Metric] | None, out: dict[str, list[float]]) -> None:
    """Append the loss and paired error of each of the batch's ``n`` examples, one example at a time
    through the task's own loss and metric (so masks and units are theirs)."""
    for i in range(n):
        p, y = pred[i:i + 1], target[i:i + 1]
        counter = presence_metric() if presence_metric is not None else None
        if counter is not None:
            counter.update(p, y)
            if _counted(counter) == 0:
                for values in out.values():  # loss, error (and a ROC-AUC task's class counts)
                    values.append(math.nan)
                continue
        loss = float(task.loss(p, y))
        out["loss"].append(loss)
        out["error"].append(_example_error(counter) if error_metric is not None else loss)
        if "positives" in out:  # the classes of the example's present labels (a ROC-AUC's sampling error)
            present = valid_label_mask(y)
            positive = int((y[present] > 0.5).sum())
            out["positives"].append(float(positive))
            out["negatives"].append(float(int(present.sum()) - positive))


def examples_path(evaluation_file: str | os.PathLike) -> Path:
    """Where the per-example values of the evaluation written to ``evaluation_file`` are kept: beside it,
    ``<name without .json>.per_example.npz`` (``evaluation.json`` -> ``evaluation.per_example.npz``)."""
    path = Path(evaluation_file)
    return path.with_name(path.name.removesuffix(".json") + ".per_example.npz")


def write_examples(target: str | os.PathLike, examples: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Save :func:`evaluate_examples`' per-example values atomically (one ``<task>.<value>`` array each)."""
    arrays = {f"{task}.{name}": np.asarray(values, dtype=np.float64)
              for task, per_task in examples.items() for name, values in per_task.items()}
    with atomic.atomic_path(target) as tmp:
        with open(tmp, "wb") as handle:  # a file object: np.savez would append .npz to a path
            np.savez(handle, **arrays)


def read_examples(path: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """The per-example values saved by :func:`write_examples`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"per-example values not found: expected {path}; evaluate with per-example output")
    try:
        with np.load(path) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"per-example values {path} are unreadable ({type(exc).__name__}); evaluate again") from None
    examples: dict[str, dict[str, np.ndarray]] = {}
    for key, values in arrays.items():
        task, name = key.rsplit(".", 1)
        examples.setdefault(task, {})[name] = values
    return examples


def _to(x, device):
    return x.to(device) if hasattr(x, "to") else x


def _batch_len(t) -> int:
    return int(t.shape[0]) if hasattr(t, "shape") and t.dim() > 0 else 1
