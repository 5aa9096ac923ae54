"""Tuning on the cluster with Katib (behind the ``launch_katib`` component): one Katib Experiment per method, its
trials Kubeflow Trainer TrainJobs running ``mtlflow train`` with the trial's values, created, awaited and read
back as each method's best trial. The manifests and their lifecycle are :mod:`mtlflow.ops.katib`'s; this module
decides what they contain, by the rules of ``mtlflow tune`` (:mod:`mtlflow.jobs.tune`), so that a method is
tuned on the cluster as it is locally:

* **the same search space**: :func:`mtlflow.jobs.tune.study_specs` (the shared space for every method, a setting
  the user fixes is not searched);
* **the same budget**: ``budget_steps`` optimizer steps per method (default ``budget_trials`` whole trials), a
  trial's steps counted by :func:`mtlflow.engine.trainer.fit_budget` for the trial's own topology. Katib counts
  trials, not steps, so the Experiment runs :func:`trials_in_budget` trials: as many whole trials as the budget
  holds. A trial median stopping ends early leaves its unspent steps unused (``mtlflow tune`` would spend them on
  another trial): a Katib study spends at most the local one's budget, never more;
* **the same score**: the objective is the validation score of :class:`~mtlflow.jobs.tune_trial.Scorer` against
  the study's fixed reference (the untrained model's val metrics, computed here once per method and written next
  to the trials as ``scorer.json``), printed by the trial (``mtlflow train --katib-metrics``,
  :mod:`mtlflow.jobs.katib_metrics`); the test split is never read by the search;
* **the same sampler** as far as Katib allows: Optuna's multivariate TPE with constant liar, seeded with
  ``seed``, ``startup_trials`` random trials and the local ``n_ei_candidates`` -- but Katib 0.19's Optuna service
  runs Optuna 3.3 (``mtlflow tune`` pins its own Optuna), so the two draw different configurations;
* **early stopping**: Katib has median stopping only (no successive halving): a trial whose mean validation score
  over its first :func:`median_start_step` epochs is worse than the completed trials' is stopped, once
  :data:`MEDIAN_MIN_TRIALS` trials completed.

Layout on the checkpoints PVC: ``<checkpoints>/katib/<key>/<study>/scorer.json`` and one run directory per trial
``.../<study>/<trial name>/`` (``--resume``: a restarted trial pod continues its run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.config.cluster import ClusterProfile
from mtlflow.config.pipeline import from_struct
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange
from mtlflow.engine.trainer import Trainer, fit_budget
from mtlflow.jobs import katib_metrics, tune, tune_study
from mtlflow.jobs.launch import JOB_CLAIMS, stage_dataset
from mtlflow.jobs.tune_trial import SEARCH_SPLITS, search_data, untrained_scorer
from mtlflow.methods.search import SHARED_SPACE
from mtlflow.metrics.selection import BEST_VAL, parse_selection
from mtlflow.ops import k8s_jobs, katib
from mtlflow.ops.storage import StorageLayout

#: median stopping compares with the completed trials' mean; below three completed trials that mean is noise
#: (Katib's own default, explicit)
MEDIAN_MIN_TRIALS = 3
#: the label of an Experiment naming its study (the method)
STUDY_LABEL = "mtlflow/study"
#: failed trials (e.g. a diverged run) an Experiment tolerates before it fails
MAX_FAILED_TRIALS = 3


def trials_in_budget(budget_steps: int, trial_steps: int) -> int:
    """The whole trials of ``trial_steps`` optimizer steps a budget of ``budget_steps`` holds (at least one): Katib's
    ``maxTrialCount``."""
    return max(1, budget_steps // trial_steps)


def median_start_step(max_epochs: int) -> int:
    """The epoch at which median stopping first judges a trial: the local successive halving's second rung
    (``min_resource x reduction_factor``, epoch 3), within the trial's epochs."""
    settings = tune_study.HALVING_SETTINGS
    return max(1, min(max_epochs, settings["min_resource"] * settings["reduction_factor"]))


def parse_assignment(value: str, search: SearchRange) -> Any:
    """A Katib parameter value (a string) as the value of its search range."""
    if search.scale == "categorical":
        by_string = {katib.categorical_value(choice): choice for choice in search.choices}
        if value not in by_string:
            raise InvalidParameterError(f"Katib returned {value!r}, which is none of the choices {search.describe()}")
        return by_string[value]
    return int(value) if search.scale == "int" else float(value)


@dataclasses.dataclass(frozen=True)
class _Cluster:
    """Where and how the trials run."""

    layout: StorageLayout
    profile: ClusterProfile
    namespace: str
    image: str
    num_nodes: int
    gpus_per_node: int
    run_id: str
    #: the launcher's pod as the Experiments' ownerReference (None: not in a pod of that namespace)
    owner: Mapping[str, Any] | None


def _study(spec: tune.StudySpec, staged: Path, data: Any, options: Mapping[str, Any], seed: int, work_dir: Path,
           cluster: _Cluster, search: Mapping[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study's Experiment manifest and what the result records of it (budget, trial count)."""
    plan = jobs.plan_train(staged, method=spec.method, seed=seed, hparams=spec.hparams, tasks=spec.tasks, **options)
    fitted = fit_budget(plan.config, len(data.splits["train"]), cluster.num_nodes * cluster.gpus_per_node)
    trial_steps = fitted["steps_per_epoch"] * fitted["max_epochs"]
    budget_steps = search["budget_steps"] or search["budget_trials"] * trial_steps  # mtlflow tune's budget rule
    max_trials = trials_in_budget(budget_steps, trial_steps)
    scorer_plan = jobs.plan_train(staged, method=spec.method, seed=seed, hparams=spec.hparams, tasks=spec.tasks,
                                  **{**options, "device": "cpu"})  # the launcher pod has no accelerator
    with tempfile.TemporaryDirectory() as unused:
        trainer = Trainer(scorer_plan.bench, search_data(data), scorer_plan.config, unused, progress=False,
                          eval_splits=SEARCH_SPLITS)
        scorer = untrained_scorer(trainer)
    study_dir = work_dir / spec.name
    atomic.write_json(study_dir / "scorer.json", scorer.as_dict())
    run_spec = json.dumps({"method": spec.method, "seed": seed, "hparams": spec.hparams, "tasks": spec.tasks})
    trial_options = {k: v for k, v in options.items() if k != "epochs"}
    command = k8s_jobs.train_command(str(staged), f"{study_dir}/{katib.placeholder(katib.TRIAL_NAME)}", run_spec,
                                     plan.config.epochs, trial_options)
    command += katib.trial_arguments(spec.space, list(SHARED_SPACE)) + ["--katib-metrics", str(study_dir / "scorer.json")]
    name = katib.experiment_name(f"{spec.name}-{work_dir.name}")
    job = k8s_jobs.DistributedTraining(
        name=name, namespace=cluster.namespace, image=cluster.image, command=command, num_nodes=cluster.num_nodes,
        gpus_per_node=cluster.gpus_per_node, profile=cluster.profile,
        timeout_seconds=cluster.profile.trainjob.deadline_seconds,
        volumes=tuple(k8s_jobs.Volume(claim, cluster.layout.mount(claim)) for claim in JOB_CLAIMS))
    plan_search = katib.Search(
        max_trials=max_trials, parallel_trials=min(search["parallel_trials"], max_trials), seed=seed,
        startup_trials=search["startup_trials"], ei_candidates=tune_study.SAMPLER_SETTINGS["n_ei_candidates"],
        median_min_trials=MEDIAN_MIN_TRIALS, median_start_step=median_start_step(fitted["max_epochs"]),
        max_failed_trials=min(MAX_FAILED_TRIALS, max_trials))
    strategy = "min" if parse_selection(plan.config.selection)[0] == BEST_VAL else "latest"
    labels = {STUDY_LABEL: spec.name}
    if cluster.run_id:
        labels[k8s_jobs.RUN_ID_LABEL] = re.sub(r"[^A-Za-z0-9_.-]", "-", cluster.run_id)[:63].strip("-_.")
    manifest = katib.experiment_manifest(name, cluster.namespace, spec.space, k8s_jobs.trainjob_manifest(job),
                                         plan_search, katib_metrics.metric_names(plan.bench.select_tasks(spec.tasks)),
                                         strategy, labels, cluster.owner)
    record = {"experiment": name, "method": spec.method, "tasks": spec.tasks, "max_trials": max_trials,
              "parallel_trials": plan_search.parallel_trials, "budget_steps": budget_steps, "trial_steps": trial_steps,
              "space": {k: v.as_dict() for k, v in spec.space.items()}, "objective_strategy": strategy}
    return manifest, record


def _best(obj: Mapping[str, Any], spec: tune.StudySpec, record: Mapping[str, Any]) -> dict[str, Any]:
    best = katib.best_trial(obj)
    if not best["parameters"]:
        raise InvalidParameterError(f"Experiment {record['experiment']} succeeded without a best trial (no trial "
                                    f"reported {katib.OBJECTIVE}); check its trials' logs")
    values = {name: parse_assignment(best["parameters"][name], search) for name, search in spec.space.items()}
    options, hparams = tune.split_params(values)
    return {**record, "best_trial": best["trial"], "train_options": options, "hparams": {**spec.hparams, **hparams},
            "metrics": best["metrics"], "trials": best["trials"]}


def _work_key(request: Mapping[str, Any]) -> str:
    """The tuning run's directory name: a hash of everything it depends on (a retry of the same request, in the
    same pipeline run, finds its Experiments and trial directories again)."""
    return "tune-" + hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()[:12]


def launch_katib(data: str, data_metadata: Mapping[str, Any], storage_root: str, methods_to_tune: Sequence[str],
                 image: str, *, tasks: Sequence[str] | None = None, budget_trials: int = tune.BUDGET_TRIALS,
                 budget_steps: int | None = None, seed: int = 0,
                 search_spaces: Mapping[str, Mapping[str, Any]] | None = None,
                 hparams: Mapping[str, Mapping[str, Any]] | None = None,
                 train_options: Mapping[str, Any] | None = None, parallel_trials: int = 1,
                 startup_trials: int = tune_study.STARTUP_TRIALS, num_nodes: int = 1, gpus_per_node: int = 1,
                 namespace: str = "", timeout_seconds: int = 7 * 24 * 3600, run_id: str = "",
                 profile: Mapping[str, Any] | None = None, poll_seconds: float = 60.0,
                 result_out: str | None = None) -> dict[str, Any]:
    """Tune every method of ``methods_to_tune`` (LS always, as in ``mtlflow tune``) with one Katib Experiment each
    in ``namespace`` (default: the profile's, else this pod's), await them (``timeout_seconds`` in all) and return
    each method's best trial: ``{"studies": {name: {experiment, best_trial, train_options, hparams, metrics,
    trials, max_trials, budget_steps, ...}}}``. The arguments mean what :func:`mtlflow.jobs.tune.tune`'s do;
    ``parallel_trials`` is Katib's ``parallelTrialCount`` (within each Experiment; the namespace's TrainJob quota
    bounds how many run). A retried launcher re-attaches to the Experiments of the same request. The studies are
    also written to ``<work dir>/katib.json`` and, given, ``result_out``."""
    if not image:
        raise InvalidParameterError("launch_katib needs the image the trials run (the project image)")
    if budget_trials < 1 or (budget_steps is not None and budget_steps < 1) or parallel_trials < 1:
        raise InvalidParameterError("budget_trials, budget_steps and parallel_trials must be >= 1")
    layout = StorageLayout(storage_root)
    cluster_profile = ClusterProfile.model_validate(from_struct(dict(profile or {})))
    options = from_struct(dict(train_options or {}))
    staged, content_hash = stage_dataset(data, data_metadata, layout)
    base = jobs.plan_train(staged, method=tune.BASELINE, seed=seed, hparams=(hparams or {}).get(tune.BASELINE),
                           tasks=tasks, **options)
    specs = tune.study_specs(base.bench, methods_to_tune, tasks, False, search_spaces or {}, hparams or {},
                             list(options))
    search = {"budget_trials": budget_trials, "budget_steps": budget_steps, "parallel_trials": parallel_trials,
              "startup_trials": startup_trials}
    request = {"data": content_hash, "studies": [dataclasses.asdict(s) for s in specs], "options": options,
               "seed": seed, "search": search, "topology": [num_nodes, gpus_per_node], "run": run_id}
    work_dir = Path(layout.checkpoints) / "katib" / _work_key(request)
    namespace = namespace or cluster_profile.namespace or k8s_jobs.current_namespace()
    core = k8s_jobs.core_api()
    katib.check_namespace(core, namespace)  # before the scorers are computed: a refused namespace fails at once
    cluster = _Cluster(layout, cluster_profile, namespace, image, num_nodes, gpus_per_node, run_id,
                       k8s_jobs.launcher_owner(core, namespace))
    loaded = base.bench.load(staged)
    built = [_study(spec, staged, loaded, options, seed, work_dir, cluster, search) for spec in specs]
    manifests = [manifest for manifest, _ in built]
    api = k8s_jobs.custom_objects_api()
    with katib.deleted_on_termination(manifests, api):
        for manifest in manifests:
            print(f"submitting Experiment {cluster.namespace}/{manifest['metadata']['name']}: "
                  f"{manifest['spec']['maxTrialCount']} trials, {len(manifest['spec']['parameters'])} parameters")
            katib.submit(manifest, api)
        finished = katib.await_experiments(manifests, api, timeout_seconds, poll_seconds)
    studies = {spec.name: _best(finished[record["experiment"]], spec, record)
               for spec, (_, record) in zip(specs, built, strict=True)}
    for target in (work_dir / "katib.json", *([result_out] if result_out else [])):
        atomic.write_json(target, studies)
    return {"work_dir": str(work_dir), "studies": studies}

