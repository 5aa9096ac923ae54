"""One configuration model per kind of setting: the data (`DataConfig`) and each pipeline's parameters
(`SweepConfig`, `RetrainConfig`, `DistributedTrainConfig`) have the same names, types and defaults in the
pipeline signatures, `params.yaml`, the command line and the Python API."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from mtlflow.config.data import DataConfig
from mtlflow.config.pipeline import PIPELINE_CONFIGS, SweepConfig, pipeline_config, reference_options
from mtlflow.core.errors import InvalidParameterError
from mtlflow.pipelines import runner

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("pipeline", sorted(PIPELINE_CONFIGS))
def test_each_pipeline_signature_is_its_config_field_for_field(pipeline):
    model = PIPELINE_CONFIGS[pipeline]
    signature = inspect.signature(runner.get_pipeline(pipeline).pipeline_func)
    assert set(signature.parameters) == set(model.field_names())
    assert {k: p.default for k, p in signature.parameters.items()} == model.defaults()
    model.from_mapping({})  # the defaults are valid


@pytest.mark.parametrize("model", [DataConfig, *PIPELINE_CONFIGS.values()])
def test_every_model_has_a_schema_that_describes_every_field(model):
    schema = model.json_schema()
    assert list(schema["properties"]) == model.field_names()
    assert all(prop["description"] for prop in schema["properties"].values())
    assert schema["additionalProperties"] is False


def test_data_options_are_checked_by_the_benchmark():
    assert DataConfig("multimnist", {"n_train": 500}).build_benchmark().config["n_train"] == 500
    with pytest.raises(InvalidParameterError, match="n_trian"):
        DataConfig("multimnist", {"n_trian": 500})
    with pytest.raises(InvalidParameterError, match="data version"):
        pipeline_config("retrain", {"data_version": "abc"})


def test_references_drop_cost_and_keep_every_other_option():
    options = {"teleport": "cost", "teleport_options": {"trigger": "weak"}, "lr": 0.01, "device": "auto"}
    assert reference_options(options) == {"lr": 0.01, "device": "auto"}


def test_sweep_parameters_are_checked_as_the_runs_will_see_them():
    with pytest.raises(InvalidParameterError, match="unknown benchmark_sweep parameter"):
        pipeline_config("benchmark_sweep", {"teleport": "cost"})
    with pytest.raises(InvalidParameterError, match="train_options.seed is set by the pipeline"):
        pipeline_config("benchmark_sweep", {"train_options": {"seed": 3}})
    with pytest.raises(InvalidParameterError, match="batch_size"):
        pipeline_config("benchmark_sweep", {"train_options": {"batch_size": 0}})
    with pytest.raises(InvalidParameterError, match="reference_seeds is empty"):
        pipeline_config("benchmark_sweep", {"reference_seeds": []})
    # protobuf structs deliver integers as floats
    assert pipeline_config("benchmark_sweep", {"seeds": [0.0, 1.0], "epochs": 2}).seeds == [0, 1]


def test_params_yaml_is_a_sweep_plus_the_dvc_section(tmp_path, monkeypatch):
    from mtlflow.jobs import stages

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    sweep = SweepConfig.from_mapping({k: v for k, v in params.items() if k != "dvc"})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    loaded = stages.load_params()
    assert loaded.sweep == sweep and loaded.reference_tasks == ["left", "right"]
    # the experiment method may have hyper-parameters without being in the sweep
    params["dvc"]["experiment_method"] = "stch"
    params["method_hparams"]["stch"] = {"mu": 0.5}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert stages.load_params().experiment_hparams == {"mu": 0.5}
    params["dvc"]["reference_tasks"] = ["left"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(InvalidParameterError, match="reference_tasks must list the benchmark's tasks"):
        stages.load_params()
