"""Prometheus export against a real Pushgateway (Debian's prometheus-pushgateway on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
import torch

from prometheus_support import free_port, http_get, parse_samples, sample

#: the analytic toy problem: steps take microseconds, so these tests measure the exporter, not torch
TOY = {"max_steps_per_epoch": 5, "progress": False}


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    from mtlflow import jobs

    out = tmp_path_factory.mktemp("toy") / "data"
    jobs.prepare("toy", out, steps_per_epoch=20)
    return out


def _identity(run_dir, pipeline: str, run_label: str = "") -> dict[str, str]:
    from mtlflow import jobs

    run = jobs.read_run(run_dir)["run"]
    return {"job": "mtlflow_train", "pipeline": pipeline, "benchmark": run["benchmark"],
            "method": jobs.run_label(run), "seed": "0", "tasks": "all", "run": run_label or run_dir.name}


def test_training_telemetry_reaches_the_pushgateway(exported_sweep):
    samples = parse_samples(exported_sweep.text)
    ident = _identity(exported_sweep.run_dir, "test-sweep")
    metrics = json.loads((exported_sweep.run_dir / "metrics.json").read_text())
    last = metrics["epochs"][-1]
    assert sample(samples, "mtlflow_train_epoch", **ident) == 2
    assert sample(samples, "mtlflow_train_planned_epochs", **ident) == 2
    assert sample(samples, "mtlflow_train_steps_total", **ident) == sum(e["steps"] for e in metrics["epochs"]) == 2
    # the stand-in COST callback ran after the exporter; its teleports are counted all the same
    assert sample(samples, "mtlflow_teleports_total", **ident) == 6
    for task in ("left", "right"):
        assert sample(samples, "mtlflow_train_loss", task=task, **ident) == pytest.approx(last["train_loss"][task])
        assert sample(samples, "mtlflow_eval_metric", task=task, split="test", metric="acc", **ident) == \
            pytest.approx(last["splits"]["test"][task]["acc"])
        assert sample(samples, "mtlflow_eval_loss", task=task, split="val", **ident) == \
            pytest.approx(last["splits"]["val"][task]["loss"])
        assert sample(samples, "mtlflow_final_metric", task=task, split="test", metric="acc", **ident) == \
            pytest.approx(metrics["final"]["test"][task]["acc"])
        assert sample(samples, "mtlflow_gradient_cosine_to_mean", task=task, **ident) == \
            pytest.approx(last["cosine_to_mean"][task])
        assert sample(samples, "mtlflow_method_weight", task=task, **ident) == \
            pytest.approx(last["method_weights_mean"][task])
    assert sample(samples, "mtlflow_gradient_conflict_ratio", **ident) == pytest.approx(last["conflict_ratio"])
    assert sample(samples, "mtlflow_train_step_median_seconds", **ident) == pytest.approx(last["step_seconds_median"])
    assert sample(samples, "mtlflow_solver_median_seconds", **ident) == pytest.approx(last["solver_seconds_median"])
    assert sample(samples, "mtlflow_train_samples_per_second", **ident) == pytest.approx(last["samples_per_second"])
    assert sample(samples, "mtlflow_train_peak_memory_bytes", device="cpu", **ident) == last["peak_memory_bytes"]
    assert sample(samples, "mtlflow_train_running", **ident) == 0
    assert sample(samples, "mtlflow_train_failed", **ident) == 0
    # set when the run finished, i.e. when metrics.json was last written (not "now": a loaded machine may run
    # this test long after the shared fixture trained)
    finished = (exported_sweep.run_dir / "metrics.json").stat().st_mtime
    assert abs(sample(samples, "mtlflow_train_last_success_timestamp_seconds", **ident) - finished) < 30
    # the standard JSON API of the gateway lists the same group
    groups = exported_sweep.gateway.groups()
    assert any(g["labels"] == {**ident, "instance": ""} or g["labels"] == ident for g in groups)


def test_sweep_comparison_and_pipeline_status_are_exported(exported_sweep):
    samples = parse_samples(exported_sweep.text)
    group = {"job": "mtlflow_aggregate", "pipeline": "test-sweep", "benchmark": "multimnist"}
    for label, row in exported_sweep.summary["methods"].items():
        assert sample(samples, "mtlflow_delta_m_percent", method=label, reference="own", **group) == \
            pytest.approx(row["delta_m"])
        assert sample(samples, "mtlflow_mean_rank", method=label, **group) == pytest.approx(row["mean_rank"])
        assert sample(samples, "mtlflow_pareto_optimal", method=label, **group) == int(row["pareto_optimal"])
    status = {"job": "mtlflow_pipeline", "pipeline": "test-sweep"}
    assert sample(samples, "mtlflow_pipeline_last_run_succeeded", run="test-sweep-run-1", **status) == 0
    assert sample(samples, "mtlflow_pipeline_last_run_info", run="test-sweep-run-1", state="FAILED", **status) == 1
    assert sample(samples, "mtlflow_pipeline_last_run_succeeded", run="test-sweep-run-2", **status) == 1
    assert sample(samples, "mtlflow_pipeline_last_success_timestamp_seconds", **status) == \
        sample(samples, "mtlflow_pipeline_last_run_timestamp_seconds", run="test-sweep-run-2", **status)


def test_concurrent_pipeline_runs_keep_their_own_status_and_comparison(pushgateway, exported_sweep):
    """Two runs of one pipeline ending at once, pushed from two threads: each keeps its own series (with
    the pipeline name as the only key, the second push replaced the first run's)."""
    from concurrent.futures import ThreadPoolExecutor

    from mtlflow.ops.observability import export_run_status, export_summary

    label = next(iter(exported_sweep.summary["methods"]))
    other = json.loads(json.dumps(exported_sweep.summary))
    other["methods"][label]["delta_m"] += 10.0
    runs = {"nightly-a": ("SUCCEEDED", 1000.0, exported_sweep.summary),
            "nightly-b": ("FAILED", 1000.5, other)}

    def push(run):
        state, finished, summary = runs[run]
        return (export_run_status(pushgateway.url, pipeline="concurrent", run=run, state=state, finished_unix=finished)
                and export_summary(summary, pushgateway.url, pipeline="concurrent", run=run))

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(push, runs))
    groups = [g["labels"] for g in pushgateway.groups() if g["labels"].get("pipeline") == "concurrent"]
    assert sorted((g["job"], g["run"]) for g in groups) == [("mtlflow_aggregate", "nightly-a"),
                                                            ("mtlflow_aggregate", "nightly-b"),
                                                            ("mtlflow_pipeline", "nightly-a"),
                                                            ("mtlflow_pipeline", "nightly-b")]
    samples = parse_samples(pushgateway.metrics_text())
    for run, (state, finished, summary) in runs.items():
        status = {"pipeline": "concurrent", "run": run}
        assert sample(samples, "mtlflow_pipeline_last_run_succeeded", **status) == int(state == "SUCCEEDED")
        assert sample(samples, "mtlflow_pipeline_last_run_timestamp_seconds", **status) == finished
        assert sample(samples, "mtlflow_pipeline_last_run_info", state=state, **status) == 1
        assert sample(samples, "mtlflow_delta_m_percent", method=label, reference="own", **status) == \
            pytest.approx(summary["methods"][label]["delta_m"])
    assert [lab["run"] for name, lab, _ in samples
            if name == "mtlflow_pipeline_last_success_timestamp_seconds" and lab["pipeline"] == "concurrent"] == \
        ["nightly-a"]


def test_overlapping_trainings_of_one_method_and_seed_keep_their_own_series(pushgateway, toy_data, tmp_path):
    """Two trainings of the same method and seed in one pipeline (other options, so other run keys)
    whose pushes interleave: run A starts, run B trains and finishes, then A finishes. Each keeps its
    own series; keyed by (pipeline, benchmark, method, seed, tasks) alone, B's pushes replaced A's."""
    from mtlflow import jobs
    from mtlflow.core.callbacks import Callback
    from mtlflow.ops.observability import PrometheusExporter

    def train(run, epochs, inner=()):
        exporter = PrometheusExporter(pushgateway=pushgateway.url, pipeline="overlap", run=run)
        try:
            jobs.train(toy_data, tmp_path / run, method="ls", epochs=epochs, callbacks=[exporter, *inner], **TOY)
        finally:
            exporter.close()

    class TrainBWhileARuns(Callback):
        name = "overlap"

        def on_epoch_start(self, trainer, epoch):
            if epoch == 1:
                train("run-b", epochs=1)
                samples = parse_samples(pushgateway.metrics_text())
                assert sample(samples, "mtlflow_train_running", pipeline="overlap", run="run-a") == 1

    train("run-a", epochs=2, inner=[TrainBWhileARuns()])
    samples = parse_samples(pushgateway.metrics_text())
    for run, epochs in (("run-a", 2), ("run-b", 1)):
        ident = _identity(tmp_path / run, "overlap", run)
        assert sample(samples, "mtlflow_train_epoch", **ident) == epochs
        assert sample(samples, "mtlflow_train_planned_epochs", **ident) == epochs
        assert sample(samples, "mtlflow_train_running", **ident) == 0
    groups = [g["labels"]["run"] for g in pushgateway.groups() if g["labels"].get("pipeline") == "overlap"]
    assert sorted(groups) == ["run-a", "run-b"]


def test_nan_loss_is_exported_and_the_previous_success_kept(pushgateway, toy_data, tmp_path):
    from mtlflow import jobs
    from mtlflow.core.callbacks import Callback
    from mtlflow.core.errors import NonFiniteLossError
    from mtlflow.ops.observability import PrometheusExporter

    class PoisonWeights(Callback):
        name = "poison"

        def on_epoch_start(self, trainer, epoch):
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.fill_(float("nan"))

    def run(extra, out):  # two attempts of one run (one run key): a retry after the first one finished
        exporter = PrometheusExporter(pushgateway=pushgateway.url, pipeline="nan-test", run="nan-test-run")
        try:
            jobs.train(toy_data, out, method="ls", epochs=1, callbacks=[exporter, *extra], **TOY)
        finally:
            exporter.close()

    run([], tmp_path / "ok")
    ident = _identity(tmp_path / "ok", "nan-test", "nan-test-run")
    succeeded = sample(parse_samples(pushgateway.metrics_text()), "mtlflow_train_last_success_timestamp_seconds",
                       **ident)
    with pytest.raises(NonFiniteLossError):
        run([PoisonWeights()], tmp_path / "nan")
    samples = parse_samples(pushgateway.metrics_text())
    assert sample(samples, "mtlflow_train_nonfinite_loss", **ident) == 1
    assert sample(samples, "mtlflow_train_failed", **ident) == 1
    assert sample(samples, "mtlflow_train_running", **ident) == 0
    assert sample(samples, "mtlflow_train_last_success_timestamp_seconds", **ident) == succeeded


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a hung gateway)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_gateway_outage_neither_stops_nor_slows_training(outage, toy_data, tmp_path, caplog, request):
    from mtlflow import jobs
    from mtlflow.ops.observability import PrometheusExporter

    url = f"http://127.0.0.1:{free_port()}" if outage == "refused" else request.getfixturevalue("silent_server")
    timeout = 0.5
    # push_interval=0: a push is requested after every step; none of them may wait for the network
    exporter = PrometheusExporter(pushgateway=url, push_timeout=timeout, push_interval=0.0)
    hook_seconds: dict[str, float] = {}
    for hook in ("on_train_start", "on_epoch_start", "after_optimizer_step", "on_epoch_end", "on_train_end"):
        original = getattr(exporter, hook)

        def timed(*args, _original=original, _hook=hook):
            started = time.perf_counter()
            _original(*args)
            hook_seconds[_hook] = hook_seconds.get(_hook, 0.0) + time.perf_counter() - started
        setattr(exporter, hook, timed)
    with caplog.at_level(logging.WARNING, logger="mtlflow.ops.observability"):
        try:
            result = jobs.train(toy_data, tmp_path / "run", method="mgda", epochs=3, callbacks=[exporter], **TOY)
        finally:
            exporter.close()
    assert result["epochs"] == 3
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "completed"
    warnings = [r for r in caplog.records if r.name == "mtlflow.ops.observability"]
    assert len(warnings) == 1 and url in warnings[0].getMessage()
    # after the first failure no push is attempted until retry_after (60 s) -- except the final flush
    assert exporter.pusher.failures <= 2 and exporter.pusher.pushes == 0
    during = sum(v for k, v in hook_seconds.items() if k != "on_train_end")
    assert during < 0.25, hook_seconds
    assert hook_seconds["on_train_end"] < timeout + 1.5, hook_seconds


def test_metrics_port_and_env_pushgateway_from_the_cli(pushgateway, toy_data, tmp_path, monkeypatch, capsys):
    """``mtlflow train --metrics-port`` serves /metrics while it trains (scraped over HTTP from inside
    epoch 2) and ``$MTLFLOW_PUSHGATEWAY`` makes it push."""
    from mtlflow import jobs
    from mtlflow.cli import main
    from mtlflow.core.callbacks import Callback

    port = free_port()
    scraped: list[str] = []

    class ScrapeDuringTraining(Callback):
        name = "scraper"

        def on_epoch_start(self, trainer, epoch):
            if epoch == 2:
                scraped.append(http_get(f"http://127.0.0.1:{port}/metrics"))

    real_train = jobs.train

    def train_with_scraper(*args, callbacks=(), **kwargs):
        return real_train(*args, callbacks=[*callbacks, ScrapeDuringTraining()], **kwargs)

    monkeypatch.setattr(jobs, "train", train_with_scraper)
    monkeypatch.setenv("MTLFLOW_PUSHGATEWAY", pushgateway.url)
    code = main(["train", "--data", str(toy_data), "--method", "mgda", "--epochs", "3", "--max-steps-per-epoch", "5",
                 "--no-progress", "--metrics-port", str(port), "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    served = parse_samples(scraped[0])
    ident = {"pipeline": "cli", "benchmark": "toy", "method": "mgda", "seed": "0", "tasks": "all", "run": "run"}
    assert sample(served, "mtlflow_train_running", **ident) == 1
    assert sample(served, "mtlflow_train_epoch", **ident) == 1
    assert sample(served, "mtlflow_train_steps_total", **ident) == 5
    pushed = parse_samples(pushgateway.metrics_text())
    assert sample(pushed, "mtlflow_train_epoch", job="mtlflow_train", **ident) == 3
    assert sample(pushed, "mtlflow_train_running", job="mtlflow_train", **ident) == 0
    with pytest.raises(OSError):  # the server stops with the run
        http_get(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_malformed_pushgateway_is_rejected_before_training(toy_data, tmp_path, capsys):
    from mtlflow.cli import main

    code = main(["train", "--data", str(toy_data), "--pushgateway", "http://gateway:port",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Pushgateway address" in err[0] and "host:port" in err[0]
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_exports_its_totals_so_far(toy_data, tmp_path):
    from mtlflow import jobs
    from mtlflow.ops.observability import PrometheusExporter

    jobs.train(toy_data, tmp_path / "run", method="mgda", epochs=2, **TOY)
    exporter = PrometheusExporter()  # no gateway: the registry alone
    jobs.train(toy_data, tmp_path / "run", method="mgda", epochs=3, resume=True, callbacks=[exporter], **TOY)
    samples = parse_samples(exporter.metrics.exposition())
    ident = {"pipeline": "cli", "benchmark": "toy", "method": "mgda", "seed": "0", "tasks": "all"}
    assert sample(samples, "mtlflow_train_steps_total", **ident) == 15  # 2 epochs restored + 1 trained, 5 steps each
    assert sample(samples, "mtlflow_train_epoch", **ident) == 3
    assert sample(samples, "mtlflow_train_running", **ident) == 0


def test_pipelines_take_a_pushgateway_parameter_and_validate_it():
    import inspect

    from mtlflow.core.errors import InvalidParameterError
    from mtlflow.pipelines import runner

    for name in ("benchmark_sweep", "retrain", "distributed_train"):
        parameter = inspect.signature(runner.get_pipeline(name).pipeline_func).parameters["pushgateway"]
        assert parameter.default == ""  # off unless asked for: local and CI runs stay hermetic
    runner.validate_params("main", {"pushgateway": "http://mtlflow-pushgateway.mtlflow.svc:9091"})
    with pytest.raises(InvalidParameterError, match="Pushgateway address"):
        runner.validate_params("retrain", {"pushgateway": "ftp://gateway"})


def test_export_steps_are_never_cached_on_the_cluster(tmp_path):
    import yaml

    from mtlflow.pipelines import runner

    ir = next(yaml.safe_load_all(runner.compile_pipeline(tmp_path / "sweep.yaml", "benchmark_sweep").read_text()))
    tasks = {name: task for comp in ir["components"].values() if "dag" in comp
             for name, task in comp["dag"]["tasks"].items()}
    tasks.update(ir["root"]["dag"]["tasks"])
    for name in ("aggregate", "record-status", "train"):  # they push; a cache hit would push nothing
        assert tasks[name]["cachingOptions"] == {}, name
