"""`mtlflow tune` (mtlflow.jobs.tune) on a problem whose best learning rate is known (tune_problems.Quadratic):
the sampler's pinned arguments, equal budgets counted from the runs' own records, a search that never reads
the test split (and a trial that does, caught), the known best learning rate found, and the result's shape."""

from __future__ import annotations

import inspect
import json
import math
import warnings
from pathlib import Path

import optuna
import pytest

from mtlflow import jobs
from mtlflow.jobs import tune_study, tune_trial
from mtlflow.jobs.tune import tune

HERE = Path(__file__).resolve().parent
BENCHMARK = "tune_problems:Quadratic"
#: lr on a log scale over three decades, weight decay not searched (it only slows the bowl's descent)
LR_ONLY = {"*": {"lr": {"scale": "log", "low": 1e-3, "high": 1.0}, "weight_decay": None}}


@pytest.fixture(autouse=True)
def problems_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    sys.path.insert(0, str(HERE))
    try:
        path = tmp_path_factory.mktemp("quadratic") / "data"
        jobs.prepare(BENCHMARK, path)
    finally:
        sys.path.remove(str(HERE))
    return path


def test_the_sampler_passes_every_argument_optuna_5_has_not_deprecated() -> None:
    """Optuna 5 changed TPESampler's defaults (multivariate None, constant_liar True): every argument that is not
    deprecated is given explicitly, so a new Optuna cannot change the search silently; the deprecated ones (fixed
    by Optuna, a FutureWarning when given) are not."""
    deprecated = {"consider_prior", "prior_weight", "consider_magic_clip", "consider_endpoints", "gamma", "weights",
                  "warn_independent_sampling", "constraints_func"}
    arguments = set(inspect.signature(optuna.samplers.TPESampler.__init__).parameters) - {"self"}
    assert arguments - deprecated == set(tune_study.SAMPLER_SETTINGS) | {"seed", "n_startup_trials"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = tune_study.build_sampler(7, 4)
    assert (sampler._multivariate, sampler._constant_liar, sampler._n_startup_trials) == (True, True, 4)
    pruner = tune_study.build_pruner("successive-halving", 3)
    assert (pruner._min_resource, pruner._reduction_factor) == (1, 3)  # Optuna's defaults: "auto" and 4


def trial_steps_from_records(out: Path, study: str) -> dict[int, int]:
    """Each trial's optimizer steps, summed from its run's metrics.json (independently of the job's reading)."""
    steps = {}
    for run in sorted((out / "trials" / study).iterdir()):
        epochs = json.loads((run / "metrics.json").read_text())["epochs"]
        steps[int(run.name)] = sum(e["steps"] for e in epochs)
    return steps


def test_every_study_gets_the_same_budget_counted_from_the_runs_own_steps(tmp_path: Path, data: Path) -> None:
    result = tune(tmp_path / "out", ["ls", "dwa"], data_dir=data, budget_trials=6, retrain_seeds=0, references=True,
                  search_spaces=LR_ONLY, selection="holdout", progress=False)
    assert list(result["studies"]) == ["ls", "dwa", "stl-bowl1", "stl-bowl2"]
    # 3 epochs of 2 steps (the problem's recipe and data): one whole trial
    budgets = {(s["spent"]["budget_steps"], s["spent"]["trial_steps"]) for s in result["studies"].values()}
    assert budgets == {(6 * 3 * 2, 6)}
    pruned_somewhere = False
    for name, study in result["studies"].items():
        recorded = trial_steps_from_records(tmp_path / "out", name)
        assert sorted(recorded) == [t["number"] for t in study["trials"]]
        assert {t["number"]: t["steps"] for t in study["trials"]} == recorded
        assert study["spent"]["steps"] == sum(recorded.values())
        assert 0 <= study["spent"]["budget_steps"] - study["spent"]["steps"] < study["spent"]["trial_steps"]
        for trial in study["trials"]:
            if trial["outcome"] == "pruned":
                pruned_somewhere = True
                assert recorded[trial["number"]] == 2 * trial["epochs"] < 6  # it stopped early, and counts what it ran
        assert study["spent"]["pruned"] == sum(t["outcome"] == "pruned" for t in study["trials"])
    assert pruned_somewhere, "no trial was pruned: the test would not show pruned trials counted"


def test_the_search_never_reads_the_test_split(tmp_path: Path) -> None:
    poisoned = tmp_path / "poisoned"
    jobs.prepare(BENCHMARK, poisoned, poison_test=True)
    result = tune(tmp_path / "out", ["ls"], data_dir=poisoned, budget_trials=4, retrain_seeds=0, references=True,
                  search_spaces=LR_ONLY, selection="holdout", progress=False)
    assert all(s["spent"]["trials"] >= 4 for s in result["studies"].values())
    for run in (tmp_path / "out" / "trials" / "ls").iterdir():
        assert set(json.loads((run / "metrics.json").read_text())["epochs"][0]["splits"]) == {"val"}


def test_a_trial_that_evaluates_the_test_split_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poison works: broken on purpose (a trial given and evaluating test), the search fails on it."""
    from tune_problems import TestSplitRead

    poisoned = tmp_path / "poisoned"
    jobs.prepare(BENCHMARK, poisoned, poison_test=True)
    monkeypatch.setattr(tune_trial, "SEARCH_SPLITS", ("val", "test"))
    monkeypatch.setattr(tune_trial, "SEARCH_DATA_SPLITS", ("train", "val", "test"))
    with pytest.raises(TestSplitRead):
        tune(tmp_path / "out", ["ls"], data_dir=poisoned, budget_trials=2, retrain_seeds=0, references=False,
             search_spaces=LR_ONLY, selection="holdout", progress=False)
    study = optuna.load_study(study_name="ls", storage=tune_study.storage(tmp_path / "out"))
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]  # it failed inside the first trial


def test_the_search_finds_the_known_best_learning_rate_and_retrains_it_with_fresh_seeds(tmp_path: Path,
                                                                                        data: Path) -> None:
    from tune_problems import BEST_LR

    out = tmp_path / "out"
    result = tune(out, ["ls"], data_dir=data, budget_trials=10, retrain_seeds=3, references=False,
                  search_spaces=LR_ONLY, selection="holdout", progress=False)
    study = result["studies"]["ls"]
    lr = study["chosen"]["train_options"]["lr"]
    # the analytic optimum 1 / (a_1 + a_2); the band is 10 % of the searched log range
    assert abs(math.log(lr / BEST_LR)) < 0.15 * math.log(1e3) / 2, lr
    assert result["search_seed"] == 0 and result["retrain_seeds"] == [1, 2, 3]
    for seed, run_dir in zip([1, 2, 3], study["retrained"], strict=True):
        run = json.loads((Path(run_dir) / "run.json").read_text())
        assert run["status"] == "completed" and run["config"]["seed"] == seed and run["config"]["lr"] == lr
        assert (Path(run_dir) / jobs.split_evaluation_name("test")).is_file()
    comparison = json.loads((out / result["comparison"]["results"]).read_text())
    assert set(comparison["methods"]) == {"ls"}
    assert result["storage"]["dashboard"].startswith(f"optuna-dashboard {out / 'study.journal'}")
    assert result["sampler"]["multivariate"] is True and result["pruner"]["name"] == "SuccessiveHalvingPruner"


def test_a_work_directory_is_resumed_only_with_the_same_request(tmp_path: Path, data: Path) -> None:
    from mtlflow.core.errors import InvalidParameterError

    out = tmp_path / "out"
    first = tune(out, ["ls"], data_dir=data, budget_trials=2, retrain_seeds=0, references=False,
                 search_spaces=LR_ONLY, selection="holdout", progress=False)
    with pytest.raises(InvalidParameterError, match="already holds a tuning run; pass --resume"):
        tune(out, ["ls"], data_dir=data, budget_trials=2, retrain_seeds=0, references=False, search_spaces=LR_ONLY,
             selection="holdout")
    with pytest.raises(InvalidParameterError, match="budget_trials differ"):
        tune(out, ["ls"], data_dir=data, budget_trials=3, retrain_seeds=0, references=False, search_spaces=LR_ONLY,
             selection="holdout", resume=True)
    again = tune(out, ["ls"], data_dir=data, budget_trials=2, retrain_seeds=0, references=False,
                 search_spaces=LR_ONLY, selection="holdout", resume=True, progress=False)
    assert again["studies"]["ls"]["trials"] == first["studies"]["ls"]["trials"]  # nothing repeated


def test_hyperband_prunes_over_the_same_epochs_within_the_budget(tmp_path: Path, data: Path) -> None:
    result = tune(tmp_path / "out", ["ls"], data_dir=data, budget_trials=4, retrain_seeds=0, references=False,
                  search_spaces=LR_ONLY, selection="holdout", pruner="hyperband", progress=False)
    assert result["pruner"] == {"name": "HyperbandPruner", "min_resource": 1, "max_resource": 3,
                                "reduction_factor": 3, "bootstrap_count": 0}
    spent = result["studies"]["ls"]["spent"]
    assert spent["steps"] == sum(trial_steps_from_records(tmp_path / "out", "ls").values()) <= spent["budget_steps"]
