"""Evaluation of a multi-task model on one split: per-task loss and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch.utils.data import Dataset

from mtlflow.metrics.task import TaskSpec

if TYPE_CHECKING:
    from mtlflow.benchmarks.base import Benchmark
    from mtlflow.models.base import MultiTaskModel


@torch.no_grad()
def evaluate_model(model: MultiTaskModel, bench: Benchmark, dataset: Dataset, tasks: Sequence[TaskSpec],
                   target_index: Sequence[int], batch_size: int = 512,
                   device: torch.device | str = "cpu") -> dict[str, dict[str, float]]:
    """``{task: {"loss": ..., metric: ...}}`` over the whole ``dataset``."""
    was_training = model.training
    model.eval()
    metrics = {t.name: [m() for m in t.metrics] for t in tasks}
    loss_sum = {t.name: 0.0 for t in tasks}
    count = 0
    loader = bench.make_loader(dataset, batch_size=batch_size, shuffle=False)
    for batch in loader:
        inputs, targets = bench.unpack(batch)
        inputs = _to(inputs, device)
        preds = model(inputs)
        n = _batch_len(targets[0])
        count += n
        for task, pred, idx in zip(tasks, preds, target_index):
            target = _to(targets[idx], device)
            loss_sum[task.name] += float(task.loss(pred, target)) * n
            for metric in metrics[task.name]:
                metric.update(pred, target)
    model.train(was_training)
    return {t.name: {"loss": loss_sum[t.name] / max(count, 1),
                     **{m.name: m.compute() for m in metrics[t.name]}} for t in tasks}


def _to(x, device):
    return x.to(device) if hasattr(x, "to") else x


def _batch_len(t) -> int:
    return int(t.shape[0]) if hasattr(t, "shape") and t.dim() > 0 else 1
