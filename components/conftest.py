"""Shared fixtures of the component tests: a tiny prepared dataset and tiny trained runs, as real
KFP artifacts (``Dataset``/``Artifact`` objects pointing at real files)."""

from __future__ import annotations

import json
import os

import pytest
from kfp import dsl, local

from mtlflow.components.prepare_data.component import prepare_data
from mtlflow.components.train.component import train

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {"n_train": 200, "n_val": 64, "n_test": 64}


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    data = dsl.Dataset(uri=str(tmp_path_factory.mktemp("artifacts") / "data"))
    tasks = prepare_data.python_func(benchmark="multimnist", data_options=dict(TINY), data=data)
    return data, tasks


@pytest.fixture(scope="session")
def toy_dataset(tmp_path_factory):
    """The analytic toy problem as a Dataset artifact: its steps take microseconds, so the train tests
    that use it time the run-directory logic, not torch."""

    data = dsl.Dataset(uri=str(tmp_path_factory.mktemp("toy") / "data"))
    prepare_data.python_func(benchmark="toy", data_options={"steps_per_epoch": 20}, data=data)
    return data


def train_artifacts(root, name):
    return dict(run=dsl.Artifact(uri=str(root / f"{name}-run")), model=dsl.Model(uri=str(root / f"{name}.pt")),
                metrics=dsl.Metrics(uri=str(root / f"{name}-metrics.json")),
                report=dsl.HTML(uri=str(root / f"{name}-report.html")),
                summary=dsl.Markdown(uri=str(root / f"{name}-summary.md")))


@pytest.fixture(scope="session")
def tiny_runs(tiny_dataset, tmp_path_factory):
    """Two method runs and two single-task references trained through the train component."""

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


@pytest.fixture
def local_runner(tmp_path):
    """kfp.local's SubprocessRunner in this environment (no venv: the installed mtlflow), artifacts under
    ``tmp_path/artifacts``: each component runs in a subprocess through kfp's own executor."""

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "artifacts"),
               raise_on_error=True)
    return tmp_path / "artifacts"
