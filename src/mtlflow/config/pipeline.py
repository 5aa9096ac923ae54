"""The pipelines' parameters (:class:`SweepConfig`, :class:`RetrainConfig`, :class:`DistributedTrainConfig`:
each pipeline's signature is one of them, field for field) and the expansion of a sweep into runs (used
by the plan components, compile and submit).

Kept free of kfp so that invalid parameters are rejected before anything is compiled or submitted.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtlflow import methods as registry
from mtlflow.config.data import VersionedDataConfig
from mtlflow.config.model import option
from mtlflow.config.run import RunConfig
from mtlflow.core.budget import YIELDING_RULES, layered_budget
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import check_seed
from mtlflow.methods.search import search_space
from mtlflow.metrics.paired import check_margins


def from_struct(value: Any) -> Any:
    """Undo the float conversion of protobuf structs: integral floats in dicts/lists become ints.

    Pipeline parameters of type dict or list travel as ``google.protobuf.Struct``, which stores every
    number as a double, so ``seeds=[0]`` arrives as ``[0.0]``. Float hyper-parameters are converted
    back by :class:`mtlflow.core.hparams.HParam`.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [from_struct(v) for v in value]
    if isinstance(value, dict):
        return {k: from_struct(v) for k, v in value.items()}
    return value


def validate_sweep(methods: Sequence[str], seeds: Sequence[int], method_hparams: Mapping[str, Any] | None = None,
                   epochs: int | None = None, n_tasks: int = 2) -> None:
    """Reject unknown methods, empty lists, bad seeds, bad epochs and invalid hyper-parameters."""
    if not methods:
        raise InvalidParameterError("the method list is empty; give at least one method")
    if not seeds:
        raise InvalidParameterError("the seed list is empty; give at least one seed")
    for name, values in (("methods", methods), ("seeds", seeds)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InvalidParameterError(f"{name} must be a list, got {values!r}; write e.g. [{values}]")
        refuse_repeats(name, values)
    for seed in seeds:
        check_seed(seed, "every seed")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise InvalidParameterError(f"epochs must be a positive integer, got {epochs!r}")
    hparams = dict(method_hparams or {})
    stray = sorted(set(hparams) - set(methods))
    if stray:
        raise InvalidParameterError(f"method_hparams names methods not in the sweep: {', '.join(stray)}")
    for name in methods:
        registry.build(name, n_tasks, **hparams.get(name, {}))


def canonical_hparams(method: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters with the types their method declares (``alpha: 2`` -> ``2.0``), so a run is
    labelled ``fairgrad(alpha=2.0)`` whether it came through a struct, the CLI or params.yaml."""
    declared = registry.get(method).hparams
    return {k: declared[k].coerce(method, k, v) if k in declared else v for k, v in hparams.items()}


def refuse_repeats(name: str, values: Sequence[Any]) -> None:
    """Refuse a list that names a value twice: a repeated run would be counted as one more seed (or reference)
    with zero spread."""
    repeated = sorted({repr(v) for v in values if list(values).count(v) > 1})
    if repeated:
        raise InvalidParameterError(f"{name} lists {', '.join(repeated)} more than once; give each once")


def plan_runs(methods: Sequence[str], seeds: Sequence[int],
              method_hparams: Mapping[str, Any] | None = None) -> list[str]:
    seeds, method_hparams = from_struct(list(seeds)), from_struct(dict(method_hparams or {}))
    validate_sweep(methods, seeds, method_hparams)
    hparams = dict(method_hparams or {})
    return [json.dumps({"method": m, "seed": int(s), "hparams": canonical_hparams(m, hparams.get(m, {}))},
                       sort_keys=True) for m in methods for s in seeds]


def plan_references(tasks: Sequence[str], seeds: Sequence[int]) -> list[str]:
    seeds = from_struct(list(seeds))
    if not tasks:
        raise InvalidParameterError("the benchmark has no tasks to train references for")
    if not seeds:
        raise InvalidParameterError("reference_seeds is empty; Δm% needs at least one single-task run per task")
    refuse_repeats("reference_seeds", seeds)
    return [json.dumps({"method": "ls", "seed": int(s), "hparams": {}, "tasks": [t], "reference": True},
                       sort_keys=True) for t in tasks for s in seeds]


def plan_run(method: str, seed: int, hparams: Mapping[str, Any] | None = None) -> str:
    """The spec of one run (the ``retrain`` pipeline): ``{"method", "seed", "hparams"}``."""
    return plan_runs([method], [from_struct(seed)], {method: from_struct(dict(hparams or {}))} if hparams else {})[0]


def run_key(run_spec: str, data_hash: str, epochs: int, train_options: Mapping[str, Any], run_id: str = "") -> str:
    """Directory name of a run under the checkpoint root: readable prefix + hash of everything that
    determines the result (spec, data version, epochs, training options; not the device) and of the
    pipeline run's id ``run_id``.

    A retried or preempted task of the same pipeline run computes the same key and resumes from the
    checkpoint there; another pipeline run (``run_id`` differs) never picks up its checkpoint.
    """
    spec = json.loads(run_spec)
    options = {k: v for k, v in from_struct(dict(train_options)).items() if k != "device"}
    identity = {"spec": spec, "data": data_hash, "epochs": int(epochs), "options": options}
    if run_id:
        identity["run"] = run_id
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    tasks = "-".join(spec.get("tasks") or [])
    prefix = f"{spec['method']}-s{spec['seed']}" + (f"-{tasks}" if tasks else "")
    return f"{prefix}-{digest}"


#: KFP recurring runs use the 6-field cron format of robfig/cron: second minute hour day month weekday.
CRON_FIELDS = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")


def validate_cron(expression: str) -> str:
    """Check the field count of a KFP cron expression (6 fields, seconds first)."""
    fields = str(expression).split()
    if len(fields) != len(CRON_FIELDS):
        hint = f"; prepend the seconds: '0 {expression.strip()}'" if len(fields) == 5 else ""
        raise InvalidParameterError(f"cron {expression!r} has {len(fields)} fields but KFP needs 6 "
                                    f"({' '.join(CRON_FIELDS)}), e.g. '0 0 3 * * *' for 03:00 daily{hint}")
    return " ".join(fields)


# -- the pipelines' parameters ---------------------------------------------------------------------

#: the Kubernetes training-job kinds ``distributed_train`` can launch
JOB_KINDS = ("TrainJob", "PyTorchJob")
#: the sweep's default methods
DEFAULT_METHODS = ["ls", "mgda", "famo", "fairgrad"]
#: the sweep's default seeds of every method and of every single-task reference: a comparison is a result only
#: with its spread, and 3 seeds are the fewest that give one (the sweep's cost is 3x one seed's)
DEFAULT_SEEDS = [0, 1, 2]
#: the sweep's default budget: at most ``epochs`` (100), at least 500 optimizer steps, at least 8 steps an epoch
#: (the batch at most a 8th of the training rows) and early stopping after 10 epochs without a better validation
#: score, the best validation epoch selected (docs/guides/training.md). A user's ``train_options`` merge over it
#: key by key, and under :data:`mtlflow.core.budget.YIELDING_RULES`: a given ``epochs`` is the most a run trains,
#: so the default ``min_steps`` yields to it (:func:`pipeline_arguments`)
DEFAULT_BUDGET = {"min_steps": 500, "min_steps_per_epoch": 8, "patience": 10}
#: the options that size a run's training: a spec's recipe (its ``train:`` section over the spec defaults) owns
#: them when the data is a spec, in place of a pipeline's or ``params.yaml``'s defaults
BUDGET_KEYS = ("epochs", "batch_size", "min_steps", "min_steps_per_epoch", "patience")
#: RunConfig fields that a sweep's single-task references never take from ``train_options``: COST wraps the
#: method runs only (a reference is linear scalarisation of one task, the yardstick of Δm%)
METHOD_ONLY_OPTIONS = ("teleport", "teleport_options")


def check_gateway_address(address: str) -> None:
    """``host:port`` or ``http(s)://host[:port][/path]``; anything else is rejected with the fix."""
    parsed = urllib.parse.urlsplit(address if "://" in address else f"http://{address}")
    try:
        parsed.port  # noqa: B018 -- raises on a malformed port
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname or " " in address:
        raise InvalidParameterError(f"Pushgateway address {address!r} is not valid; use host:port or "
                                    "http://host:port, e.g. http://pushgateway.monitoring:9091")


def reference_options(train_options: Mapping[str, Any]) -> dict[str, Any]:
    """The training options of a single-task reference run: ``train_options`` without COST."""
    return {k: v for k, v in train_options.items() if k not in METHOD_ONLY_OPTIONS}


def check_train_options(bench: Any, method: str, epochs: int, train_options: Mapping[str, Any],
                        hparams: Mapping[str, Any] | None = None) -> RunConfig:
    """The run's :class:`RunConfig` as the trainer will see it (benchmark recipe, then ``train_options``).
    The device is checked by name only: the machine that validates (CI, a laptop) need not have the
    cluster's GPU."""
    device = str(train_options.get("device", "auto"))
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise InvalidParameterError(f"train_options.device {device!r} is not valid; use auto, cpu or cuda[:N]")
    options = {k: v for k, v in train_options.items() if k != "device"}
    for name in ("method", "seed", "hparams", "epochs", "tasks"):
        if name in options:
            raise InvalidParameterError(f"train_options.{name} is set by the pipeline's own parameters; "
                                        f"remove it from train_options")
    return RunConfig.for_benchmark(bench.train_defaults, method=method, epochs=epochs,
                                   hparams=dict(hparams or {}), **options)


def _assignments(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def merged_train_options(defaults: Mapping[str, Any], given: Mapping[str, Any],
                         epochs_given: bool) -> tuple[dict[str, Any], str]:
    """A user's ``train_options`` merged key by key over the ``defaults`` (never a whole-dict replacement that
    would silently drop the default budget), under :func:`~mtlflow.core.budget.layered_budget`'s rule with the
    pipeline's ``epochs`` (``epochs_given``: the user set it); returns the options and the one log line that
    says what was overridden and what of the default budget was kept or dropped."""
    asked = {**given, **({"epochs": None} if epochs_given else {})}
    options, dropped = layered_budget(defaults, asked)
    options.pop("epochs", None)  # a pipeline parameter of its own, never a train option
    budget = {k: v for k, v in defaults.items() if k != "device"}
    kept = {k: v for k, v in budget.items() if k not in given and k not in dropped}
    parts = [f"{', '.join(given)} overridden" if given else "nothing overridden"]
    if kept:
        parts.append(f"the default budget {_assignments(kept)} kept")
    if dropped:
        why = ", ".join(f"{a} given" for a, rule in YIELDING_RULES if rule in dropped)
        parts.append(f"{_assignments({k: budget[k] for k in dropped})} dropped ({why}: a default rule never "
                     "changes what was asked for)")
    return options, "train_options: " + "; ".join(parts)


def data_budget(config: PipelineConfig) -> tuple[dict[str, Any], int]:
    """The default ``train_options`` and ``epochs`` of a pipeline's runs: the pipeline's own, or, when the data
    is a spec, its own budget rule (the spec's ``train:`` section over the spec defaults) for :data:`BUDGET_KEYS`,
    the same budget ``mtlflow train --spec`` and the DVC route give it."""
    defaults = type(config).defaults()
    options, epochs = dict(defaults["train_options"]), defaults["epochs"]
    if config.spec:
        recipe = config.build_benchmark().train_defaults
        options = {**{k: v for k, v in options.items() if k not in BUDGET_KEYS},
                   **{k: recipe[k] for k in BUDGET_KEYS if k in recipe and k != "epochs"}}
        epochs = recipe.get("epochs", epochs)
    return options, epochs


def pipeline_arguments(pipeline: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The arguments ``pipeline`` runs with, from the user's ``params`` (``--param``, a parameter file): its
    ``train_options`` merged key by key over the defaults of :func:`data_budget` and ``epochs`` the data's
    default when not given, so that every entry point trains the same epochs for the same request. Returns
    them (validated) and the log line of the merge ('' when the user set neither)."""
    params = from_struct(dict(params))
    config = pipeline_config(pipeline, params)
    defaults, epochs = data_budget(config)
    given = dict(params.get("train_options") or {})
    options, note = merged_train_options(defaults, given, "epochs" in params)
    pipeline_defaults = type(config).defaults()
    resolved = dict(params)  # only what differs from the pipeline's own defaults is passed on
    if "train_options" in params or options != pipeline_defaults["train_options"]:
        resolved["train_options"] = options
    if "epochs" in params or epochs != pipeline_defaults["epochs"]:
        resolved["epochs"] = params.get("epochs", epochs)
    pipeline_config(pipeline, resolved)
    # the line is for a user who gave train_options: with epochs alone the documented rule needs no word
    return resolved, note if params.get("train_options") else ""


@dataclass
class PipelineConfig(VersionedDataConfig):
    """Parameters every pipeline takes: its data and the Pushgateway its metrics go to."""

    subject = "pipeline parameters"

    epochs: int = option(10, "training epochs of every run (the most, with early stopping)")
    train_options: dict[str, Any] = option(help="the runs' RunConfig fields by name (batch_size, lr, device, "
                                                "teleport, ...; see `mtlflow config schema`)",
                                           factory=lambda: {"device": "auto"})
    pushgateway: str = option("", "Prometheus Pushgateway (host:port) for the run metrics ('' = none)")

    def validate(self) -> None:
        super().validate()
        if self.pushgateway:
            check_gateway_address(self.pushgateway)


@dataclass
class BudgetedConfig(PipelineConfig):
    """A pipeline of many runs under the sweep's default budget (``benchmark_sweep``, ``tuned_sweep``)."""

    epochs: int = option(100, "the most training epochs of every run (the default budget stops earlier: "
                              "patience 10, at least 500 optimizer steps; a given epochs drops that minimum)")
    train_options: dict[str, Any] = option(help="the runs' RunConfig fields by name (batch_size, lr, device, "
                                                "min_steps, patience, ...; see `mtlflow config schema`), merged key "
                                                "by key over the default budget min_steps 500, min_steps_per_epoch "
                                                "8, patience 10", factory=lambda: {"device": "auto", **DEFAULT_BUDGET})


@dataclass
class SweepConfig(BudgetedConfig):
    """The benchmark sweep: every method x seed and the single-task references (``benchmark_sweep``,
    ``params.yaml``)."""

    methods: list[str] = option(help="the methods of the sweep", factory=lambda: list(DEFAULT_METHODS))
    seeds: list[int] = option(help="the seeds of every method", factory=lambda: list(DEFAULT_SEEDS))
    method_hparams: dict[str, Any] = option(help="hyper-parameters per method, e.g. {fairgrad: {alpha: 2.0}}",
                                            factory=dict)
    reference_seeds: list[int] = option(help="seeds of the single-task references (Δm%'s yardstick)",
                                        factory=lambda: list(DEFAULT_SEEDS))

    def validate(self) -> None:
        super().validate()
        bench = self.build_benchmark()
        validate_sweep(self.methods, self.seeds, self.method_hparams, self.epochs, n_tasks=len(bench.task_names))
        if not self.reference_seeds:
            raise InvalidParameterError("reference_seeds is empty; Δm% needs at least one single-task run per task")
        refuse_repeats("reference_seeds", self.reference_seeds)
        for seed in self.reference_seeds:
            check_seed(seed, "every reference seed")
        for method in self.methods:
            check_train_options(bench, method, self.epochs, self.train_options, self.method_hparams.get(method))
        check_train_options(bench, "ls", self.epochs, reference_options(self.train_options))


@dataclass
class SingleRunConfig(PipelineConfig):
    """One method run on a data version (``retrain``, ``distributed_train``)."""

    method: str = option("fairgrad", "the method")
    seed: int = option(0, "the run's seed")
    hparams: dict[str, Any] = option(help="the method's hyper-parameters", factory=dict)

    def validate(self) -> None:
        super().validate()
        bench = self.build_benchmark()
        validate_sweep([self.method], [self.seed], {self.method: self.hparams}, self.epochs,
                       n_tasks=len(bench.task_names))
        check_train_options(bench, self.method, self.epochs, self.train_options, self.hparams)


@dataclass
class RetrainConfig(SingleRunConfig):
    """Retrain one method on a new data version and promote it if it beats the champion (``retrain``)."""

    min_improvement: float = option(0.0, "how much the candidate must lower the model store's score (mean over "
                                           "tasks of the primary metric's error, both models on the new test "
                                           "split), besides being better with 95 % confidence; below 1 when "
                                           "every task's primary error lies in [0, 1], and below the champion's "
                                           "score on the split (checked by the gate)")
    non_inferiority_margin: dict[str, float] = option(
        help="per task, the largest worsening of its per-example error (in the task's units: 0/1 error, absolute "
             "error, loss) the candidate may have with confidence; a task not named gets 10 % of the champion's "
             "mean error on it", factory=dict)
    tuned: str = option("", "a tuning result (tune.json of `mtlflow tune` or tuned_sweep, a path the task can read): "
                            "the candidate is the method its comparison ranks best, with its chosen settings over "
                            "train_options, in place of method and hparams ('' = none)")

    def validate(self) -> None:
        super().validate()
        if self.tuned and not str(self.tuned).endswith(".json"):
            raise InvalidParameterError(f"tuned {self.tuned!r} is not a tuning result; give the path of a tune.json")
        if isinstance(self.min_improvement, bool) or not (math.isfinite(self.min_improvement)
                                                          and self.min_improvement >= 0):
            raise InvalidParameterError(f"min_improvement must be a number >= 0, got {self.min_improvement!r}")
        tasks = self.build_benchmark().tasks
        # the score is a mean of the tasks' primary errors: with each in [0, 1], no candidate improves it by 1
        bounded = all(t.metric_specs()[t.primary]["unit_interval"] for t in tasks)
        if bounded and self.min_improvement >= 1:
            raise InvalidParameterError(f"min_improvement {self.min_improvement:g} cannot be reached: the score is a "
                                        "mean of errors in [0, 1]; use a value below 1 (e.g. 0.01)")
        check_margins(self.non_inferiority_margin, [t.name for t in tasks])


@dataclass
class DistributedTrainConfig(SingleRunConfig):
    """One multi-GPU run as a Kubernetes training job (``distributed_train``)."""

    train_options: dict[str, Any] = option(help="the run's RunConfig fields by name (see `mtlflow config schema`)",
                                           factory=lambda: {"device": "cuda"})
    job_kind: str = option("TrainJob", f"the training job's kind: {' or '.join(JOB_KINDS)}")
    num_nodes: int = option(1, "nodes of the job")
    gpus_per_node: int = option(2, "GPUs per node")

    def validate(self) -> None:
        super().validate()
        if self.job_kind not in JOB_KINDS:
            raise InvalidParameterError(f"job_kind {self.job_kind!r} is not valid; use {' or '.join(JOB_KINDS)}")
        for key in ("num_nodes", "gpus_per_node"):
            if getattr(self, key) < 1:
                raise InvalidParameterError(f"{key} must be a positive integer, got {getattr(self, key)!r}")


#: where ``tuned_sweep`` runs its studies: Optuna in pipeline tasks (``mtlflow tune``'s studies; kfp.local too) or
#: Katib Experiments on the cluster (:mod:`mtlflow.jobs.katib_launch`)
TUNERS = ("optuna", "katib")
#: the pruners of ``mtlflow tune`` (:data:`mtlflow.jobs.tune_study.PRUNERS`, which a test keeps equal): named here so
#: that a bad one is refused before anything is compiled or submitted
TUNE_PRUNERS = ("successive-halving", "hyperband", "none")
#: how ``mtlflow tune`` selects configurations (:data:`mtlflow.jobs.tune_folds.SELECTIONS`, kept equal by a test)
TUNE_SELECTIONS = ("auto", "kfold", "holdout")


@dataclass
class TunedSweepConfig(BudgetedConfig):
    """The tuned sweep: one study per method (LS always, the baseline) and per single-task reference under the same
    budget in optimizer steps, the chosen configurations retrained with fresh seeds and compared (``tuned_sweep``,
    ``mtlflow tune``'s rules: docs/guides/tuning.md). Each trial and each retrained run trains under the sweep's
    budget rule (``epochs``, ``train_options``); a shared setting given in ``train_options`` (lr, weight_decay) is
    not searched."""

    methods: list[str] = option(help="the methods to tune (LS is always tuned: the baseline)",
                                factory=lambda: list(DEFAULT_METHODS))
    tasks: list[str] = option(help="the tasks to train ([] = all of the benchmark's)", factory=list)
    method_hparams: dict[str, Any] = option(help="fixed hyper-parameters per method, not searched, e.g. "
                                                 "{fairgrad: {alpha: 2.0}}", factory=dict)
    search_spaces: dict[str, Any] = option(help="search-space overrides: * or a method to {setting: {scale, low, "
                                                "high} | {choices} | null}", factory=dict)
    budget_trials: int = option(20, "the budget of every study in whole trials (when budget_steps is 0)")
    budget_steps: int = option(0, "the budget of every study in optimizer steps (0: budget_trials whole trials)")
    seed: int = option(0, "the search seed (every trial trains with it; the retrained runs use seed+1 ...)")
    retrain_seeds: int = option(3, "fresh seeds the chosen configuration of every study is retrained with")
    pruner: str = option("successive-halving", f"the pruner of the local studies: {', '.join(TUNE_PRUNERS)}")
    startup_trials: int = option(10, "random trials before TPE models the history")
    selection: str = option("auto", "how the local studies select: auto (k-fold over train + val where the validation "
                                    "split is too small to rank configurations), kfold or holdout (katib: holdout)")
    folds: int = option(5, "the folds of k-fold selection")
    tuner: str = option("optuna", f"where the studies run: {' or '.join(TUNERS)} (katib: cluster only)")
    parallel_trials: int = option(1, "katib: trials of one Experiment at once")

    def validate(self) -> None:
        super().validate()
        bench = self.build_benchmark()
        validate_sweep(self.methods, [self.seed], self.method_hparams, self.epochs, n_tasks=len(bench.task_names))
        if not isinstance(self.tasks, list) or set(self.tasks) - set(bench.task_names):
            raise InvalidParameterError(f"tasks {self.tasks!r} must list tasks of the benchmark: "
                                        f"{', '.join(bench.task_names)}")
        refuse_repeats("tasks", self.tasks)
        for key, least in (("budget_trials", 1), ("budget_steps", 0), ("retrain_seeds", 1), ("startup_trials", 0),
                           ("parallel_trials", 1), ("folds", 2)):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < least:
                raise InvalidParameterError(f"{key} must be an integer >= {least}, got {getattr(self, key)!r}")
        for key, value, valid in (("pruner", self.pruner, TUNE_PRUNERS), ("tuner", self.tuner, TUNERS),
                                  ("selection", self.selection, TUNE_SELECTIONS)):
            if value not in valid:
                raise InvalidParameterError(f"{key} {value!r} is not valid; use {' or '.join(valid)}")
        tuned = ["ls", *self.methods]
        stray = sorted(set(self.search_spaces) - {"*", *tuned})
        if stray:
            raise InvalidParameterError(f"search_spaces names {', '.join(stray)}, which is not tuned; give * or one of "
                                        f"{', '.join(dict.fromkeys(tuned))}")
        for method in dict.fromkeys(tuned):
            search_space(registry.get(method), {**self.search_spaces.get("*", {}),
                                                **self.search_spaces.get(method, {})})
            check_train_options(bench, method, self.epochs, self.train_options, self.method_hparams.get(method))

    def tune_arguments(self) -> dict[str, Any]:
        """The keyword arguments of :func:`mtlflow.jobs.tune.tune` besides the data (:func:`tune_arguments`)."""
        return tune_arguments(**{name: getattr(self, name) for name in TUNE_FIELDS})


#: the tuned sweep's settings that :func:`mtlflow.jobs.tune.tune` takes (besides the data)
TUNE_FIELDS = ("methods", "tasks", "method_hparams", "search_spaces", "budget_trials", "budget_steps", "seed",
               "retrain_seeds", "pruner", "startup_trials", "selection", "folds", "epochs", "train_options")


def tune_arguments(methods: Sequence[str], tasks: Sequence[str], method_hparams: Mapping[str, Any],
                   search_spaces: Mapping[str, Any], budget_trials: int, budget_steps: int, seed: int,
                   retrain_seeds: int, pruner: str, startup_trials: int, selection: str, folds: int, epochs: int,
                   train_options: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`TunedSweepConfig`'s settings as :func:`mtlflow.jobs.tune.tune`'s keyword arguments, ``epochs`` a
    training option of every trial and retrained run; plain values only (they travel as a KFP struct, which has no
    null): an empty ``tasks`` (all) and a zero ``budget_steps`` (whole trials) become ``None`` in
    :mod:`mtlflow.jobs.tune_steps`."""
    values = from_struct({"tasks": list(tasks), "hparams": dict(method_hparams), "spaces": dict(search_spaces),
                          "options": dict(train_options)})
    return {"methods_to_tune": list(methods), "tasks": values["tasks"], "budget_trials": int(budget_trials),
            "budget_steps": int(budget_steps), "seed": int(seed), "retrain_seeds": int(retrain_seeds),
            "search_spaces": values["spaces"], "hparams": values["hparams"],
            "train_options": {**values["options"], "epochs": int(epochs)}, "pruner": pruner,
            "startup_trials": int(startup_trials), "selection": selection, "folds": int(folds)}


#: each pipeline's parameters: its signature is exactly this model's fields, with the same defaults
PIPELINE_CONFIGS: dict[str, type[PipelineConfig]] = {
    "benchmark_sweep": SweepConfig, "retrain": RetrainConfig, "distributed_train": DistributedTrainConfig,
    "tuned_sweep": TunedSweepConfig}


def pipeline_config(pipeline: str, params: Mapping[str, Any]) -> PipelineConfig:
    """The validated parameters of ``pipeline`` (its defaults, overridden by ``params``, numbers of
    protobuf structs restored)."""
    model = PIPELINE_CONFIGS[pipeline]
    return model.from_mapping(from_struct(dict(params)), where=f"{pipeline} parameter(s)")
