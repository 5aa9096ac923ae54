"""The run directory's writers (`mtlflow.engine.rundir`) read an explicit `RunRecord` and the run's progress,
never the trainer (the trainer imports rundir; rundir imports no trainer, not even for annotations), and a
checkpoint written from a record comes back field for field, refused under another configuration or data."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.engine import rundir
from mtlflow.engine.trainer import Trainer

RUNDIR = Path(rundir.__file__)


def leaves(value):
    """Every tensor and scalar of nested dicts, lists and tuples, in order."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in (k, *leaves(v))]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y)
    if isinstance(x, np.ndarray):  # the RNG state of numpy
        return np.array_equal(x, y)
    return x == y


def test_rundir_imports_no_trainer_and_takes_none():
    tree = ast.parse(RUNDIR.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name and "trainer" in name}
    params = {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for arg in node.args.args}
    assert "trainer" not in params


@pytest.fixture
def trainer(tmp_path):
    jobs.prepare("toy", tmp_path / "data")
    bench, data = jobs.load_prepared(tmp_path / "data")
    run = Trainer(bench, data, RunConfig(method="famo", epochs=1, batch_size=4), tmp_path / "run", progress=False)
    for batch in list(run._loader(1))[:2]:  # a trained optimizer and method state
        run.train_step(batch, 1)
    run.history = [{"epoch": 1, "val_score": 0.5}]
    run.out_dir.mkdir()
    return run


def test_a_checkpoint_comes_back_field_for_field(trainer):
    record = trainer._run_record
    written = trainer._checkpoint(1)
    rundir.save_checkpoint(record, written)
    raw = torch.load(record.out_dir / "checkpoint.pt", weights_only=False)
    assert (raw["world_size"], raw["fingerprint"], raw["data_hash"]) == (
        1, trainer.config.fingerprint(), trainer.data.content_hash)
    read = rundir.load_checkpoint(record, torch.device("cpu"))
    for field in dataclasses.fields(rundir.Checkpoint):
        a, b = getattr(written, field.name), getattr(read, field.name)
        flat_a, flat_b = leaves(a), leaves(b)
        assert len(flat_a) == len(flat_b), field.name
        for x, y in zip(flat_a, flat_b, strict=True):
            assert same(x, y), field.name
    assert read.global_step == 2 and read.history == [{"epoch": 1, "val_score": 0.5}]


def test_a_checkpoint_of_another_configuration_or_data_is_refused(trainer):
    record = trainer._run_record
    rundir.save_checkpoint(record, trainer._checkpoint(1))
    other_config = dataclasses.replace(record, config=dataclasses.replace(record.config, lr=record.config.lr * 2))
    with pytest.raises(InvalidParameterError, match="different configuration"):
        rundir.load_checkpoint(other_config, torch.device("cpu"))
    with pytest.raises(DataError, match="other data"):
        rundir.load_checkpoint(dataclasses.replace(record, data_hash="another"), torch.device("cpu"))


def test_the_files_describe_the_record_and_the_progress_given(trainer):
    record = trainer._run_record
    outcome = {"converged": True, "epochs_run": 1}
    rundir.write_run_json(record, "completed", outcome)
    rundir.write_metrics(record, trainer.history, outcome, final={"val": {}})
    rundir.save_model(record, trainer.model)
    run = atomic.read_json(record.out_dir / "run.json", "run")
    metrics = atomic.read_json(record.out_dir / "metrics.json", "metrics")
    assert (run["status"], run["training"], run["converged"]) == ("completed", outcome, True)
    assert run["tasks"] == metrics["tasks"] == [t.name for t in trainer.tasks]
    assert run["data_hash"] == metrics["data_hash"] == trainer.data.content_hash
    assert metrics["epochs"] == trainer.history and metrics["training"] == outcome and metrics["final"] == {"val": {}}
    rundir.check_run_consistent(record.out_dir)  # the three files are one run's
    _, model, blob = rundir.load_model(record.out_dir / "model.pt")
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), trainer.model.state_dict().values(),
                                                   strict=True))
