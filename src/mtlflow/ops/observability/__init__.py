"""Observability: Prometheus metrics of training runs, sweeps and pipeline runs; progress of local runs.

* :mod:`~mtlflow.ops.observability.catalog` -- every exported metric (name, type, labels, meaning);
* :mod:`~mtlflow.ops.observability.exporter` -- :class:`PrometheusExporter` (a trainer callback pushing to a
  Pushgateway and/or serving ``/metrics``), :func:`export_summary` (Δm% per method of a sweep) and
  :func:`export_run_status` (how a pipeline run ended) and :func:`export_decision` (a retrain gate's decision);
* :mod:`~mtlflow.ops.observability.prometheus` -- registries, the non-blocking pusher, the ``/metrics`` server;
* :mod:`~mtlflow.ops.observability.progress` -- task progress and ETA of local pipeline runs.

``prometheus_client`` is imported only when an exporter is built.
"""

from mtlflow.ops.observability.exporter import (
    PrometheusExporter,
    export_decision,
    export_run_status,
    export_summary,
    training_exporters,
)
from mtlflow.ops.observability.prometheus import PUSHGATEWAY_ENV, resolve_pushgateway

__all__ = ["PUSHGATEWAY_ENV", "PrometheusExporter", "export_decision", "export_run_status", "export_summary",
           "resolve_pushgateway", "training_exporters"]
