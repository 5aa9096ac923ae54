"""A real Prometheus Pushgateway for the tests, and one short training whose metrics it holds.

The Debian packages ``prometheus-pushgateway`` and ``prometheus`` (promtool) are installed with apt when
their binaries are missing (``make test-deps`` does the same); the gateway is bound to 127.0.0.1 on a
free port, waited for on ``/-/ready`` and stopped by its PID. Imported by ``tests/conftest.py`` so that
the session fixtures are shared by every test file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

GATEWAY_BINARY = "prometheus-pushgateway"
PROMTOOL = "promtool"
DEBIAN_PACKAGES = ("prometheus-pushgateway", "prometheus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def ensure_prometheus_binaries() -> None:
    """Install the Debian packages when a binary is missing (as root, with apt); else skip the test."""
    missing = [b for b in (GATEWAY_BINARY, PROMTOOL) if shutil.which(b) is None]
    if missing and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", *DEBIAN_PACKAGES]
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=900)
            subprocess.run(install, env=env, capture_output=True, timeout=900)
        missing = [b for b in (GATEWAY_BINARY, PROMTOOL) if shutil.which(b) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed and apt-get could not install them; run "
                    f"`make test-deps` (apt-get install {' '.join(DEBIAN_PACKAGES)})")


@dataclass
class Pushgateway:
    url: str
    pid: int

    def metrics_text(self) -> str:
        return http_get(f"{self.url}/metrics")

    def groups(self) -> list[dict[str, Any]]:
        """``/api/v1/metrics``: one entry per grouping key with its labels."""
        return json.loads(http_get(f"{self.url}/api/v1/metrics"))["data"]


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory) -> Pushgateway:
    ensure_prometheus_binaries()
    state = tmp_path_factory.mktemp("pushgateway")
    for _ in range(3):  # the free port may be taken between choosing and binding it
        port = free_port()
        proc = subprocess.Popen([GATEWAY_BINARY, f"--web.listen-address=127.0.0.1:{port}",
                                 f"--persistence.file={state / 'metrics.data'}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if urllib.request.urlopen(f"{url}/-/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        else:
            proc.kill()
            proc.wait()
            continue
        yield Pushgateway(url, proc.pid)
        os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait()
        return
    pytest.fail("the Pushgateway did not become ready on 127.0.0.1 in 3 attempts")


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample in a text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def sample(samples, name: str, **labels: str) -> float:
    """The one sample named ``name`` whose labels include ``labels``."""
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{len(found)} samples of {name} with {labels}"
    return found[0]


def teleport_counter(per_epoch: int):
    """A callback standing in for COST: ``record["cost"] = {"teleports": per_epoch}`` in every epoch
    record (the contract the exporter reads)."""
    from mtlflow.core.callbacks import Callback

    class TeleportCounter(Callback):
        name = "fake-cost"

        def on_epoch_end(self, trainer, record) -> None:
            record["cost"] = {"teleports": per_epoch}

    return TeleportCounter()


@dataclass
class ExportedSweep:
    """A training run, a comparison and a pipeline status pushed to the session Pushgateway."""

    gateway: Pushgateway
    run_dir: Path
    summary: dict[str, Any]
    text: str


@pytest.fixture(scope="session")
def exported_sweep(pushgateway, multimnist_small, tmp_path_factory) -> ExportedSweep:
    """MGDA trained 2 epochs with the exporter (and a stand-in COST adding 3 teleports per epoch),
    single-task references, the aggregate pushed, and the statuses of a FAILED and a SUCCEEDED pipeline run."""
    from mtlflow import jobs
    from mtlflow.jobs.compare.summary import to_json
    from mtlflow.ops.observability import PrometheusExporter, export_run_status, export_summary

    root = tmp_path_factory.mktemp("exported")
    tiny = {"batch_size": 32, "max_steps_per_epoch": 1, "progress": False}
    exporter = PrometheusExporter(pushgateway=pushgateway.url, pipeline="test-sweep")
    try:  # the exporter first: it must still see the fields that later callbacks add
        jobs.train(multimnist_small, root / "mgda", method="mgda", epochs=2,
                   callbacks=[exporter, teleport_counter(3)], **tiny)
    finally:
        exporter.close()
    for task in ("left", "right"):
        jobs.train(multimnist_small, root / f"ref-{task}", method="ls", tasks=[task], epochs=1, **tiny)
    # results.json's form: what the exporter (ops, below jobs) reads
    summary = to_json(jobs.aggregate([root / "mgda"], root / "results",
                                     reference_dirs=[root / "ref-left", root / "ref-right"]))
    assert export_summary(summary, pushgateway.url, pipeline="test-sweep")
    assert export_run_status(pushgateway.url, pipeline="test-sweep", run="test-sweep-run-1", state="FAILED")
    assert export_run_status(pushgateway.url, pipeline="test-sweep", run="test-sweep-run-2", state="SUCCEEDED")
    return ExportedSweep(pushgateway, root / "mgda", summary, pushgateway.metrics_text())
