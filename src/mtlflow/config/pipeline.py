"""The pipelines' parameters (:class:`SweepConfig`, :class:`RetrainConfig`, :class:`DistributedTrainConfig`:
each pipeline's signature is one of them, field for field) and the expansion of a sweep into runs (used
by the plan components, compile and submit).

Kept free of kfp so that invalid parameters are rejected before anything is compiled or submitted.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mtlflow.config.data import VersionedDataConfig
from mtlflow.config.model import option
from mtlflow.config.run import RunConfig
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import check_seed


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
    from mtlflow import methods as registry

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
    from mtlflow import methods as registry

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
    import hashlib

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
#: the sweep's default budget: ``epochs`` (below) is the most a run trains; at least 500 optimizer steps, at
#: least 8 steps an epoch (the batch at most a 8th of the training rows) and early stopping after 10 epochs
#: without a better validation score, the best validation epoch selected (docs/guides/training.md)
DEFAULT_BUDGET = {"min_steps": 500, "min_steps_per_epoch": 8, "patience": 10}
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
class SweepConfig(PipelineConfig):
    """The benchmark sweep: every method x seed and the single-task references (``benchmark_sweep``,
    ``params.yaml``)."""

    epochs: int = option(100, "the most training epochs of every run (the default budget stops earlier: "
                              "patience 10, at least 500 optimizer steps)")
    train_options: dict[str, Any] = option(help="the runs' RunConfig fields by name (batch_size, lr, device, "
                                                "min_steps, patience, ...; see `mtlflow config schema`); the "
                                                "default budget is min_steps 500, min_steps_per_epoch 8, patience "
                                                "10", factory=lambda: {"device": "auto", **DEFAULT_BUDGET})
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
                                           "split), besides being better with 95 % confidence")

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.min_improvement) and self.min_improvement >= 0):
            raise InvalidParameterError(f"min_improvement must be a number >= 0, got {self.min_improvement!r}")


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


#: each pipeline's parameters: its signature is exactly this model's fields, with the same defaults
PIPELINE_CONFIGS: dict[str, type[PipelineConfig]] = {
    "benchmark_sweep": SweepConfig, "retrain": RetrainConfig, "distributed_train": DistributedTrainConfig}


def pipeline_config(pipeline: str, params: Mapping[str, Any]) -> PipelineConfig:
    """The validated parameters of ``pipeline`` (its defaults, overridden by ``params``, numbers of
    protobuf structs restored)."""
    model = PIPELINE_CONFIGS[pipeline]
    return model.from_mapping(from_struct(dict(params)), where=f"{pipeline} parameter(s)")
