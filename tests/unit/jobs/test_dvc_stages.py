"""The DVC stages' reading of params.yaml and what they write for DVC to compare: a task spec's one rule for
``benchmark``/``data_options`` (the error names the fix, and the fix works), one ``method_hparams`` entry per
method (what each stage depends on), metric keys that survive a hyper-parameter change, and the source stage's
real state (`mtlflow stage status`), which `dvc status` reports only as "always changed"."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest
import yaml

from mtlflow import jobs
from mtlflow.config.data import DataConfig
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import stages
from mtlflow.jobs.compare.summary import DeltaM, MeanRank, Summary
from mtlflow.metrics.intervals import Estimate

ROOT = Path(__file__).resolve().parents[3]
PROJECT_DATA_OPTIONS = yaml.safe_load((ROOT / "params.yaml").read_text())["data_options"]
TABLE = "x,churned\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n"


def project_params(**changes) -> dict:
    """The project's params.yaml with a task spec (specs/churn.yaml, one binary task) and ``changes``."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(spec="specs/churn.yaml", data_options={}, methods=["ls"], method_hparams={"ls": {}})
    params["dvc"] = {"reference_tasks": ["churned"], "experiment_method": "ls"}
    params.update(changes)
    return params


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "churn.csv").write_text(TABLE)
    (tmp_path / "specs" / "churn.yaml").write_text(
        "name: churn\nsource: {table: churn.csv}\ntasks: [{name: churned, type: binary}]\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_params(params: dict) -> None:
    Path("params.yaml").write_text(yaml.safe_dump(params))


def apply_named_fix(message: str, params: dict) -> dict:
    """The ``set KEY: VALUE [and KEY: VALUE]`` of a refusal, applied to ``params`` as a user would."""
    fixes = re.search(r"; set (.+?) \(or spec", message).group(1)
    for fix in fixes.split(" and "):
        key, value = fix.split(": ", 1)
        params[key] = yaml.safe_load(value)
    return params


@pytest.mark.parametrize("changes, named", [
    # the project's params.yaml as it is, plus a spec: its benchmark is the default
    ({"data_options": PROJECT_DATA_OPTIONS}, ["data_options: {}"]),
    ({"benchmark": "", "data_options": PROJECT_DATA_OPTIONS}, ["data_options: {}"]),
    ({"benchmark": "spec", "data_options": PROJECT_DATA_OPTIONS}, ["data_options: {}"]),
    ({"benchmark": "cityscapes"}, ["benchmark: spec"]),
    ({"benchmark": "nyuv2", "data_options": {"n_train": 10}}, ["benchmark: spec", "data_options: {}"]),
])
def test_a_spec_in_params_yaml_is_refused_naming_exactly_the_fix_that_works(project, changes, named):
    params = project_params(**changes)
    write_params(params)
    with pytest.raises(InvalidParameterError) as refused:
        stages.load_params()
    message = str(refused.value)
    assert "\n" not in message and "spec specs/churn.yaml describes the data" in message
    assert re.search(r"; set (.+?) \(or spec", message).group(1).split(" and ") == named
    write_params(apply_named_fix(message, params))
    loaded = stages.load_params()
    assert loaded.sweep.preparation() == ("spec", {"spec": "specs/churn.yaml"})
    assert loaded.reference_tasks == ["churned"]


@pytest.mark.parametrize("benchmark", ["spec", "", "multimnist"])
def test_the_values_of_benchmark_that_go_with_a_spec(project, benchmark):
    assert DataConfig(benchmark, {}, spec="specs/churn.yaml").preparation() == ("spec", {"spec": "specs/churn.yaml"})


def test_every_method_needs_its_own_method_hparams_entry(project):
    params = project_params(methods=["ls", "famo"], method_hparams={"ls": {}})
    write_params(params)
    with pytest.raises(InvalidParameterError, match=r"no entry for famo; .* add famo: \{\} under method_hparams "
                                                    r"\(with dvc exp run: -S '\+method_hparams.famo=\{\}'\)"):
        stages.load_params()
    params["dvc"]["experiment_method"] = "stch"
    params["method_hparams"]["famo"] = {}
    write_params(params)
    with pytest.raises(InvalidParameterError, match=r"no entry for stch \(dvc.experiment_method\)"):
        stages.load_params()
    params["method_hparams"]["stch"] = {"mu": 0.5}
    write_params(params)
    loaded = stages.load_params()
    assert loaded.experiment_hparams == {"mu": 0.5} and loaded.sweep.method_hparams == {"ls": {}, "famo": {}}
    # `dvc exp run -S methods=[ls]` leaves famo's entry in params.yaml: it is checked, not swept
    params["methods"] = ["ls"]
    write_params(params)
    assert stages.load_params().sweep.methods == ["ls"]
    params["method_hparams"]["famo"] = {"no_such_option": 1}
    write_params(params)
    with pytest.raises(InvalidParameterError, match="no_such_option"):
        stages.load_params()
    params["method_hparams"]["famo"] = 2.0
    write_params(params)
    with pytest.raises(InvalidParameterError, match=r"method_hparams.famo must be a mapping"):
        stages.load_params()


def test_the_projects_params_yaml_lists_every_method_it_runs():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(params["method_hparams"]) >= {*params["methods"], params["dvc"]["experiment_method"]}


def fake_summary(alpha: float) -> Summary:
    """A summary of fairgrad(alpha) and ls runs, labelled as ``jobs.summarise`` labels them, with the fields the DVC
    metrics use set by hand."""
    spec = {"acc": {"higher_is_better": True, "unit_interval": True}}
    tasks = ("left", "right")

    def run(method: str, seed: int, hparams: dict) -> dict:
        final = {t: {"acc": 0.5} for t in tasks}
        return {"dir": str(stages.RUNS / f"{method}-s{seed}"),
                "run": {"benchmark": "multimnist", "data_hash": "h" * 64,
                        "config": {"method": method, "seed": seed, "hparams": hparams}},
                "metrics": {"tasks": list(tasks), "metric_specs": {t: spec for t in tasks},
                            "primary_metrics": {t: "acc" for t in tasks}, "hv_reference": {t: 1.0 for t in tasks},
                            "final": {"test": final}, "selection": {"rule": "last"},
                            "epochs": [{"step_seconds_median": 0.01, "peak_memory_bytes": 1}]}}

    runs = [run("fairgrad", 0, {"alpha": alpha}), run("fairgrad", 1, {"alpha": alpha}), run("ls", 1, {}), run("ls", 0, {})]
    summary = jobs.summarise(runs, [], paper_references=False)
    label = f"fairgrad(alpha={alpha})"
    by_hand = {label: (alpha, 1.0, 0.5, (0.1, 0.2), True), "ls": (0.0, 2.0, 0.4, (0.2, 0.3), False)}
    rows = {}
    for name, (delta_m, rank, hv, errors, pareto) in by_hand.items():
        interval = Estimate(delta_m, None, None, 2)
        rows[name] = dataclasses.replace(
            summary.methods[name], delta_m=DeltaM(mean=delta_m, std=0.0, per_seed=(delta_m,) * 2, interval=interval),
            mean_rank=MeanRank(mean=rank, interval=None), hypervolume=hv, primary_errors=errors, pareto_optimal=pareto)
    return dataclasses.replace(summary, methods=rows)


def test_metric_keys_are_method_names_whatever_the_hyper_parameters(project):
    written = {}
    for alpha in (1.0, 2.0):
        params = project_params(methods=["ls", "fairgrad"], seeds=[0, 1],
                                method_hparams={"ls": {}, "fairgrad": {"alpha": alpha}})
        write_params(params)
        loaded = stages.load_params()
        written[alpha] = (stages.summary_metrics(loaded, fake_summary(alpha)),
                          stages.pareto_points(loaded, fake_summary(alpha)))
    (one, points_one), (two, points_two) = written[1.0], written[2.0]
    assert list(one) == list(two) == ["fairgrad", "ls"]
    assert one["fairgrad"] == {"delta_m": 1.0, "mean_rank": 1.0, "hypervolume": 0.5, "hparams": {"alpha": 1.0}}
    assert two["fairgrad"]["hparams"] == {"alpha": 2.0} and "hparams" not in two["ls"]
    assert [p["method"] for p in points_one] == [p["method"] for p in points_two] == ["fairgrad", "ls"]
    assert points_two[0]["label"] == "fairgrad(alpha=2.0)" and points_two[0]["second task error"] == 0.2


def lock_source(md5: str) -> None:
    Path("dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"source": {
        "cmd": "mtlflow stage source", "outs": [{"path": "data/source.json", "hash": "md5", "md5": md5}]}}}))


def test_the_source_status_says_whether_the_data_inputs_changed_since_dvc_lock(project):
    write_params(project_params())
    params = stages.load_params()
    assert stages.source_status(params)["changed"] is True  # no dvc.lock: nothing ran
    stages.stage_source(params)
    lock_source(hashlib.md5(stages.SOURCE.read_bytes()).hexdigest())  # what `dvc repro` records
    assert stages.source_status(params) == {"changed": False, "why": "the data's inputs are those dvc.lock records"}

    (project / "specs" / "churn.csv").write_text(TABLE + "7,0\n")  # the table's next version
    status = stages.source_status(params)
    assert status["changed"] is True and "(table_sha256)" in status["why"]
    stages.stage_source(params)  # what `dvc repro` would write now: once locked, unchanged again
    lock_source(hashlib.md5(stages.SOURCE.read_bytes()).hexdigest())
    assert stages.source_status(params)["changed"] is False
