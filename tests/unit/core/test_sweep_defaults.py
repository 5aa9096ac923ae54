"""The sweep's defaults: three seeds for methods and references and a budget fitted to the data, as documented."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mtlflow.config.pipeline import DEFAULT_BUDGET, SweepConfig, plan_references, plan_runs

ROOT = Path(__file__).resolve().parents[3]


def test_the_sweep_runs_every_method_and_reference_with_three_seeds_by_default():
    config = SweepConfig()
    assert config.seeds == [0, 1, 2] and config.reference_seeds == [0, 1, 2]
    runs = [json.loads(r) for r in plan_runs(config.methods, config.seeds)]
    assert sorted((r["method"], r["seed"]) for r in runs) == sorted((m, s) for m in config.methods for s in range(3))
    refs = [json.loads(r) for r in plan_references(["a", "b"], config.reference_seeds)]
    assert sorted((r["tasks"][0], r["seed"]) for r in refs) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1),
                                                               ("b", 2)]


def test_the_sweep_trains_a_budget_with_early_stopping_by_default():
    config = SweepConfig()
    assert config.epochs == 100
    assert config.train_options == {"device": "auto", "min_steps": 500, "min_steps_per_epoch": 8, "patience": 10}
    assert DEFAULT_BUDGET == {k: v for k, v in config.train_options.items() if k != "device"}


def test_params_yaml_runs_three_seeds_and_the_documented_budget():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["seeds"] == [0, 1, 2] and params["reference_seeds"] == [0, 1, 2]
    page = (ROOT / "docs" / "guides" / "training.md").read_text()
    budget = {k: params["train_options"][k] for k in ("min_steps", "min_steps_per_epoch", "patience")}
    documented = ", ".join([f"`epochs: {params['epochs']}`", *(f"`{k}: {v}`" for k, v in budget.items())])
    assert documented in page
    sweep = ", ".join(f"`{k}: {v}`" for k, v in DEFAULT_BUDGET.items())
    assert f"`train_options: {{{sweep.replace('`', '')}}}`" in page
