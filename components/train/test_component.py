import json
from pathlib import Path

import pytest
import torch

from mtlflow.components.conftest import train_artifacts
from mtlflow.components.train.component import train
from mtlflow.core.errors import DataError


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


def test_single_task_reference_trains_one_head(tiny_runs):
    run = json.loads((Path(tiny_runs["ref-left"]["run"].path) / "run.json").read_text())
    assert run["tasks"] == ["left"] and run["kind"] == "single-task"


def test_train_refuses_data_with_another_hash(tiny_dataset, tmp_path):
    from kfp import dsl

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
