"""The tune components' bodies on real artifacts (the analytic toy problem): the settings as tune's arguments, the
studies planned and run one task each, the comparison copied into the outputs the Kubeflow UI shows, and retrain's
candidate taken from the resulting tune.json; Katib's best trials planned as retrained runs."""

import json
from pathlib import Path

from kfp import compiler, dsl

from mtlflow.components.tune.component import (
    compare_tuned,
    plan_tuned_runs,
    plan_tuning,
    trial_options,
    tune_study,
    tuned_run,
    tuning_arguments,
)

SETTINGS = dict(methods=["ls"], tasks=[], method_hparams={}, search_spaces={"*": {"weight_decay": None}},
                budget_trials=2, budget_steps=0, seed=0, retrain_seeds=2, pruner="none", startup_trials=2,
                selection="holdout", folds=2, epochs=2, train_options={"device": "cpu"})


def test_every_component_compiles(tmp_path):
    for component in (tuning_arguments, plan_tuning, tune_study, compare_tuned, trial_options, plan_tuned_runs,
                      tuned_run):
        compiler.Compiler().compile(component, str(tmp_path / f"{component.name}.yaml"))


def test_the_studies_run_one_task_each_and_compare_into_the_outputs(toy_dataset, tmp_path):
    arguments = tuning_arguments.python_func(**SETTINGS)
    assert json.loads(arguments)["train_options"] == {"device": "cpu", "epochs": 2}
    shared = dict(data=toy_dataset, work_root=str(tmp_path / "checkpoints"), run_name="run-1")
    items = plan_tuning.python_func(arguments=arguments, **shared)
    studies = [tune_study.python_func(item=item, **shared) for item in items]
    assert studies == [json.loads(item)["study"] for item in items] and studies[0] == "ls"
    out = dict(result=dsl.Artifact(uri=str(tmp_path / "tune.json")), report=dsl.HTML(uri=str(tmp_path / "r.html")),
               summary=dsl.Markdown(uri=str(tmp_path / "s.md")), metrics=dsl.Metrics(uri=str(tmp_path / "m.json")))
    compare_tuned.python_func(arguments=arguments, studies=studies, **shared, **out)
    result = json.loads(Path(out["result"].path).read_text())
    assert list(result["studies"]) == studies and all(s["spent"]["trials"] == 2 for s in result["studies"].values())
    assert out["metrics"].metadata["ls.best_value"] == result["studies"]["ls"]["best_value"]
    assert "<html" in Path(out["report"].path).read_text().lower()
    work = Path(out["result"].metadata["work_dir"])
    candidate = tuned_run.python_func(tuned=str(work / "tune.json"), method="fairgrad", seed=5, hparams={},
                                      train_options={"device": "cpu"})
    assert json.loads(candidate.run_spec)["method"] == "ls"  # the only tuned method is the comparison's best
    assert candidate.options == {"device": "cpu", **result["studies"]["ls"]["chosen"]["train_options"]}


def test_katibs_best_trials_are_planned_as_retrained_runs():
    studies = {"ls": {"method": "ls", "train_options": {"lr": 0.01}, "hparams": {}}}
    planned = plan_tuned_runs.python_func(studies=studies, seed=0, retrain_seeds=1, task_names=["a", "b"], tasks=[],
                                          train_options={"device": "cuda"})
    assert [json.loads(r["run_spec"])["seed"] for r in planned.runs] == [1]
    assert [json.loads(r["run_spec"])["tasks"] for r in planned.references] == [["a"], ["b"]]
    assert planned.runs[0]["train_options"] == {"device": "cuda", "lr": 0.01}


def test_katib_trials_train_the_pipelines_epochs():
    assert trial_options.python_func(train_options={"lr": 0.1, "batch_size": 8.0}, epochs=7) == {
        "lr": 0.1, "batch_size": 8, "epochs": 7}
