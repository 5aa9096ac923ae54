"""One configuration model: RunConfig's fields are the `train` flags, the params.yaml / pipeline option
names and run.json's `config`, with one validation and a generated JSON schema."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jsonschema
import pytest

from mtlflow.cli import build_parser
from mtlflow.cli.common import run_options
from mtlflow.config.run import RunConfig, cli_flag, parse_hparams, train_arguments
from mtlflow.core.errors import InvalidParameterError

#: a value other than the default for every field, of every kind the model has
NON_DEFAULT = {"method": "fairgrad", "hparams": {"alpha": 2.0}, "epochs": 3, "batch_size": 64, "lr": 0.01,
               "optimizer": "sgd", "weight_decay": 0.0001, "momentum": 0.5, "method_lr": 0.1, "clip_grad_norm": 1.0,
               "rescale": False, "seed": 7, "tasks": ["left"], "select": "last-k:2", "eval_batch_size": 128,
               "max_steps_per_epoch": 5, "device": "cpu", "grad_backend": "batched", "grad_wrt": "parameters",
               "num_workers": 1, "pin_memory": True, "amp": "bf16", "deterministic": False, "scheduler": "step",
               "scheduler_options": {"step_size": 2, "gamma": 0.5}, "teleport": "cost",
               "teleport_options": {"trigger": "weak"}, "architecture": "hps", "architecture_options": {},
               "min_steps": 100, "min_steps_per_epoch": 4, "patience": 2, "threads": 1}


def test_non_default_example_covers_every_field_with_another_value():
    assert set(NON_DEFAULT) == set(RunConfig.field_names())
    defaults = RunConfig().to_dict()
    assert [k for k in RunConfig.field_names() if NON_DEFAULT[k] == defaults[k]] == ["device", "grad_wrt", "architecture",
                                                                           "architecture_options"]


def test_command_line_parses_back_every_field():
    """`train_arguments` (used to launch distributed jobs) and the generated `train` flags are inverses."""
    options = {k: v for k, v in NON_DEFAULT.items() if v != {}}
    args = build_parser().parse_args(["train", "--benchmark", "multimnist", *train_arguments(options)])
    parsed = run_options(args)
    assert parsed.pop("tasks") == "left"  # a comma-separated list; jobs.parse_tasks checks it against the tasks
    assert parsed == {k: v for k, v in options.items() if k != "tasks"}


def test_flags_follow_the_field_names():
    assert cli_flag("batch_size") == "--batch-size"
    assert cli_flag("teleport_options") == "--teleport-option"
    assert cli_flag("architecture_options") == "--architecture-option"
    assert cli_flag("hparams") == "--hp"
    usage = subprocess.run([sys.executable, "-m", "mtlflow", "train", "--help"], capture_output=True, text=True,
                           timeout=300).stdout
    for name in RunConfig.field_names():
        assert cli_flag(name) in usage, name


def test_from_mapping_validates_once_with_the_option_name():
    config = RunConfig.from_mapping({"lr": 1, "epochs": 2})
    assert config.lr == 1.0 and isinstance(config.lr, float)  # YAML / protobuf integral numbers
    with pytest.raises(InvalidParameterError, match=r"unknown training options: bogus; valid: method, hparams"):
        RunConfig.from_mapping({"bogus": 1})
    with pytest.raises(InvalidParameterError, match=r"^batch_size must be an integer, got 'x'$"):
        RunConfig.from_mapping({"batch_size": "x"})
    with pytest.raises(InvalidParameterError, match=r"^epochs must be an integer, got True$"):
        RunConfig.from_mapping({"epochs": True})
    with pytest.raises(InvalidParameterError, match=r"^rescale must be true or false, got 'no'$"):
        RunConfig.from_mapping({"rescale": "no"})
    with pytest.raises(InvalidParameterError, match=r"^clip_grad_norm must be a number or null, got 'big'$"):
        RunConfig.from_mapping({"clip_grad_norm": "big"})
    with pytest.raises(InvalidParameterError, match=r"^tasks must be a list of strings or null, got 'left'$"):
        RunConfig.from_mapping({"tasks": "left"})


def test_json_schema_describes_every_field_and_accepts_run_json_configs():
    schema = RunConfig.json_schema()
    assert list(schema["properties"]) == RunConfig.field_names()
    for f in dataclasses.fields(RunConfig):
        prop = schema["properties"][f.name]
        assert prop["description"] == f.metadata["help"] and prop["description"]
        if f.default is not dataclasses.MISSING:
            assert prop["default"] == f.default
    jsonschema.validate(RunConfig().to_dict(), schema)
    jsonschema.validate(json.loads(json.dumps(NON_DEFAULT)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**NON_DEFAULT, "bogus": 1}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**NON_DEFAULT, "epochs": "ten"}, schema)
    printed = subprocess.run([sys.executable, "-m", "mtlflow", "config", "schema"], capture_output=True, text=True,
                             timeout=300)
    assert printed.returncode == 0 and json.loads(printed.stdout) == schema


def test_hparams_have_one_grammar():
    assert parse_hparams({"alpha": 2, "famo.gamma": 0}, ["famo", "fairgrad"]) == {
        "famo": {"alpha": 2, "gamma": 0}, "fairgrad": {"alpha": 2}}
    assert parse_hparams({"fairgrad.alpha": 2}, ["fairgrad"]) == {"fairgrad": {"alpha": 2}}
    with pytest.raises(InvalidParameterError, match="names method 'famo', which this command does not run"):
        parse_hparams({"famo.gamma": 0}, ["fairgrad"])
    with pytest.raises(InvalidParameterError, match=r"must look like \[METHOD.\]NAME=VALUE"):
        parse_hparams({"famo.": 0}, ["famo"])


def count_calls(monkeypatch) -> dict[str, int]:
    """Count config validations, benchmark objects built, data hashes and methods built from now on."""
    from mtlflow import benchmarks, methods
    from mtlflow.benchmarks import base

    calls = {"validate": 0, "benchmark": 0, "hash": 0, "method": 0}

    def counting(key, function):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(RunConfig, "validate", counting("validate", RunConfig.validate))
    monkeypatch.setattr(benchmarks, "build", counting("benchmark", benchmarks.build))
    monkeypatch.setattr(base, "file_hashes", counting("hash", base.file_hashes))
    monkeypatch.setattr(methods, "build", counting("method", methods.build))
    return calls


def test_one_training_run_validates_its_config_once_and_reads_its_data_once(multimnist_small, tmp_path,
                                                                           monkeypatch):
    """`jobs.train` on prepared data: one config validation, one benchmark object, one hash of the data,
    and the method built twice at most (a validation before any data is read, then the trainer's)."""
    from mtlflow import jobs

    calls = count_calls(monkeypatch)
    jobs.train(multimnist_small, tmp_path / "run", method="fairgrad", epochs=1, batch_size=64, max_steps_per_epoch=1,
               progress=False)
    assert calls == {"validate": 1, "benchmark": 1, "hash": 1, "method": 2}


def test_train_command_on_cached_data_validates_once_and_hashes_once(tmp_path, monkeypatch):
    """`mtlflow train --benchmark ...` with its data already in the cache: the same counts as jobs.train on a
    data directory (the request is validated once, before the cache is looked at)."""
    from conftest import SMALL_SIZES
    from mtlflow.cli import main

    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    options = [a for k, v in SMALL_SIZES.items() for a in ("--data-option", f"{k}={v}")]
    argv = ["train", "--benchmark", "multimnist", *options, "--method", "fairgrad", "--epochs", "1",
            "--batch-size", "64", "--max-steps-per-epoch", "1", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0  # prepares the cache
    calls = count_calls(monkeypatch)
    assert main([*argv, "--out", str(tmp_path / "second")]) == 0
    assert calls == {"validate": 1, "benchmark": 1, "hash": 1, "method": 2}
