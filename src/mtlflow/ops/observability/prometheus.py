"""Prometheus plumbing: a dedicated registry per exporter, pushing to a Pushgateway, serving ``/metrics``.

``prometheus_client`` is imported inside the functions, so importing mtlflow never needs it.

Pushing never stops or slows training: :class:`GatewayPusher` pushes from a daemon thread with a bounded
timeout, coalesces requests (only the latest state matters), logs ONE warning for the first failure and
after a failure waits ``retry_after`` seconds before trying again; only the final :meth:`~GatewayPusher.flush`
of a run waits, and at most ``timeout`` (+ a margin) seconds. Pushes use ``pushadd`` (HTTP POST): it
replaces only the metric names being pushed in the group, so a failed run does not erase the last
success timestamp of the previous one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from mtlflow.config.pipeline import check_gateway_address
from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops.observability.catalog import MetricSpec

log = logging.getLogger("mtlflow.ops.observability")

#: environment variable naming the Pushgateway when no --pushgateway / component parameter is given
PUSHGATEWAY_ENV = "MTLFLOW_PUSHGATEWAY"
#: seconds one push may take before it is abandoned
DEFAULT_PUSH_TIMEOUT = 2.0
#: seconds to wait after a failed push before the next attempt (the final flush always tries once)
DEFAULT_RETRY_AFTER = 60.0


def resolve_pushgateway(explicit: str | None) -> str | None:
    """The Pushgateway address: ``explicit`` when non-empty, else ``$MTLFLOW_PUSHGATEWAY``, else None (off)."""
    value = (explicit or os.environ.get(PUSHGATEWAY_ENV, "")).strip()
    if not value:
        return None
    check_gateway_address(value)
    return value


class MetricSet:
    """Gauges and counters of a list of catalogue entries in their own ``CollectorRegistry`` (the
    default registry carries process metrics that do not belong in a batch job's push)."""

    def __init__(self, specs: Iterable[MetricSpec]):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for entry in specs:
            kind = Counter if entry.kind == "counter" else Gauge
            self._metrics[entry.name] = kind(entry.base_name, entry.help, labelnames=entry.labels,
                                             registry=self.registry)

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        self._metrics[name].labels(**labels).set(float(value))

    def inc(self, name: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        if amount > 0:
            self._metrics[name].labels(**labels).inc(float(amount))
        else:  # create the series at its current value so that it is exported
            self._metrics[name].labels(**labels)

    def exposition(self) -> str:
        """The text format of everything in the registry (what ``/metrics`` serves)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def push_once(gateway: str, job: str, grouping_key: Mapping[str, str], registry: Any,
              timeout: float = DEFAULT_PUSH_TIMEOUT) -> bool:
    """One ``pushadd`` of ``registry``; a failure logs one warning and returns False (never raises)."""
    from prometheus_client import pushadd_to_gateway

    try:
        pushadd_to_gateway(gateway, job=job, registry=registry, grouping_key=dict(grouping_key), timeout=timeout)
        return True
    except Exception as exc:  # a monitoring outage must never fail the job
        log.warning("could not push metrics to the Pushgateway %s (%s: %s); the job continues without them",
                    gateway, type(exc).__name__, exc)
        return False


class GatewayPusher:
    """Pushes a registry from a background thread: :meth:`request` never blocks the caller."""

    def __init__(self, gateway: str, job: str, grouping_key: Mapping[str, str], registry: Any,
                 timeout: float = DEFAULT_PUSH_TIMEOUT, retry_after: float = DEFAULT_RETRY_AFTER):
        self.gateway, self.job, self.grouping_key = gateway, job, dict(grouping_key)
        self.registry, self.timeout, self.retry_after = registry, timeout, retry_after
        self.pushes = self.failures = 0
        self._cond = threading.Condition()
        # sequence numbers of push requests: asked for, being pushed, done, last pushed successfully
        self._requested = self._started = self._finished = self._succeeded = 0
        self._forced = self._stopping = False
        self._next_attempt = 0.0
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="mtlflow-pushgateway", daemon=True)
        self._thread.start()

    def request(self, force: bool = False) -> int:
        """Ask for a push of the registry's current state; returns the request's sequence number."""
        with self._cond:
            self._requested += 1
            self._forced = self._forced or force
            self._cond.notify_all()
            return self._requested

    def flush(self, timeout: float | None = None) -> bool:
        """Push now (even while waiting after a failure) and wait for it, at most ``timeout`` seconds
        (default: the push timeout plus one second). True when the push succeeded in time."""
        deadline = time.monotonic() + (self.timeout + 1.0 if timeout is None else timeout)
        ticket = self.request(force=True)
        with self._cond:
            while self._finished < ticket and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._succeeded >= ticket

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=self.timeout + 1.0)

    def _ready(self) -> bool:
        return self._requested > self._started and (self._forced or time.monotonic() >= self._next_attempt)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._ready():
                    waiting = self._requested > self._started
                    self._cond.wait(max(0.0, self._next_attempt - time.monotonic()) if waiting else None)
                if self._stopping:
                    return
                ticket, self._forced = self._requested, False
                self._started = ticket
            ok = self._push()
            with self._cond:
                self._finished = ticket
                if ok:
                    self._succeeded = ticket
                else:
                    self._next_attempt = time.monotonic() + self.retry_after
                self._cond.notify_all()

    def _push(self) -> bool:
        from prometheus_client import pushadd_to_gateway

        try:
            pushadd_to_gateway(self.gateway, job=self.job, registry=self.registry, grouping_key=self.grouping_key,
                               timeout=self.timeout)
            self.pushes += 1
            return True
        except Exception as exc:  # a monitoring outage must never fail or slow training
            self.failures += 1
            if not self._warned:
                self._warned = True
                log.warning("could not push metrics to the Pushgateway %s (%s: %s); training continues and "
                            "retries at most every %.0f s", self.gateway, type(exc).__name__, exc, self.retry_after)
            return False


class MetricsServer:
    """``/metrics`` of one registry over HTTP from a daemon thread (for a long-running trainer)."""

    def __init__(self, registry: Any, port: int, addr: str = "0.0.0.0"):
        from prometheus_client import start_http_server

        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidParameterError(f"metrics port {port!r} is not valid; use a port number 1-65535")
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            raise InvalidParameterError(f"cannot serve /metrics on {addr}:{port} ({exc.strerror}); "
                                        "choose another --metrics-port") from None
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
