"""The gradient modes are one enum (`mtlflow.engine.step.GradientMode`) whose members write exactly the names
``bench.json``, ``bench.md`` and the code compared before: JSON, tables and string comparisons are unchanged."""

from __future__ import annotations

import json

import pytest

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.engine.step import GradientMode
from mtlflow.engine.trainer import Trainer

NAMES = {"custom", "losses", "jacobian", "gramian", "representation", "reuse"}


def test_every_mode_writes_its_name_in_json_tables_and_comparisons():
    assert {mode.value for mode in GradientMode} == NAMES
    for mode in GradientMode:
        assert json.dumps({"gradient_mode": mode}) == json.dumps({"gradient_mode": mode.value})
        assert f"| {mode} |" == f"| {mode.value} |" and str(mode) == mode.value
        assert mode == mode.value and GradientMode(mode.value) is mode


def test_only_the_per_task_gradient_modes_are_skipped_by_an_amortised_step():
    assert {m.value for m in GradientMode if m.computes_task_gradients} == {"jacobian", "gramian", "representation"}


@pytest.mark.parametrize("method,options,expected", [
    ("ls", {}, GradientMode.LOSSES), ("mgda", {}, GradientMode.JACOBIAN),
    ("mgda", {"grad_wrt": "representation"}, GradientMode.REPRESENTATION),
    ("upgrad", {"grad_backend": "autogram"}, GradientMode.GRAMIAN)])
def test_the_trainer_plans_an_enum_member(method, options, expected, tmp_path):
    jobs.prepare("toy", tmp_path / "data")
    bench, data = jobs.load_prepared(tmp_path / "data")
    trainer = Trainer(bench, data, RunConfig(method=method, epochs=1, batch_size=4, **options), tmp_path / "run",
                      progress=False)
    assert trainer.gradient_mode is expected
