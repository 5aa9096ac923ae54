"""tune: ``mtlflow tune`` as pipeline steps -- plan the studies, run one study per task, retrain the chosen
configurations and compare them -- the retrained runs of Katib's best trials, and ``retrain``'s tuned candidate.

The work is :mod:`mtlflow.jobs.tune_steps`'s (which calls :func:`mtlflow.jobs.tune.tune`); the components only
pass their artifacts' paths and copy the results out. The local studies share one work directory on the
checkpoints volume, so a retried task resumes its study without losing or repeating a trial.
"""

from typing import List, NamedTuple

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_tuned_sweep_local.py)
STABILITY = "beta"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tuning_arguments(methods: List[str], tasks: List[str], method_hparams: dict, search_spaces: dict,
                     budget_trials: int, budget_steps: int, seed: int, retrain_seeds: int, pruner: str,
                     startup_trials: int, selection: str, folds: int, epochs: int, train_options: dict) -> str:
    """The tuned sweep's settings as ``mtlflow tune``'s arguments (``epochs`` a training option of every trial), as
    JSON: a string keeps every number exact (a struct would make the integers floats) on every backend.

    Args:
        methods: the methods to tune (LS always)
        tasks: the tasks to train (empty: all)
        method_hparams: fixed hyper-parameters per method (not searched)
        search_spaces: ``*`` or a method to ``{setting: {scale, low, high} | {choices} | null}``
        budget_trials: every study's budget in whole trials (when ``budget_steps`` is 0)
        budget_steps: every study's budget in optimizer steps (0: ``budget_trials`` trials)
        seed: the search seed
        retrain_seeds: fresh seeds per chosen configuration
        pruner: successive-halving, hyperband or none
        startup_trials: random trials before TPE models the history
        selection: auto, kfold or holdout (how configurations are selected)
        folds: the folds of k-fold selection
        epochs: the most epochs of every trial and retrained run
        train_options: RunConfig fields of every trial and retrained run

    Returns:
        the keyword arguments of ``mtlflow.jobs.tune.tune`` besides the data (JSON)
    """
    import json

    from mtlflow.config.pipeline import tune_arguments

    return json.dumps(tune_arguments(methods, tasks, method_hparams, search_spaces, budget_trials, budget_steps, seed,
                                     retrain_seeds, pruner, startup_trials, selection, folds, epochs, train_options),
                      sort_keys=True)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_tuning(data: dsl.Input[dsl.Dataset], work_root: str, run_name: str, arguments: str) -> List[str]:
    """Claim the tuning run's work directory ``<work_root>/tune/<key>`` (the key hashes the data, the request and
    the pipeline run's name; every step of the run computes the same) and name its studies.

    Args:
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        work_root: the checkpoints root (a PVC on the cluster)
        run_name: the pipeline run's name (part of the key: a retried task finds its studies again)
        arguments: ``mtlflow tune``'s settings (JSON, from ``tuning_arguments``)

    Returns:
        one item per study (JSON ``{"study", "arguments"}``), LS first, then the methods, then one single-task
        reference per task
    """
    from mtlflow.jobs import tune_steps

    return tune_steps.plan_studies(data.path, dict(data.metadata), work_root, run_name, arguments)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tune_study(data: dsl.Input[dsl.Dataset], work_root: str, run_name: str, item: str) -> str:
    """Run one study's trials until its budget in optimizer steps is spent; a retried task adopts and resumes the
    trial its killed predecessor ran.

    Args:
        data: the prepared dataset (from ``prepare_data``)
        work_root: the checkpoints root, as given to ``plan_tuning``
        run_name: the pipeline run's name, as given to ``plan_tuning``
        item: one of ``plan_tuning``'s items: the study (a method, or ``stl-<task>`` for a single-task reference)
            and ``mtlflow tune``'s settings

    Returns:
        the study's name
    """
    from mtlflow.jobs import tune_steps

    return tune_steps.search_study(data.path, dict(data.metadata), work_root, run_name, item)["study"]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def compare_tuned(data: dsl.Input[dsl.Dataset], work_root: str, run_name: str, arguments: str, studies: List[str],
                  result: dsl.Output[dsl.Artifact], report: dsl.Output[dsl.HTML], summary: dsl.Output[dsl.Markdown],
                  metrics: dsl.Output[dsl.Metrics]):
    """Retrain every study's chosen configuration with fresh seeds, evaluate on test and compare the tuned methods
    against tuned LS and the tuned references (``mtlflow tune``'s retrain and comparison).

    Args:
        data: the prepared dataset (from ``prepare_data``)
        work_root: the checkpoints root, as given to ``plan_tuning``
        run_name: the pipeline run's name, as given to ``plan_tuning``
        arguments: ``mtlflow tune``'s settings, as given to ``plan_tuning``
        studies: the finished studies (every ``tune_study``'s output: the step waits for them all)
        result: tune.json: every study's chosen configuration, budget spent and trials, and the comparison
        report: the comparison's HTML report
        summary: the comparison's Markdown table
        metrics: per study its best validation score, steps, trials and chosen settings, shown in the Kubeflow UI
    """
    import shutil

    from mtlflow.jobs import tune_steps

    work, outcome = tune_steps.compare_tuned(data.path, dict(data.metadata), work_root, run_name, arguments)
    comparison = work / outcome["comparison"]["dir"]
    shutil.copyfile(work / "tune.json", result.path)
    shutil.copyfile(comparison / "report.html", report.path)
    shutil.copyfile(comparison / "results.md", summary.path)
    result.metadata.update({"work_dir": str(work), "studies": sorted(studies), "warnings": outcome["warnings"]})
    for name, value in tune_steps.tuned_metrics(outcome).items():
        metrics.log_metric(name, value)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def trial_options(train_options: dict, epochs: int) -> dict:
    """The RunConfig fields of every Katib trial: the pipeline's ``train_options`` and its ``epochs`` (a pipeline
    parameter of its own, which ``launch_katib`` takes among the options, as ``mtlflow tune`` does).

    Args:
        train_options: the pipeline's RunConfig fields
        epochs: the most epochs of every trial

    Returns:
        the trials' RunConfig fields
    """
    from mtlflow.jobs import tune_steps

    return tune_steps.trial_options(train_options, epochs)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_tuned_runs(studies: dict, seed: int, retrain_seeds: int, task_names: List[str], tasks: List[str],
                    train_options: dict) -> NamedTuple("TunedRuns", runs=List[dict], references=List[dict]):
    """The retrained runs of Katib's best trials: per method and fresh seed (``seed + 1 ...``) a run with the chosen
    settings, and per task and seed a single-task LS reference with tuned LS's.

    Args:
        studies: ``launch_katib``'s output: every method's best trial
        seed: the search seed
        retrain_seeds: fresh seeds per method
        task_names: the benchmark's tasks (``prepare_data``'s output)
        tasks: the tasks trained (empty: all)
        train_options: the pipeline's RunConfig fields, under the chosen settings
        runs: ``{"run_spec", "train_options"}`` per method and seed
        references: ``{"run_spec", "train_options"}`` per task and seed
    """
    from collections import namedtuple

    from mtlflow.jobs import tune_steps

    planned = tune_steps.tuned_run_plans(studies, seed, retrain_seeds, task_names, list(tasks) or None, train_options)
    return namedtuple("TunedRuns", ["runs", "references"])(planned["runs"], planned["references"])


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tuned_run(tuned: str, method: str, seed: int, hparams: dict,
              train_options: dict) -> NamedTuple("Candidate", run_spec=str, options=dict):
    """``retrain``'s candidate: with ``tuned`` (a tune.json) the method its comparison ranks best, with that study's
    chosen settings over ``train_options``; without, ``method`` and ``hparams`` as given.

    Args:
        tuned: a tune.json path readable by the task ('' = none)
        method: the method when ``tuned`` is empty
        seed: the run's seed
        hparams: the method's hyper-parameters when ``tuned`` is empty
        train_options: the run's RunConfig fields
        run_spec: the run's spec (JSON)
        options: the run's RunConfig fields with the tuned settings
    """
    from collections import namedtuple

    from mtlflow.jobs import tune_steps

    run = tune_steps.candidate_run(tuned, method, seed, hparams, train_options)
    if run["note"]:
        print(f"mtlflow: {run['note']}")
    return namedtuple("Candidate", ["run_spec", "options"])(run["run_spec"], run["train_options"])
