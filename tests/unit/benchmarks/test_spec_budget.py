"""Your own table's default training budget: fitted to its size, overridden by the spec's ``train:`` section."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from mtlflow import jobs
from mtlflow.benchmarks.spec import SPEC_TRAINING_DEFAULTS
from mtlflow.engine.trainer import fit_budget

TASKS = [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"}]


def spec_file(tmp_path: Path, **extra) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "source": {"table": "table.csv"}, "tasks": TASKS, **extra}))
    return str(path)


def test_a_small_table_trains_at_least_500_steps_at_a_batch_that_fits_it(tmp_path: Path) -> None:
    plan = jobs.plan_train(benchmark="spec", data_options={"spec": spec_file(tmp_path)}, method="fairgrad")
    config = plan.config
    assert (config.epochs, config.min_steps, config.min_steps_per_epoch, config.patience) == (100, 500, 8, 10)
    assert config.selection == "best-val"
    # the 344-row table of the issue: 241 training rows -> batch 241 // 8 = 30, ceil(241 / 30) = 9 steps an
    # epoch, ceil(500 / 9) = 56 epochs at least (the old default: batch 256, 1 step an epoch, 10 steps in all)
    budget = fit_budget(config, 241)
    assert (budget["batch_size"], budget["steps_per_epoch"], budget["max_epochs"]) == (30, 9, 100)
    # a minimum of steps given with the epochs raises them (the one budget rule: both given, both apply)
    assert fit_budget(dataclasses.replace(config, epochs=10), 241)["max_epochs"] == 56


def test_the_specs_train_section_and_the_command_line_override_the_defaults(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, train={"epochs": 30, "patience": 3, "select": "last"})
    plan = jobs.plan_train(benchmark="spec", data_options={"spec": spec}, method="ls", min_steps=50)
    config = plan.config
    assert (config.epochs, config.patience, config.selection, config.min_steps) == (30, 3, "last", 50)
    assert config.min_steps_per_epoch == SPEC_TRAINING_DEFAULTS["min_steps_per_epoch"]
