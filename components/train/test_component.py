import json
from pathlib import Path

import pytest
import torch
from kfp import dsl

from mtlflow import jobs
from mtlflow.components.conftest import train_artifacts
from mtlflow.components.train.component import train
from mtlflow.config.pipeline import run_key
from mtlflow.core.errors import DataError
from mtlflow.jobs import pipeline_steps


def test_train_writes_run_model_and_metrics(tiny_runs, tiny_dataset):
    data, _ = tiny_dataset
    arts = tiny_runs["mgda"]
    run_dir = Path(arts["run"].path)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert arts["run"].metadata["data_hash"] == data.metadata["content_hash"]
    assert arts["model"].metadata["method"] == "mgda"
    blob = torch.load(arts["model"].path, weights_only=False)
    assert blob["method"] == "mgda" and set(blob["tasks"]) == {"left", "right"}
    logged = arts["metrics"].metadata
    assert {"test.left.acc", "test.right.acc", "test.left.loss"} <= set(logged)
    assert json.loads(Path(arts["metrics"].path).read_text())["left"]["acc"] == logged["test.left.acc"]


def test_train_shows_whether_the_run_converged_in_the_ui(tiny_runs):
    arts = tiny_runs["mgda"]
    training = json.loads((Path(arts["run"].path) / "run.json").read_text())["training"]
    assert arts["metrics"].metadata["converged"] == float(training["converged"])
    assert arts["model"].metadata["convergence"] == training["convergence"]
    if not training["converged"]:
        assert training["convergence"].startswith(("not converged: train longer", "validation split too small"))


def test_single_task_reference_trains_one_head(tiny_runs):
    run = json.loads((Path(tiny_runs["ref-left"]["run"].path) / "run.json").read_text())
    assert run["tasks"] == ["left"] and run["kind"] == "single-task"


def test_train_refuses_data_with_another_hash(tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    tampered = dsl.Dataset(uri=data.uri, metadata={**data.metadata, "content_hash": "0" * 64})
    spec = json.dumps({"method": "ls", "seed": 0, "hparams": {}})
    with pytest.raises(DataError, match="expected 000000000000"):
        train.python_func(data=tampered, run_spec=spec, epochs=1, train_options={}, **train_artifacts(tmp_path, "x"))
    assert not (tmp_path / "x-run" / "run.json").exists()


def test_train_writes_an_html_report_and_a_markdown_summary(tiny_runs):
    arts = tiny_runs["mgda"]
    metrics = json.loads((Path(arts["run"].path) / "metrics.json").read_text())
    page = Path(arts["report"].path).read_text()
    assert "<h1>mtlflow run: mgda on multimnist (seed 0)</h1>" in page
    assert page.count('src="data:image/png;base64,') == 1  # learning curves and telemetry
    assert "<h2>Final metrics</h2>" in page and "conflict ratio" in page
    summary = Path(arts["summary"].path).read_text()
    assert summary.startswith("# mgda on multimnist (seed 0)") and "status: **completed**" in summary
    acc = metrics["final"]["test"]["left"]["acc"]
    assert "| left | " in summary and f"{acc:.4g}" in summary


SPEC = json.dumps({"method": "ls", "seed": 0, "hparams": {}})
FAST = {"max_steps_per_epoch": 5}


def _train_step(data, root, name, tmp_path, spec=SPEC, epochs=1, options=FAST):
    arts = train_artifacts(tmp_path, name)
    return pipeline_steps.train(data.path, dict(data.metadata), arts["run"].path, arts["model"].path,
                                arts["report"].path, arts["summary"].path, spec, epochs, options,
                                checkpoint_root=str(root))


class MarkFirstEpochThenFail:
    """A trainer callback: tags epoch 1's record (so a later run shows whether it kept that epoch) and,
    with ``fail``, raises at the start of epoch 2 -- a run that stops with an error, not an interruption."""

    name = "mark-then-fail"

    def __init__(self, error: type[BaseException] = RuntimeError):
        self.error = error

    def __getattr__(self, hook):  # every other trainer hook: nothing to do
        return lambda *args, **kwargs: None

    def on_epoch_end(self, trainer, record):
        record["marker"] = "first attempt"

    def on_epoch_start(self, trainer, epoch):
        if epoch == 2:
            raise self.error("stopped on purpose")


def test_run_key_is_the_inputs_and_a_finished_run_is_reused(toy_dataset, tmp_path):
    data = toy_dataset
    root = tmp_path / "checkpoints"
    first = _train_step(data, root, "first", tmp_path)
    key = first["metadata"]["run_key"]
    assert first["state"] == "resume" and key == run_key(SPEC, data.metadata["content_hash"], 1, FAST)
    run_dir = root / key
    trained = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    # the same inputs in another pipeline run: the finished run is reused, nothing is trained or rewritten
    second = _train_step(data, root, "second", tmp_path)
    assert second["state"] == "reuse" and second["metadata"]["run_key"] == key
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == trained
    assert second["metrics"] == first["metrics"]
    assert (tmp_path / "second.pt").read_bytes() == (tmp_path / "first.pt").read_bytes()
    # other inputs, another run directory
    other = _train_step(data, root, "other", tmp_path, spec=json.dumps({"method": "ls", "seed": 1, "hparams": {}}))
    assert other["state"] == "resume" and other["metadata"]["run_key"] != key
    assert run_key(SPEC, data.metadata["content_hash"], 2, FAST) != key != \
        run_key(SPEC, data.metadata["content_hash"], 1, {**FAST, "lr": 0.5})
    assert sorted(p.name for p in root.iterdir()) == sorted([key, other["metadata"]["run_key"]])


@pytest.mark.parametrize("error, state, kept", [(RuntimeError, "retrain", False), (KeyboardInterrupt, "resume", True)])
def test_a_failed_run_is_trained_again_and_an_interrupted_one_resumed(toy_dataset, tmp_path, error, state, kept):
    data = toy_dataset
    root = tmp_path / "checkpoints"
    run_dir = root / run_key(SPEC, data.metadata["content_hash"], 2, FAST)
    with pytest.raises(error):  # the same training, stopped in epoch 2 after epoch 1's checkpoint
        jobs.train(data.path, run_dir, method="ls", seed=0, epochs=2, expected_hash=data.metadata["content_hash"],
                   progress=False, callbacks=[MarkFirstEpochThenFail(error)], **FAST)
    expected_status = "failed" if error is RuntimeError else "interrupted"
    assert json.loads((run_dir / "run.json").read_text())["status"] == expected_status
    result = _train_step(data, root, "again", tmp_path, epochs=2)
    assert result["state"] == state
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed" and len(metrics["epochs"]) == 2
    # a failed run is not reused, not even its first epoch; an interrupted one continues from it
    assert ("marker" in metrics["epochs"][0]) is kept
