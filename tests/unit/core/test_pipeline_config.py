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


def test_params_yaml_is_a_sweep_plus_the_dvc_and_tune_sections(tmp_path, monkeypatch):
    from mtlflow.jobs import stages

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    sweep = SweepConfig.from_mapping({k: v for k, v in params.items() if k not in ("dvc", "tune")})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    loaded = stages.load_params()
    assert loaded.sweep == sweep and loaded.reference_tasks == ["left", "right"]
    assert loaded.tune == params["tune"]  # the tune stage's section (stages.tune_config checks it)
    stages.tune_config(loaded)
    # the experiment method may have hyper-parameters without being in the sweep
    params["dvc"]["experiment_method"] = "stch"
    params["method_hparams"]["stch"] = {"mu": 0.5}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert stages.load_params().experiment_hparams == {"mu": 0.5}
    params["dvc"]["reference_tasks"] = ["left"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(InvalidParameterError, match="reference_tasks must list the benchmark's tasks"):
        stages.load_params()


def test_the_source_stage_identity_of_a_spec_is_the_same_in_every_clone(tmp_path, monkeypatch):
    """The same project (a spec and its table beside it) in two folders: DVC's source stage writes the
    same data/source.json in both, with the paths relative to the project root; a table outside the project
    (a data volume) keeps its absolute path, and a new version of the table changes the identity."""
    import json

    from mtlflow.jobs import stages

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(spec="specs/churn.yaml", data_options={}, methods=["ls"], method_hparams={"ls": {}})
    params["dvc"] = {"reference_tasks": ["churned"], "experiment_method": "ls"}
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "shared.csv").write_text("x,churned\n1,0\n2,1\n3,0\n4,1\n")
    written = {}
    for clone in ("alice", "ci-runner"):
        project = tmp_path / clone
        (project / "specs").mkdir(parents=True)
        (project / "specs" / "churn.csv").write_text("x,churned\n1,0\n2,1\n3,0\n4,1\n")
        (project / "specs" / "churn.yaml").write_text(
            "name: churn\nsource: {table: churn.csv}\ntasks: [{name: churned, type: binary}]\n")
        (project / "params.yaml").write_text(yaml.safe_dump(params))
        monkeypatch.chdir(project)
        stages.stage_source(stages.load_params())
        written[clone] = json.loads(stages.SOURCE.read_text())
    assert written["alice"] == written["ci-runner"]
    assert written["alice"]["spec"]["source"]["table"] == "specs/churn.csv"

    (project / "specs" / "churn.yaml").write_text(
        f"name: churn\nsource: {{table: {volume / 'shared.csv'}}}\ntasks: [{{name: churned, type: binary}}]\n")
    stages.stage_source(stages.load_params())
    assert json.loads(stages.SOURCE.read_text())["spec"]["source"]["table"] == str(volume / "shared.csv")
    (volume / "shared.csv").write_text("x,churned\n1,1\n2,1\n3,0\n4,1\n")
    before = json.loads(stages.SOURCE.read_text())
    stages.stage_source(stages.load_params())
    assert json.loads(stages.SOURCE.read_text())["table_sha256"] != before["table_sha256"]


@pytest.mark.parametrize("value, expected", [
    ("/project/data/t.csv", "data/t.csv"),
    ("/project", "."),
    ("/elsewhere/t.csv", "/elsewhere/t.csv"),
    ("/projectx/t.csv", "/projectx/t.csv"),  # a sibling whose name starts like the project's
    ("s3://bucket/t.csv", "s3://bucket/t.csv"),
    ("t.csv", "t.csv"),
    ({"a": ["/project/x", 3, None]}, {"a": ["x", 3, None]}),
])
def test_inside_project_paths_become_relative_and_nothing_else_changes(value, expected):
    from mtlflow.jobs.stages import inside_project_relative

    assert inside_project_relative(value, Path("/project")) == expected
