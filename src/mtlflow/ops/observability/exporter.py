"""Exporters: the training callback, and one-shot pushes of a sweep's comparison and a pipeline run's status.

:class:`PrometheusExporter` is a trainer :class:`~mtlflow.core.callbacks.Callback`. It reads every field of
the epoch records the trainer writes to ``metrics.json`` (see :mod:`mtlflow.ops.observability.catalog` for
the names) and exports them per epoch and at the end, pushing to a Pushgateway and/or serving
``/metrics``. An epoch record is read at the trainer's next hook (the next epoch's start, or the end
or failure of the run), not in ``on_epoch_end``, so fields that callbacks later in the list add to the
record are exported too. The contract with COST (teleportation): an epoch record with
``record["cost"]["teleports"]`` (teleports performed in that epoch) increases ``mtlflow_teleports_total``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from typing import Any

from mtlflow.core.callbacks import Callback, TrainerView
from mtlflow.core.errors import NonFiniteLossError
from mtlflow.engine.rundir import run_label
from mtlflow.ops.observability import catalog
from mtlflow.ops.observability.prometheus import (
    DEFAULT_PUSH_TIMEOUT,
    DEFAULT_RETRY_AFTER,
    GatewayPusher,
    MetricSet,
    MetricsServer,
    push_once,
    resolve_pushgateway,
)

#: seconds between progress pushes in the middle of an epoch (epoch ends always push)
DEFAULT_PUSH_INTERVAL = 30.0
#: the ``pipeline`` label of runs started from the command line
CLI_PIPELINE = "cli"


def run_identity(trainer: TrainerView, pipeline: str, run: str = "") -> dict[str, str]:
    """The identity labels of a training run, also its Pushgateway grouping key; ``run`` (default: the
    run directory's name) keeps concurrent runs of the same method and seed apart."""
    tasks = [t.name for t in trainer.tasks]
    return {"pipeline": pipeline or CLI_PIPELINE, "benchmark": trainer.bench.label,
            "method": run_label({"config": dataclasses.asdict(trainer.config)}),
            "seed": str(trainer.config.seed),
            "tasks": "all" if tasks == list(trainer.bench.task_names) else ",".join(tasks),
            "run": run or trainer.out_dir.name}


class PrometheusExporter(Callback):
    """Export a training run's telemetry to Prometheus (see the module docstring)."""

    name = "prometheus"

    def __init__(self, pushgateway: str | None = None, metrics_port: int | None = None, pipeline: str = CLI_PIPELINE,
                 metrics_addr: str = "0.0.0.0", push_timeout: float = DEFAULT_PUSH_TIMEOUT,
                 retry_after: float = DEFAULT_RETRY_AFTER, push_interval: float = DEFAULT_PUSH_INTERVAL,
                 run: str = "", pipeline_run: str = ""):
        self.gateway = resolve_pushgateway(pushgateway) if pushgateway else None
        self.metrics = MetricSet(catalog.TRAIN_METRICS)
        self.registry = self.metrics.registry
        self.pipeline = pipeline or CLI_PIPELINE
        self.run = run
        self.pipeline_run = pipeline_run
        self.push_timeout, self.retry_after, self.push_interval = push_timeout, retry_after, push_interval
        self.server = MetricsServer(self.registry, metrics_port, metrics_addr) if metrics_port is not None else None
        self.pusher: GatewayPusher | None = None
        self.labels: dict[str, str] = {}
        self._device = "cpu"
        self._pending: Mapping[str, Any] | None = None
        self._last_push = 0.0

    # -- trainer hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer: TrainerView) -> None:
        self.labels = run_identity(trainer, self.pipeline, self.run)
        self._device = trainer.device.type
        if self.gateway and self.pusher is None:
            self.pusher = GatewayPusher(self.gateway, catalog.TRAIN_JOB, self.grouping_key(), self.registry,
                                        timeout=self.push_timeout, retry_after=self.retry_after)
        now = time.time()
        self._set("mtlflow_train_planned_epochs", trainer.config.epochs)
        self._set("mtlflow_train_running", 1)
        self._set("mtlflow_train_failed", 0)
        self._set("mtlflow_train_nonfinite_loss", 0)
        self._set("mtlflow_train_start_timestamp_seconds", now)
        self._set("mtlflow_train_last_progress_timestamp_seconds", now)
        self.metrics.inc("mtlflow_train_steps_total", self.labels, 0)
        for record in trainer.history:  # a resumed run: its totals so far and its last epoch
            self._observe(record, count_only=record is not trainer.history[-1])
        self._push()

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        if self._observe_pending():
            self._push()

    def after_optimizer_step(self, trainer: TrainerView, state) -> None:
        now = time.time()
        self._set("mtlflow_train_last_progress_timestamp_seconds", now)
        if now - self._last_push >= self.push_interval:
            self._push()

    def on_epoch_end(self, trainer: TrainerView, record: dict[str, Any]) -> None:
        self._pending = record  # read at the next hook, after every callback has added its fields

    def on_train_end(self, trainer: TrainerView, result: dict[str, Any]) -> None:
        self._observe_pending()
        for split, tasks in result.get("final", {}).items():
            for task, values in tasks.items():
                for metric, value in values.items():
                    self._set("mtlflow_final_metric", value, task=task, split=split, metric=metric)
        now = time.time()
        self._set("mtlflow_train_running", 0)
        self._set("mtlflow_train_last_success_timestamp_seconds", now)
        self._set("mtlflow_train_last_progress_timestamp_seconds", now)
        self._flush()

    def on_train_failed(self, trainer: TrainerView, exc: BaseException) -> None:
        self._observe_pending()
        self._set("mtlflow_train_running", 0)
        self._set("mtlflow_train_failed", 1)
        self._set("mtlflow_train_nonfinite_loss", int(isinstance(exc, NonFiniteLossError)))
        self._flush()

    def grouping_key(self) -> dict[str, str]:
        """The run's Pushgateway grouping key: its identity labels, plus ``pipeline_run`` when it trains for a
        pipeline run (the gateway adds that label to the group's series; the run's exit handler deletes the
        groups by it)."""
        extra = {catalog.PIPELINE_RUN_LABEL: self.pipeline_run} if self.pipeline_run else {}
        return {**self.labels, **extra}

    def close(self) -> None:
        """Stop serving ``/metrics`` and the push thread."""
        if self.pusher is not None:
            self.pusher.close()
        if self.server is not None:
            self.server.close()

    # -- internals -----------------------------------------------------------------------------
    def _set(self, name: str, value: float, **extra: str) -> None:
        self.metrics.set(name, {**self.labels, **extra}, value)

    def _push(self) -> None:
        self._last_push = time.time()
        if self.pusher is not None:
            self.pusher.request()

    def _flush(self) -> None:
        if self.pusher is not None:
            self.pusher.flush()

    def _observe_pending(self) -> bool:
        record, self._pending = self._pending, None
        if record is None:
            return False
        self._observe(record)
        return True

    def _observe(self, record: Mapping[str, Any], count_only: bool = False) -> None:
        """Export one epoch record; ``count_only`` adds only its counts (steps, teleports)."""
        self.metrics.inc("mtlflow_train_steps_total", self.labels, record.get("steps", 0))
        cost = record.get("cost")
        if isinstance(cost, Mapping) and "teleports" in cost:
            self.metrics.inc("mtlflow_teleports_total", self.labels, float(cost["teleports"]))
        if count_only:
            return
        now = time.time()
        self._set("mtlflow_train_epoch", record["epoch"])
        self._set("mtlflow_train_last_epoch_timestamp_seconds", now)
        self._set("mtlflow_train_last_progress_timestamp_seconds", now)
        for task, value in record.get("train_loss", {}).items():
            self._set("mtlflow_train_loss", value, task=task)
        for split, tasks in record.get("splits", {}).items():
            for task, values in tasks.items():
                for metric, value in values.items():
                    if metric == "loss":
                        self._set("mtlflow_eval_loss", value, task=task, split=split)
                    else:
                        self._set("mtlflow_eval_metric", value, task=task, split=split, metric=metric)
        for field, name in (("step_seconds_median", "mtlflow_train_step_median_seconds"),
                            ("solver_seconds_median", "mtlflow_solver_median_seconds"),
                            ("epoch_seconds", "mtlflow_train_epoch_seconds"),
                            ("samples_per_second", "mtlflow_train_samples_per_second"),
                            ("conflict_ratio", "mtlflow_gradient_conflict_ratio")):
            if field in record:
                self._set(name, record[field])
        if "peak_memory_bytes" in record:
            self._set("mtlflow_train_peak_memory_bytes", record["peak_memory_bytes"], device=self._device)
        for field, name in (("cosine_to_mean", "mtlflow_gradient_cosine_to_mean"),
                            ("method_weights_mean", "mtlflow_method_weight")):
            for task, value in record.get(field, {}).items():
                self._set(name, value, task=task)


@contextlib.contextmanager
def training_exporters(pushgateway: str | None = None, metrics_port: int | None = None, pipeline: str = CLI_PIPELINE,
                       run: str = "", pipeline_run: str = "") -> Iterator[list[Callback]]:
    """The exporter callbacks for ``jobs.train(..., callbacks=...)``: none when there is neither a
    Pushgateway (argument or ``$MTLFLOW_PUSHGATEWAY``) nor a metrics port; closed on exit. ``run``:
    the run's ``run`` label (default: the run directory's name); ``pipeline_run``: the name of the pipeline
    run it trains for, added to the grouping key (empty: none)."""
    gateway = resolve_pushgateway(pushgateway)
    if gateway is None and metrics_port is None:
        yield []
        return
    exporter = PrometheusExporter(pushgateway=gateway, metrics_port=metrics_port, pipeline=pipeline, run=run,
                                  pipeline_run=pipeline_run)
    try:
        yield [exporter]
    finally:
        exporter.close()


def export_summary(summary: Mapping[str, Any], pushgateway: str | None, pipeline: str = CLI_PIPELINE,
                   run: str = CLI_PIPELINE, timeout: float = DEFAULT_PUSH_TIMEOUT) -> bool:
    """Push a sweep comparison (``jobs.aggregate``'s summary): Δm%, mean rank, hypervolume and Pareto
    membership per method. Grouped by (pipeline, benchmark, run), ``run`` being the pipeline run's name
    (``cli`` from the command line). False when off or the push failed."""
    gateway = resolve_pushgateway(pushgateway)
    if gateway is None:
        return False
    metrics = MetricSet(catalog.AGGREGATE_METRICS)
    group = {"pipeline": pipeline or CLI_PIPELINE, "benchmark": summary.get("dataset", summary["benchmark"]),
             "run": run or CLI_PIPELINE}
    for label, row in summary["methods"].items():
        labels = {**group, "method": label}
        for field, reference in (("delta_m", "own"), ("delta_m_paper", "paper")):
            if field in row:
                metrics.set("mtlflow_delta_m_percent", {**labels, "reference": reference}, row[field])
        if row.get("mean_rank") is not None:
            metrics.set("mtlflow_mean_rank", labels, row["mean_rank"])
        metrics.set("mtlflow_hypervolume", labels, row["hypervolume"])
        metrics.set("mtlflow_pareto_optimal", labels, int(bool(row["pareto_optimal"])))
    metrics.set("mtlflow_aggregate_last_success_timestamp_seconds", group, time.time())
    return push_once(gateway, catalog.AGGREGATE_JOB, group, metrics.registry, timeout=timeout)


def export_run_status(pushgateway: str | None, pipeline: str, run: str, state: str,
                      finished_unix: float | None = None, timeout: float = DEFAULT_PUSH_TIMEOUT) -> bool:
    """Push how a pipeline run ended (the exit handler's record), grouped by (pipeline, run): runs that
    end at the same time keep their own series."""
    gateway = resolve_pushgateway(pushgateway)
    if gateway is None:
        return False
    metrics = MetricSet(catalog.PIPELINE_METRICS)
    labels = {"pipeline": pipeline, "run": run}
    finished = time.time() if finished_unix is None else finished_unix
    succeeded = state == "SUCCEEDED"
    metrics.set("mtlflow_pipeline_last_run_succeeded", labels, int(succeeded))
    metrics.set("mtlflow_pipeline_last_run_timestamp_seconds", labels, finished)
    if succeeded:  # a failed run has no success time
        metrics.set("mtlflow_pipeline_last_success_timestamp_seconds", labels, finished)
    metrics.set("mtlflow_pipeline_last_run_info", {**labels, "state": state}, 1)
    return push_once(gateway, catalog.PIPELINE_JOB, labels, metrics.registry, timeout=timeout)


def export_decision(decision: Mapping[str, Any], pushgateway: str | None, pipeline: str = CLI_PIPELINE,
                    run: str = CLI_PIPELINE, timeout: float = DEFAULT_PUSH_TIMEOUT) -> bool:
    """Push a retrain gate decision (:func:`mtlflow.jobs.champion.decide`): promoted or not, both models'
    scores on the shared test split, the error differences with their intervals, the number of paired
    examples. Grouped by (pipeline, benchmark, run). False when off or the push failed."""
    gateway = resolve_pushgateway(pushgateway)
    if gateway is None:
        return False
    metrics = MetricSet(catalog.GATE_METRICS)
    group = {"pipeline": pipeline or CLI_PIPELINE, "benchmark": decision["benchmark"], "run": run or CLI_PIPELINE}
    metrics.set("mtlflow_retrain_promoted", group, int(bool(decision["promote"])))
    metrics.set("mtlflow_retrain_model_error", {**group, "model": "candidate"}, decision["candidate"]["error"])
    if decision.get("champion"):
        metrics.set("mtlflow_retrain_model_error", {**group, "model": "champion"}, decision["champion"]["error"])
    if decision.get("gate"):
        gate = decision["gate"]
        for task, diff in (("all", gate["combined"]), *gate["tasks"].items()):
            for bound, key in (("estimate", "mean_difference"), ("low", "low"), ("high", "high")):
                metrics.set("mtlflow_retrain_error_difference", {**group, "task": task, "bound": bound}, diff[key])
        metrics.set("mtlflow_retrain_test_examples", group, gate["combined"]["n"])
    metrics.set("mtlflow_retrain_decision_timestamp_seconds", group, decision["decided_unix"])
    return push_once(gateway, catalog.GATE_JOB, group, metrics.registry, timeout=timeout)
