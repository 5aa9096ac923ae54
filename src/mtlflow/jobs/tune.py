"""``mtlflow tune``: tuned, budget-fair comparisons. One Optuna study per method (and per single-task reference),
the same sampler, pruner and budget in optimizer steps for each; the chosen configuration of each retrained with
fresh seeds and compared with the existing statistics (:func:`mtlflow.jobs.aggregate`) against tuned LS.

Rules (docs/guides/tuning.md):

* **Search space.** :func:`mtlflow.methods.search.search_space`: the shared training settings (lr, weight decay)
  for every method, so LS is tuned exactly as hard as the rest, plus the method's own declared ranges; a setting
  the user fixes (``train_options`` or ``hparams``) is not searched.
* **Budget.** ``budget_steps`` optimizer steps per study (default ``budget_trials`` whole trials); the rule and the
  accounting are in :mod:`mtlflow.jobs.tune_study`. Every trial trains with the search seed ``seed``.
* **Selection** never sees the test split: on the validation split (:mod:`mtlflow.jobs.tune_trial`), or, where
  the task with the fewest labelled validation rows has fewer than ``MIN_VALIDATION_ROWS`` (one split that small
  cannot rank configurations), by k-fold cross-validation over train + val (:mod:`mtlflow.jobs.tune_folds`: a
  trial's value is the mean over ``folds`` fold runs, the budget counts every fold's steps).
* **Retraining** with ``retrain_seeds`` fresh seeds ``seed + 1 ... seed + n`` (never the search seed), each run
  evaluated on test with per-example values for the paired comparisons.

The work directory: ``plan.json`` (the request; a resumed run must repeat it), ``study.journal`` (every study),
``trials/<study>/<number>/`` (the trial runs, no test metrics; ``fold-<i>/`` each with k-fold selection), ``retrain/<study>/seed-<s>/``, ``comparison/``
(the aggregate's results and report) and ``tune.json`` (the result).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtlflow import jobs, methods
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange
from mtlflow.core.locks import file_lock
from mtlflow.core.outputs import check_output_dir
from mtlflow.engine.trainer import Trainer, fit_budget
from mtlflow.jobs import tune_folds, tune_report, tune_study
from mtlflow.jobs.cache import cached_data
from mtlflow.jobs.tune_trial import (
    DIVERGED,
    PRUNED,
    SEARCH_SPLITS,
    Scorer,
    run_trial,
    search_data,
    untrained_scorer,
)
from mtlflow.methods.search import SHARED_SPACE, search_space

if TYPE_CHECKING:  # pragma: no cover
    import optuna

RESULT_NAME, PLAN_NAME = "tune.json", "plan.json"
#: the baseline every tuned method is compared with; always tuned
BASELINE = "ls"
#: a validation split with fewer labelled rows than this cannot rank configurations (issue 37: a 94-row split
#: chose the learning rate of the worst test AUC): k-fold selection (:mod:`mtlflow.jobs.tune_folds`)
MIN_VALIDATION_ROWS = tune_folds.MIN_VALIDATION_ROWS
BUDGET_TRIALS, RETRAIN_SEEDS = 20, 3
#: how often a finished worker looks whether the other workers' trials have ended (seconds)
POLL_SECONDS = 0.5
DASHBOARD = "optuna-dashboard {journal}  (pip install optuna-dashboard==0.21.0 -c constraints.txt)"


@dataclass(frozen=True)
class StudySpec:
    """One study: a method on the selected tasks, or a single-task reference (LS on one task)."""

    name: str
    kind: str
    method: str
    tasks: list[str] | None
    space: dict[str, SearchRange]
    hparams: dict[str, Any]


def study_specs(bench: Any, method_names: Sequence[str], tasks: Sequence[str] | None, references: bool,
                overrides: Mapping[str, Mapping[str, Any]], hparams: Mapping[str, Mapping[str, Any]],
                fixed_options: Sequence[str]) -> list[StudySpec]:
    """The studies of a tuning run: LS first, then the other methods, then one reference per task. A setting the
    user fixes is not searched; ``overrides``' key ``*`` applies to every study, a method's name to its own
    (references are LS studies)."""
    names = [BASELINE, *(m for m in method_names if m != BASELINE)]
    unknown = sorted(set(overrides) - {"*", *names})
    if unknown:
        raise InvalidParameterError(f"search space given for {', '.join(unknown)}, which is not tuned; give it for "
                                    f"* or one of {', '.join(names)}")

    def spec(name: str, kind: str, method: str, on: list[str] | None) -> StudySpec:
        cls = methods.get(method)
        fixed = dict(hparams.get(method, {}))
        space = search_space(cls, {**overrides.get("*", {}), **overrides.get(method, {})})
        space = {k: v for k, v in space.items() if k not in fixed and k not in fixed_options}
        if not space:
            raise InvalidParameterError(f"the search space of {name} is empty (every setting fixed); free one")
        return StudySpec(name, kind, method, on, space, fixed)

    specs = [spec(m, "method", m, list(tasks) if tasks else None) for m in names]
    if references:
        specs += [spec(f"stl-{t}", "reference", BASELINE, [t]) for t in (tasks or bench.task_names)]
    return specs


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A trial's parameters as (training options, method hyper-parameters): shared names are RunConfig options."""
    options = {k: v for k, v in params.items() if k in SHARED_SPACE}
    return options, {k: v for k, v in params.items() if k not in SHARED_SPACE}


def _claim_work_dir(out: Path, request: Mapping[str, Any], resume: bool) -> None:
    """Write the request into a new work directory, or check that a resumed one holds the same request."""
    plan = out / PLAN_NAME
    if not plan.is_file():
        if out.is_dir() and any(out.iterdir()):
            raise InvalidParameterError(f"--out {out} is not empty and holds no tuning run; choose another directory")
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_json(plan, request)
        return
    if not resume:
        raise InvalidParameterError(f"--out {out} already holds a tuning run; pass --resume to continue it (or "
                                    "--worker to add a worker to it), or choose another directory")
    recorded = atomic.read_json(plan, "tuning plan")
    differ = sorted(k for k in set(recorded) | set(request) if recorded.get(k) != request.get(k))
    if differ:
        raise InvalidParameterError(f"--out {out} holds a tuning run with other settings ({', '.join(differ)} "
                                    "differ); resume it with the same command, or choose another directory")


@dataclass
class _Run:
    """What every study of one tuning run shares."""

    out: Path
    data_dir: Path
    #: the benchmark that loaded ``data`` (a spec's model is sized by the data its benchmark loaded)
    bench: Any
    data: Any
    trial_data: Any
    seed: int
    train_options: dict[str, Any]
    budget_trials: int
    budget_steps: int | None
    pruner: str
    startup_trials: int
    task_names: list[str]
    #: how configurations are selected (:func:`mtlflow.jobs.tune_folds.resolve_selection`)
    selection: dict[str, Any]
    #: the k-fold partitions of train + val (None: selection on the validation split)
    folds: list[Any] | None
    #: ``tpe`` (the search) or ``grid`` (every point of a categorical space once: the exhaustive reference)
    sampler: str = "tpe"

    def plan(self, spec: StudySpec, params: Mapping[str, Any], seed: int | None = None) -> jobs.TrainPlan:
        options, hparams = split_params(params)
        return jobs.plan_train(self.data_dir, method=spec.method, seed=self.seed if seed is None else seed,
                               hparams={**spec.hparams, **hparams}, tasks=spec.tasks,
                               **{**self.train_options, **options})


def _open_study(run: _Run, spec: StudySpec, storage: Any) -> tuple[optuna.Study, Any, tune_study.Budget]:
    """The study of ``spec`` (created on first use with its scorer's reference, one per fold with k-fold
    selection) and its budget (a whole trial: every fold's steps)."""
    import optuna

    plan = run.plan(spec, {})
    # a k-fold trial is one run per fold (fold 0 judged by the pruner); without folds one run on the search data
    datasets = run.folds or [run.trial_data]
    fitted = [fit_budget(plan.config, len(d.splits["train"])) for d in datasets]
    study = optuna.create_study(storage=storage, study_name=spec.name, direction="minimize", load_if_exists=True,
                                sampler=tune_study.build_sampler(run.seed, run.startup_trials),
                                pruner=tune_study.build_pruner(run.pruner, fitted[0]["max_epochs"]))
    key = "fold_scorers" if run.folds else "scorer"
    with file_lock(run.out / tune_study.STUDY_LOCK):
        if key not in study.user_attrs:
            scorers = [untrained_scorer(Trainer(run.bench, d, plan.config, run.out / "unused", progress=False,
                                                eval_splits=SEARCH_SPLITS)).as_dict() for d in datasets]
            study.set_user_attr(key, scorers if run.folds else scorers[0])
    trial_steps = sum(f["steps_per_epoch"] * f["max_epochs"] for f in fitted)
    budget = tune_study.Budget(run.budget_steps or run.budget_trials * trial_steps, trial_steps,
                               fitted[0]["max_epochs"])
    stored = study.user_attrs[key]
    scorer = [Scorer.from_dict(d) for d in stored] if run.folds else Scorer.from_dict(stored)
    return study, scorer, budget


def _search(run: _Run, spec: StudySpec, storage: Any, worker: str, progress: bool) -> optuna.Study:
    """Run trials of ``spec``'s study until its budget is spent (by this and any other worker)."""
    from optuna.trial import TrialState

    study, scorer, budget = _open_study(run, spec, storage)
    while True:
        asked = time.perf_counter()
        claim = tune_study.claim_trial(study, run.out, worker, spec.space, budget, run.seed, run.startup_trials,
                                       grid=run.sampler == "grid")
        if claim is None:
            return study
        trial = claim.trial
        sampler_seconds = time.perf_counter() - asked
        run_dir = run.out / "trials" / spec.name / f"{trial.number:04d}"
        trial.set_user_attr(tune_study.RUN_DIR, str(run_dir.relative_to(run.out)))
        try:
            plan = run.plan(spec, trial.params)
            if run.folds:
                outcome = tune_folds.run_fold_trial(tune_folds.FoldSearch(run.bench, run.folds, scorer),
                                                    plan.config, run_dir, trial, claim.adopted)
            else:
                outcome = run_trial({"bench": run.bench, "data": run.trial_data, "config": plan.config}, run_dir,
                                    trial, scorer, resume=claim.adopted)
        except Exception:  # a bug or a refused configuration: the trial fails, the error is the user's to see
            trial.set_user_attr(tune_study.STEPS, tune_folds.trial_steps(run_dir)[0])
            study.tell(trial, state=TrialState.FAIL)
            raise
        for key, value in ((tune_study.STEPS, outcome.steps), ("epochs", outcome.epochs), ("outcome", outcome.state),
                           ("seconds", outcome.seconds), ("optuna_seconds", outcome.optuna_seconds + sampler_seconds)):
            trial.set_user_attr(key, value)
        study.tell(trial, outcome.value if outcome.state != PRUNED else None,
                   state=TrialState.PRUNED if outcome.state == PRUNED else TrialState.COMPLETE)
        if progress:
            print(f"tune: {spec.name} trial {trial.number} {outcome.state} value {outcome.value} "
                  f"({outcome.steps} steps) {trial.params}", file=sys.stderr)


def _wait_for_workers(run: _Run, study: optuna.Study) -> None:
    """Wait until no live worker runs a trial of ``study`` (their results belong to the search)."""
    while tune_study.others_running(study, run.out):
        time.sleep(POLL_SECONDS)


def study_summary(study: optuna.Study, spec: StudySpec, budget: tune_study.Budget) -> dict[str, Any]:
    """A finished study: its space, the chosen configuration, the best validation score, the budget spent (steps
    from the runs' records, trials, pruned, diverged, wall time and Optuna's share of it) and every trial."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    best = tune_study.best_trial(study)
    if best is None:
        raise InvalidParameterError(f"study {spec.name}: no trial completed with a finite validation score (every "
                                    "trial was pruned, diverged or failed); raise the budget or narrow the space")
    options, hparams = split_params(best.params)
    seconds = sum(float(t.user_attrs.get("seconds", 0.0)) for t in trials)
    # sampling (the claim, with ask) and pruning (report, should_prune); tell is one journal append
    optuna_seconds = sum(float(t.user_attrs.get("optuna_seconds", 0.0)) for t in trials)
    outcome = [t.user_attrs.get("outcome") for t in trials]
    return {
        "kind": spec.kind, "method": spec.method, "tasks": spec.tasks,
        "space": {k: v.as_dict() for k, v in spec.space.items()}, "fixed_hparams": spec.hparams,
        "chosen": {"train_options": options, "hparams": hparams}, "best_trial": best.number,
        "best_value": best.value,
        "spent": {"steps": tune_study.spent_steps(trials), "budget_steps": budget.steps,
                  "trial_steps": budget.trial_steps, "trial_epochs": budget.trial_epochs, "trials": len(trials),
                  "complete": outcome.count("complete"), "pruned": outcome.count(PRUNED),
                  "diverged": outcome.count(DIVERGED),
                  "failed": sum(t.state == TrialState.FAIL for t in trials),
                  "wall_seconds": seconds, "optuna_seconds": optuna_seconds,
                  "optuna_share": optuna_seconds / seconds if seconds > 0 else None},
        "trials": [{"number": t.number, "state": t.state.name.lower(), "outcome": t.user_attrs.get("outcome"),
                    "params": t.params, "value": t.value if t.value is None or math.isfinite(t.value) else "inf",
                    "steps": t.user_attrs.get(tune_study.STEPS), "epochs": t.user_attrs.get("epochs"),
                    "run_dir": t.user_attrs.get(tune_study.RUN_DIR)} for t in trials],
    }


def retrain(run: _Run, spec: StudySpec, chosen: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
            folder: str = "retrain") -> list[str]:
    """Train the chosen configuration with each fresh seed into ``<out>/<folder>/<study>/seed-<s>`` (a run already
    completed is kept, one cut short is resumed) and evaluate it on test with per-example values; returns the run
    directories."""
    dirs = []
    for seed in seeds:
        run_dir = run.out / folder / spec.name / f"seed-{seed}"
        done = (run_dir / "run.json").is_file() and atomic.read_json(run_dir / "run.json", "run").get("status") \
            == "completed"
        if not done:
            jobs.train(run.data_dir, run_dir, method=spec.method, seed=seed,
                       hparams={**spec.hparams, **chosen["hparams"]}, tasks=spec.tasks, resume=run_dir.exists(),
                       progress=False, **{**run.train_options, **chosen["train_options"]})
        evaluation = run_dir / jobs.split_evaluation_name("test")
        if not done or not evaluation.is_file():
            jobs.evaluate(run_dir, run.data_dir, split="test", out_file=evaluation, per_example=True)
        dirs.append(str(run_dir))
    return dirs


def _load(plan: jobs.TrainPlan) -> tuple[Path, Any]:
    if plan.data_dir is None:
        return cached_data(plan.bench)
    return plan.data_dir, plan.bench.load(plan.data_dir)


def _validation_warnings(selection: Mapping[str, Any]) -> list[str]:
    """A warning when configurations were ranked on a validation split too small to rank them (forced)."""
    if selection["mode"] == "kfold" or not selection["small_validation"]:
        return []
    rows = min(selection["val_rows"].values())
    return [f"the validation split has {rows} labelled rows in its smallest task (fewer than {MIN_VALIDATION_ROWS}) "
            "and --selection holdout ranked configurations on it anyway: the chosen configurations may be noise; "
            "the rule is k-fold cross-validation over train + val (--selection auto or kfold)"]


def _prepare_folds(run: _Run) -> list[Any] | None:
    """The fold datasets of a k-fold selection (None on the validation split)."""
    if run.selection["mode"] != "kfold":
        return None
    assignment = tune_folds.assign_folds(tune_folds.row_keys(run.data_dir, run.data, run.seed),
                                         run.selection["folds"])
    run.selection["fold_rows"] = [int((assignment == i).sum()) for i in range(run.selection["folds"])]
    return tune_folds.fold_data(run.data, assignment)


def tune(out_dir: str | Path, methods_to_tune: Sequence[str] = (BASELINE,), *, data_dir: str | Path | None = None,
         benchmark: str | None = None, data_options: Mapping[str, Any] | None = None,
         tasks: Sequence[str] | None = None, budget_trials: int = BUDGET_TRIALS, budget_steps: int | None = None,
         seed: int = 0, retrain_seeds: int = RETRAIN_SEEDS, references: bool | None = None,
         search_spaces: Mapping[str, Mapping[str, Any]] | None = None,
         hparams: Mapping[str, Mapping[str, Any]] | None = None, train_options: Mapping[str, Any] | None = None,
         pruner: str = "successive-halving", startup_trials: int = tune_study.STARTUP_TRIALS, resume: bool = False,
         worker: bool = False, compare: bool = True, progress: bool = True, selection: str = "auto",
         folds: int = tune_folds.DEFAULT_FOLDS, studies: Sequence[str] | None = None,
         sampler: str = "tpe", defaults: bool = True) -> dict[str, Any]:
    """Tune every method of ``methods_to_tune`` (LS always) and, with ``references`` (default: more than one task),
    a single-task LS reference per task, on ``data_dir`` (prepared) or ``benchmark`` (+ ``data_options``, into the
    cache); retrain each chosen configuration with ``retrain_seeds`` fresh seeds, compare them
    (``<out>/comparison``, with ``compare``) and write ``<out>/tune.json``, which is returned.

    Plain arguments only (a KFP component or DVC stage calls it as is): ``search_spaces`` maps ``*`` or a method to
    ``{setting: {scale, low, high} | {choices} | None}``; ``hparams`` maps a method to fixed hyper-parameters;
    ``train_options`` are RunConfig options of every trial and retrained run (a shared setting given there is not
    searched). ``resume`` continues a killed run (same request); ``worker`` joins a running one as an extra
    process that runs trials only and returns ``{"worker": id}`` when no budget is left. ``selection``: ``auto``
    (k-fold cross-validation over train + val with ``folds`` folds where the validation split is too small to rank
    configurations, :mod:`mtlflow.jobs.tune_folds`), ``kfold`` or ``holdout`` (the validation split);
    ``sampler="grid"`` runs every point of a space of categorical ranges once instead of TPE (with
    ``budget_trials`` the grid's size and pruner ``none``: the exhaustive grid a multi-fidelity search is
    measured against, :mod:`mtlflow.experiments.tune_bench`). ``studies``
    (names of the plan's studies) makes this process a worker of those studies only, returning when their budgets
    are spent: a pipeline runs one task per study, then the retrain and comparison with ``resume``.
    ``defaults``: train the methods at their defaults too, for the tuning gains (:mod:`mtlflow.jobs.tune_report`)."""
    out = check_output_dir(out_dir, "--out", [("--data", data_dir)] if data_dir is not None else [])
    if budget_trials < 1 or (budget_steps is not None and budget_steps < 1) or retrain_seeds < 0:
        raise InvalidParameterError("--budget-trials and --budget-steps must be >= 1 and --retrain-seeds >= 0")
    if worker and not (out / PLAN_NAME).is_file():
        raise InvalidParameterError(f"--worker joins a tuning run, but --out {out} holds none; start it without "
                                    "--worker first")
    options = dict(train_options or {})
    base = jobs.plan_train(data_dir, benchmark, data_options, BASELINE, seed, (hparams or {}).get(BASELINE), tasks,
                           **options)
    references = len(base.bench.select_tasks(tasks)) > 1 if references is None else references
    specs = study_specs(base.bench, methods_to_tune, tasks, references, search_spaces or {}, hparams or {},
                        list(options))
    unknown = sorted(set(studies or ()) - {s.name for s in specs})
    if unknown:
        raise InvalidParameterError(f"no study {', '.join(unknown)} in this tuning run; its studies are "
                                    f"{', '.join(s.name for s in specs)}")
    worker = worker or studies is not None
    request = {"benchmark": base.bench.name, "benchmark_config": dict(base.bench.config), "tasks": tasks,
               "studies": [s.name for s in specs], "spaces": {s.name: {k: v.as_dict() for k, v in s.space.items()}
                                                          for s in specs},
               "hparams": {s.name: s.hparams for s in specs}, "train_options": options, "seed": seed,
               "budget_trials": budget_trials, "budget_steps": budget_steps, "pruner": pruner,
               "startup_trials": startup_trials, "retrain_seeds": retrain_seeds, "selection": selection,
               "folds": folds, **({"sampler": sampler} if sampler != "tpe" else {})}
    tune_study.pruner_settings(pruner, 1)  # an unknown pruner is refused before any data is read
    tune_folds.check_selection(selection, folds)  # and an unknown selection or sampler
    if sampler not in tune_study.SAMPLERS:
        raise InvalidParameterError(f"unknown sampler {sampler!r}; valid: {', '.join(tune_study.SAMPLERS)}")
    for spec in specs if sampler == "grid" else ():
        tune_study.grid_of(spec.space)
    _claim_work_dir(out, json.loads(json.dumps(request, default=str)), resume or worker)  # as plan.json reads
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    prepared, data = _load(base)
    names = [t.name for t in base.bench.select_tasks(tasks)]
    run = _Run(out, Path(prepared), base.bench, data, search_data(data), seed, options, budget_trials, budget_steps,
               pruner, startup_trials, names,
               tune_folds.resolve_selection(selection, folds, tune_folds.validation_rows(data, names)), None, sampler)
    run.folds = _prepare_folds(run)
    storage = tune_study.storage(out)
    started = time.perf_counter()
    with tune_study.worker_lock(out) as me:
        searched = [s for s in specs if studies is None or s.name in studies]
        found = {spec.name: _search(run, spec, storage, me, progress) for spec in searched}
        if worker:
            return {"worker": me, "studies": [s.name for s in searched]}
        for spec in specs:  # a pruned trial of another worker may free budget: search again after it ends
            while tune_study.others_running(found[spec.name], out):
                time.sleep(POLL_SECONDS)
                found[spec.name] = _search(run, spec, storage, me, progress)
    return _finish(run, specs, found, storage, retrain_seeds, compare, time.perf_counter() - started, defaults)


def _finish(run: _Run, specs: Sequence[StudySpec], studies: Mapping[str, optuna.Study], storage: Any,
            retrain_seeds: int, compare: bool, seconds: float, defaults: bool = True) -> dict[str, Any]:
    """Summarise every study, retrain the chosen configurations, compare them (and the methods at their
    defaults, with ``defaults``), write ``tune.json`` and the tuning report."""
    import optuna

    seeds = [run.seed + i for i in range(1, retrain_seeds + 1)]
    summaries = {}
    for spec in specs:
        _, _, budget = _open_study(run, spec, storage)
        summaries[spec.name] = study_summary(studies[spec.name], spec, budget)
        summaries[spec.name]["retrained"] = retrain(run, spec, summaries[spec.name]["chosen"], seeds)
    result: dict[str, Any] = {
        "schema": 1, "benchmark": run.data.manifest.get("benchmark"), "data": str(run.data_dir),
        "data_hash": run.data.content_hash, "tasks": run.task_names, "baseline": BASELINE,
        "search_seed": run.seed, "retrain_seeds": seeds, "train_options": run.train_options,
        "budget": {"rule": "per study the same optimizer steps: a trial starts only while the budget covers a whole "
                           "trial beyond the finished trials' recorded steps and a whole trial per running one; "
                           "pruned trials count the steps they ran",
                   "budget_trials": run.budget_trials, "budget_steps": run.budget_steps},
        "objective": "validation score of the epoch each trial's selection rule keeps: mean over tasks of the "
                     "relative change of the primary metric's error on val against the untrained model's (lower "
                     "is better; with k-fold selection the mean of that score over the folds, each fold's val "
                     "against the untrained model's on it); the test split is never evaluated during the search",
        "selection": run.selection,
        "sampler": ({"name": "GridSampler", "optuna": optuna.__version__, "seed": run.seed} if run.sampler == "grid"
                    else {"name": "TPESampler", "optuna": optuna.__version__, **tune_study.SAMPLER_SETTINGS,
                          "n_startup_trials": run.startup_trials,
                          "seed": f"per trial: SeedSequence([{run.seed}, number])"}),
        "pruner": tune_study.pruner_settings(run.pruner, max(s["spent"]["trial_epochs"] for s in summaries.values())),
        "storage": {"journal": tune_study.JOURNAL_NAME,
                    "dashboard": DASHBOARD.format(journal=run.out / tune_study.JOURNAL_NAME)},
        "seconds": seconds, "studies": summaries, "warnings": _validation_warnings(run.selection),
    }
    if compare and retrain_seeds:
        runs = [d for s in specs if s.kind == "method" for d in summaries[s.name]["retrained"]]
        refs = [d for s in specs if s.kind == "reference" for d in summaries[s.name]["retrained"]]
        kept = tune_report.fit_baselines(run.data_dir, run.out)
        jobs.aggregate(runs, run.out / "comparison", reference_dirs=refs, baseline_dirs=kept)
        result["comparison"] = {"dir": "comparison", "results": "comparison/results.json",
                                "report": "comparison/report.html", "baselines": kept}
        if defaults:
            result["defaults"] = tune_report.compare_defaults(
                {s.name: retrain(run, s, {"train_options": {}, "hparams": {}}, seeds, tune_report.DEFAULTS_DIR)
                 for s in specs if s.kind == "method"}, refs, kept, run.out)
        result["report"] = {"html": tune_report.HTML_NAME, "markdown": tune_report.MARKDOWN_NAME}
    atomic.write_json(run.out / RESULT_NAME, result)
    if "report" in result:
        tune_report.write_tune_report(run.out)
    return result
