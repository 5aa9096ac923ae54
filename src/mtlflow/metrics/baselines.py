"""Baselines that say whether a model learned anything: the trivial predictor of each task, and the evaluation
of any fixed predictions with the metric code of a trained run.

The trivial baseline predicts one constant per task, fitted on the training split's labelled rows only, in
the units of the task's model output (what its loss and metrics take):

- binary and multi-label tasks (masked BCE): per label the logit of the training base rate, the constant
  that minimises the log-loss; its sign is the majority class, so accuracy is the majority rate and F1 is
  the majority class's, and one constant score gives ROC-AUC 0.5 (ties count one half);
- multiclass tasks (cross-entropy): the log of the training class frequencies, whose argmax is the majority
  class (accuracy = the majority rate) and whose cross-entropy is the base-rate log-loss;
- regression tasks (standardised MSE): the training median where the primary metric is MAE (the constant
  that minimises the absolute error), else the training mean (MSE, RMSE, R²; R² is then about 0).

Frequencies take half a count more per class (Jeffreys' prior, Krichevsky-Trofimov): a class that is absent
from the training rows keeps a finite log-loss instead of an infinite one; the argmax is unchanged.

:func:`evaluate_predictions` scores fixed predictions exactly as
:func:`mtlflow.metrics.evaluation.evaluate_examples` scores a model: the same metric classes, the same
batches (so the loss, a mean of batch means, is the same number) and the same per-example values, which is
what makes a baseline pair example by example with the trained runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.classification import masked_binary_cross_entropy, masked_cross_entropy, valid_label_mask
from mtlflow.metrics.evaluation import _keep_examples, _per_example_metric, _presence_metric
from mtlflow.metrics.regression import standardised_mse
from mtlflow.metrics.task import TaskSpec

#: the batch size of :func:`mtlflow.metrics.evaluation.evaluate_examples` (what ``mtlflow evaluate`` uses): a
#: task's loss is a mean of batch means, so the same batches give a trained run's number
EVALUATION_BATCH_SIZE = 512
#: the pseudo-count added to every class's training count (Jeffreys' prior)
PSEUDO_COUNT = 0.5

#: the kind of task each of the built-in losses trains, which decides its trivial prediction
KIND_OF_LOSS = {masked_binary_cross_entropy: "binary", masked_cross_entropy: "multiclass",
                functional.cross_entropy: "multiclass", standardised_mse: "regression"}


def task_kind(task: TaskSpec) -> str:
    """``binary`` (also multi-label), ``multiclass`` or ``regression``, from the task's loss; a task of another
    kind (dense maps, analytic objectives) has no baseline here."""
    kind = KIND_OF_LOSS.get(task.loss)
    if kind is None:
        raise InvalidParameterError(f"task {task.name!r} trains {getattr(task.loss, '__name__', task.loss)!r}, which "
                                    "is not a binary, multi-label, multiclass or regression loss; baselines cover those "
                                    "kinds only (leave this benchmark's baselines out)")
    return kind


def smoothed_log_frequencies(counts: np.ndarray) -> np.ndarray:
    """``log((count + 1/2) / (total + classes/2))`` per class: log base rates that stay finite."""
    counts = np.asarray(counts, dtype=np.float64)
    return np.log((counts + PSEUDO_COUNT) / (counts.sum() + PSEUDO_COUNT * len(counts)))


def base_rate_logit(labels: np.ndarray) -> float:
    """The logit of the smoothed share of positives among ``labels`` (0/1 values, missing ones removed)."""
    positives = float(np.sum(labels > 0.5))
    log_rates = smoothed_log_frequencies(np.array([len(labels) - positives, positives]))
    return float(log_rates[1] - log_rates[0])


def present_labels(target: Tensor) -> np.ndarray:
    """The labelled entries of one label column (binary) or class column (multiclass), as float64."""
    return target[valid_label_mask(target)].double().numpy()


def regression_values(target: Tensor) -> np.ndarray:
    """The present standardised values of a regression task's ``(value, scale)`` targets."""
    values = target[..., 0].reshape(-1).double()
    return values[torch.isfinite(values)].numpy()


def trivial_prediction(task: TaskSpec, train_target: Tensor, width: int) -> tuple[Tensor, dict[str, Any]]:
    """The trivial baseline of ``task`` as one example's model output (``[width]``, float32) and what it is
    (``rule``, ``value``), fitted on the training split's targets ``train_target``; ``width`` is the size of the
    task's model output (labels of a multi-label task, classes of a multiclass one, 1 otherwise)."""
    kind = task_kind(task)
    if kind == "binary":
        columns = train_target.reshape(len(train_target), width)
        logits = [base_rate_logit(present_labels(columns[:, j])) for j in range(width)]
        rates = [float(1 / (1 + np.exp(-z))) for z in logits]
        output = torch.tensor(logits)
        description = {"rule": "training base rate (logit) per label", "value": rates}
    elif kind == "multiclass":
        labels = present_labels(train_target).astype(np.int64)
        if len(labels) and labels.max() >= width:
            raise InvalidParameterError(f"task {task.name!r} has class {labels.max()} but its model has {width} "
                                        "outputs; prepare the data again")
        log_rates = smoothed_log_frequencies(np.bincount(labels, minlength=width))
        output = torch.from_numpy(log_rates)
        description = {"rule": "training class frequencies (log); argmax = the majority class",
                       "value": np.exp(log_rates).tolist(), "majority_class": int(np.argmax(log_rates))}
    else:
        values = regression_values(train_target)
        median = task.primary == "mae"
        centre = float(np.median(values) if median else np.mean(values))
        output = torch.full((width,), centre)
        description = {"rule": f"training {'median' if median else 'mean'} (standardised units)", "value": centre}
    return output.float(), description


def constant_predictions(output: Tensor, rows: int) -> Tensor:
    """One example's output repeated for ``rows`` examples (``[rows, width]``)."""
    return output.reshape(1, -1).expand(rows, -1).contiguous()


def evaluate_predictions(tasks: Sequence[TaskSpec], predictions: Sequence[Tensor], targets: Sequence[Tensor],
                         batch_size: int = EVALUATION_BATCH_SIZE,
                         ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, np.ndarray]]]:
    """The metrics and per-example values of fixed ``predictions`` (one ``[N, ...]`` model output per task) on
    ``targets`` (the tasks' ``[N, ...]`` targets, the split's order), as
    :func:`mtlflow.metrics.evaluation.evaluate_examples` returns them for a model."""
    rows = len(targets[0])
    if any(len(p) != rows for p in predictions) or any(len(t) != rows for t in targets):
        raise InvalidParameterError(f"predictions and targets must all have {rows} rows, one per example")
    metrics = {t.name: [m() for m in t.metrics] for t in tasks}
    loss_sum = {t.name: 0.0 for t in tasks}
    examples: dict[str, dict[str, list[float]]] = {t.name: {"loss": [], "error": []} for t in tasks}
    for start in range(0, rows, batch_size):
        n = min(batch_size, rows - start)
        for task, pred, target in zip(tasks, predictions, targets, strict=True):
            p, y = pred[start:start + n], target[start:start + n]
            loss_sum[task.name] += float(task.loss(p, y)) * n
            for metric in metrics[task.name]:
                metric.update(p, y)
            _keep_examples(task, p, y, n, _per_example_metric(task), _presence_metric(task), examples[task.name])
    values = {t.name: {"loss": loss_sum[t.name] / max(rows, 1), **{m.name: m.compute() for m in metrics[t.name]}}
              for t in tasks}
    return values, {task: {name: np.asarray(v, dtype=np.float64) for name, v in per_task.items()}
                    for task, per_task in examples.items()}
