"""Shared fixtures of the component tests: a tiny prepared dataset and tiny trained runs, as real
KFP artifacts (``Dataset``/``Artifact`` objects pointing at real files)."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"n_train": 200, "n_val": 64, "n_test": 64}


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    from kfp import dsl

    from mtlflow.components.prepare_data.component import prepare_data

    data = dsl.Dataset(uri=str(tmp_path_factory.mktemp("artifacts") / "data"))
    tasks = prepare_data.python_func(benchmark="multimnist", data_options=dict(TINY), data=data)
    return data, tasks


def train_artifacts(root, name):
    from kfp import dsl

    return dict(run=dsl.Artifact(uri=str(root / f"{name}-run")), model=dsl.Model(uri=str(root / f"{name}.pt")),
                metrics=dsl.Metrics(uri=str(root / f"{name}-metrics.json")),
                report=dsl.HTML(uri=str(root / f"{name}-report.html")),
                summary=dsl.Markdown(uri=str(root / f"{name}-summary.md")))


@pytest.fixture(scope="session")
def tiny_runs(tiny_dataset, tmp_path_factory):
    """Two method runs and two single-task references trained through the train component."""
    from mtlflow.components.train.component import train

    data, tasks = tiny_dataset
    root = tmp_path_factory.mktemp("runs")
    specs = {"ls": {"method": "ls", "seed": 0, "hparams": {}},
             "mgda": {"method": "mgda", "seed": 0, "hparams": {}},
             "ref-left": {"method": "ls", "seed": 0, "hparams": {}, "tasks": ["left"]},
             "ref-right": {"method": "ls", "seed": 0, "hparams": {}, "tasks": ["right"]}}
    out = {}
    for name, spec in specs.items():
        arts = train_artifacts(root, name)
        train.python_func(data=data, run_spec=json.dumps(spec), epochs=1,
                          train_options={"batch_size": 64}, **arts)
        out[name] = arts
    return out
