"""mtlflow tune as the tuned_sweep pipeline's steps (mtlflow.jobs.tune_steps), on the problem whose best learning
rate is known (tune_problems.Quadratic): one task per study on a shared work directory gives the tune.json of one
uninterrupted `mtlflow tune`; the retrain candidate is the comparison's best method with its chosen settings; Katib's
best trials become the sweep's retrained runs; the pipeline's parameters are checked before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtlflow import jobs
from mtlflow.config.pipeline import TUNE_PRUNERS, TUNE_SELECTIONS, pipeline_config, tune_arguments
from mtlflow.core.errors import InvalidParameterError, MtlflowError
from mtlflow.jobs import tune_folds, tune_steps, tune_study
from mtlflow.jobs.tune import tune

HERE = Path(__file__).resolve().parent
LR_ONLY = {"*": {"lr": {"scale": "log", "low": 1e-3, "high": 1.0}, "weight_decay": None}}
#: what the pipeline's tuning_arguments step hands every study task (plain values, as through a KFP struct)
ARGUMENTS = {"methods_to_tune": ["ls", "dwa"], "tasks": [], "budget_trials": 3, "budget_steps": 0, "seed": 0,
             "retrain_seeds": 2, "search_spaces": LR_ONLY, "hparams": {}, "train_options": {}, "pruner": "none",
             "startup_trials": 2, "references": True, "selection": "holdout"}
METADATA = {"content_hash": "quadratic"}


@pytest.fixture(autouse=True)
def problems_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    sys.path.insert(0, str(HERE))
    try:
        path = tmp_path_factory.mktemp("quadratic") / "data"
        jobs.prepare("tune_problems:Quadratic", path)
    finally:
        sys.path.remove(str(HERE))
    return path


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory, data: Path) -> tuple[Path, dict]:
    """The pipeline's steps, the studies run last to first (the order of parallel tasks is anyone's)."""
    import sys

    sys.path.insert(0, str(HERE))
    try:
        root = tmp_path_factory.mktemp("checkpoints")
        items = tune_steps.plan_studies(str(data), METADATA, str(root), "run-1", json.dumps(ARGUMENTS))
        assert [json.loads(i)["study"] for i in items] == ["ls", "dwa", "stl-bowl1", "stl-bowl2"]
        for item in reversed(items):
            assert tune_steps.search_study(str(data), METADATA, str(root), "run-1", item)["study"] == json.loads(
                item)["study"]
        work, result = tune_steps.compare_tuned(str(data), METADATA, str(root), "run-1", ARGUMENTS)
    finally:
        sys.path.remove(str(HERE))
    return work, result


def test_one_task_per_study_gives_the_result_of_one_uninterrupted_tune(tmp_path: Path, data: Path,
                                                                      stepped: tuple[Path, dict]) -> None:
    work, result = stepped
    assert work == tune_steps.work_dir(work.parent.parent, METADATA, ARGUMENTS, "run-1")
    assert work != tune_steps.work_dir(work.parent.parent, METADATA, ARGUMENTS, "run-2")  # another run: its own
    assert list(result["studies"]) == ["ls", "dwa", "stl-bowl1", "stl-bowl2"]
    direct = tune(tmp_path / "direct", data_dir=data, progress=False, **tune_steps.tune_kwargs(ARGUMENTS))
    for name, study in direct["studies"].items():
        stepped_study = result["studies"][name]
        assert stepped_study["chosen"] == study["chosen"] and stepped_study["best_value"] == study["best_value"]
        assert [t["params"] for t in stepped_study["trials"]] == [t["params"] for t in study["trials"]]
        assert stepped_study["spent"]["steps"] == study["spent"]["steps"]
    assert (work / "tune.json").is_file() and (work / result["comparison"]["report"]).is_file()


def test_the_flat_metrics_are_each_studys_own(stepped: tuple[Path, dict]) -> None:
    _, result = stepped
    flat = tune_steps.tuned_metrics(result)
    for name, study in result["studies"].items():
        assert flat[f"{name}.best_value"] == study["best_value"]
        assert flat[f"{name}.steps"] == study["spent"]["steps"] and flat[f"{name}.lr"] == study["chosen"][
            "train_options"]["lr"]


def test_the_retrain_candidate_is_the_comparisons_best_method_with_its_chosen_settings(
        stepped: tuple[Path, dict]) -> None:
    work, result = stepped
    best = json.loads((work / result["comparison"]["results"]).read_text())["best_method"]
    by_label = {jobs.run_label(jobs.read_run(study["retrained"][0])["run"]): study
                for study in result["studies"].values() if study["kind"] == "method"}
    candidate = tune_steps.tuned_candidate(work / "tune.json")
    assert candidate["label"] == best and candidate["method"] == by_label[best]["method"]
    assert candidate["train_options"] == by_label[best]["chosen"]["train_options"]
    run = tune_steps.candidate_run(str(work / "tune.json"), "fairgrad", 4, {"alpha": 2.0}, {"batch_size": 2.0})
    spec = json.loads(run["run_spec"])
    assert (spec["method"], spec["seed"]) == (candidate["method"], 4) and "fairgrad" in run["note"]
    assert run["train_options"] == {"batch_size": 2, **candidate["train_options"]}
    plain = tune_steps.candidate_run("", "fairgrad", 4, {"alpha": 2.0}, {"batch_size": 2})
    assert json.loads(plain["run_spec"]) == {"method": "fairgrad", "seed": 4, "hparams": {"alpha": 2.0}}
    assert plain["note"] == ""


def test_a_missing_or_uncompared_tuning_result_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="not found"):
        tune_steps.tuned_candidate(tmp_path / "tune.json")
    (tmp_path / "tune.json").write_text(json.dumps({"studies": {}}))
    with pytest.raises(InvalidParameterError, match="no compared tuning result"):
        tune_steps.tuned_candidate(tmp_path / "tune.json")
    with pytest.raises(InvalidParameterError, match="not a tuning result"):
        pipeline_config("retrain", {"tuned": "runs/tune"})


def test_katibs_best_trials_become_the_retrained_runs_and_references() -> None:
    studies = {"ls": {"method": "ls", "train_options": {"lr": 0.01}, "hparams": {}},
               "fairgrad": {"method": "fairgrad", "train_options": {"lr": 0.002}, "hparams": {"alpha": 2.0}}}
    planned = tune_steps.tuned_run_plans(studies, 3.0, 2, ["left", "right"], None, {"batch_size": 64.0, "lr": 1.0})
    runs = [(json.loads(r["run_spec"]), r["train_options"]) for r in planned["runs"]]
    assert [(s["method"], s["seed"]) for s, _ in runs] == [("ls", 4), ("ls", 5), ("fairgrad", 4), ("fairgrad", 5)]
    assert runs[2] == ({"method": "fairgrad", "seed": 4, "hparams": {"alpha": 2.0}}, {"batch_size": 64, "lr": 0.002})
    references = [(json.loads(r["run_spec"]), r["train_options"]) for r in planned["references"]]
    assert [(s["tasks"], s["seed"], s["reference"]) for s, _ in references] == [
        (["left"], 4, True), (["left"], 5, True), (["right"], 4, True), (["right"], 5, True)]
    assert all(options == {"batch_size": 64, "lr": 0.01} for _, options in references)  # tuned LS's settings
    one_task = tune_steps.tuned_run_plans(studies, 0, 1, ["left", "right"], ["left"], {})
    assert one_task["references"] == [] and json.loads(one_task["runs"][0]["run_spec"])["tasks"] == ["left"]
    with pytest.raises(InvalidParameterError, match="no ls study"):
        tune_steps.tuned_run_plans({"fairgrad": studies["fairgrad"]}, 0, 1, ["left"], None, {})


def test_the_pipelines_settings_become_tunes_arguments() -> None:
    arguments = tune_arguments(["fairgrad"], [], {}, {}, 5, 0, 1, 3, "none", 2, "holdout", 5, 7, {"lr": 0.1})
    assert arguments["train_options"] == {"lr": 0.1, "epochs": 7} and arguments["budget_steps"] == 0
    kwargs = tune_steps.tune_kwargs(arguments)
    assert kwargs["tasks"] is None and kwargs["budget_steps"] is None
    assert tune_steps.tune_kwargs({**arguments, "budget_steps": 400.0, "tasks": ["left"]})["budget_steps"] == 400


def test_the_tuned_sweep_refuses_bad_settings_before_anything_runs() -> None:
    assert TUNE_PRUNERS == tune_study.PRUNERS and TUNE_SELECTIONS == tune_folds.SELECTIONS
    for params, message in (({"tuner": "hyperopt"}, "tuner 'hyperopt' is not valid"),
                            ({"pruner": "median"}, "pruner 'median' is not valid"),
                            ({"retrain_seeds": 0}, "retrain_seeds must be an integer >= 1"),
                            ({"selection": "cv"}, "selection 'cv' is not valid"),
                            ({"budget_trials": 0}, "budget_trials must be an integer >= 1"),
                            ({"tasks": ["up"]}, "must list tasks of the benchmark"),
                            ({"search_spaces": {"pcgrad": {}}}, "search_spaces names pcgrad"),
                            ({"search_spaces": {"*": {"nope": None}}}, "'nope' is neither")):
        with pytest.raises(InvalidParameterError, match=message):
            pipeline_config("tuned_sweep", params)
    with pytest.raises(MtlflowError, match="nope"):
        pipeline_config("tuned_sweep", {"methods": ["nope"]})


def test_a_local_run_counts_one_task_per_study() -> None:
    from mtlflow.ops.observability.progress import expected_tasks

    # prepare_data, tuning_arguments, plan_tuning; ls, famo and one reference per task; compare_tuned, record_status
    assert expected_tasks("tuned_sweep", {"methods": ["famo"]}, n_tasks=2) == 3 + 2 + 2 + 2
    assert expected_tasks("tuned_sweep", {"methods": ["ls", "famo"], "tasks": ["left"]}, n_tasks=2) == 3 + 2 + 2
