"""The configuration of one training run: every option's one name, type, default, help and validation.

:class:`RunConfig` is the single model behind every entry point: the ``mtlflow train`` flags are generated
from its fields (``--batch-size`` is ``batch_size``), the ``train_options`` of ``params.yaml`` and of the
pipelines are mappings of its field names (:meth:`RunConfig.from_mapping`), the Python API takes
it (or ``jobs.train(**fields)``), and ``run.json`` stores it whole under ``config``. ``mtlflow config
schema`` prints its JSON schema (:meth:`~mtlflow.config.model.ConfigModel.json_schema`).

Method hyper-parameters (``hparams``) are validated by the method itself (:class:`mtlflow.core.hparams.HParam`);
on the command line they are ``--hp [METHOD.]NAME=VALUE`` everywhere (:func:`parse_hparams`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mtlflow import methods as method_registry
from mtlflow import teleport
from mtlflow.config.model import ConfigModel, option
from mtlflow.core.budget import layered_budget
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import check_seed
from mtlflow.grad_engine import BACKENDS, GRAD_WRT
from mtlflow.methods.base import needs_full_jacobian
from mtlflow.metrics.selection import BEST_VAL, parse_selection
from mtlflow.models import architectures

OPTIMIZERS = ("adam", "adamw", "sgd")
AMP_MODES = ("none", "bf16")
SCHEDULERS = ("none", "plateau", "step")
#: what a ``plateau`` schedule may monitor (see :mod:`mtlflow.engine.schedulers`)
MONITORS = ("val_delta_m", "val_loss")
#: the largest batch size: a batch is indexed and sliced with machine integers (itertools.islice takes at most
#: sys.maxsize), and no device holds 2**31 rows of any benchmark
MAX_BATCH_SIZE = 2**31
_SCHEDULER_OPTIONS = {"none": set(), "plateau": {"factor", "patience", "min_lr", "monitor", "threshold"},
                      "step": {"step_size", "gamma"}}
_AUTOGRAM_NEEDS_GRAMIAN = ("grad_backend 'autogram' computes only the Gramian but method {method!r} needs the full "
                           "Jacobian; use one of auto, loop, batched, func, autojac")


def validate_scheduler(name: str, options: Mapping[str, Any]) -> None:
    """Reject unknown schedules and options before anything is built."""
    if name not in SCHEDULERS:
        raise InvalidParameterError(f"unknown scheduler {name!r}; valid: {', '.join(SCHEDULERS)}")
    allowed = _SCHEDULER_OPTIONS[name]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidParameterError(f"unknown option(s) {', '.join(unknown)} for scheduler {name!r}; valid: "
                                    f"{', '.join(sorted(allowed)) or 'none'}")
    if name == "plateau" and options.get("monitor", "val_loss") not in MONITORS:
        raise InvalidParameterError(f"scheduler monitor must be one of {', '.join(MONITORS)}, "
                                    f"got {options.get('monitor')!r}")
    if name == "step" and not (isinstance(options.get("step_size", 1), int) and options.get("step_size", 1) >= 1):
        raise InvalidParameterError(f"step scheduler step_size must be a positive integer, got {options['step_size']!r}")


@dataclass
class RunConfig(ConfigModel):
    """Everything that determines a training run (stored whole in ``run.json``).

    Every instance is valid: construction (also through :meth:`from_mapping` or ``dataclasses.replace``)
    runs :meth:`validate`, the one place each option is checked."""

    subject = "training options"

    method: str = option("ls", "the MTL method (see `mtlflow methods`)")
    hparams: dict[str, Any] = option(help="the method's hyper-parameters (see `mtlflow methods`)", factory=dict,
                                     flag="--hp")
    epochs: int = option(10, "training epochs, the most the run trains when given (a default min_steps is then "
                             "dropped: mtlflow.core.budget); cut short by patience")
    min_steps: int | None = option(None, "minimum optimizer steps of the run: the epochs are raised to reach them "
                                         "(recorded in run.json under budget); a default one yields to a given "
                                         "epochs")
    min_steps_per_epoch: int | None = option(None, "lower the batch size so that an epoch has at least this many "
                                                   "optimizer steps (batch <= training rows / N; recorded)")
    patience: int | None = option(None, "early stopping: stop after this many epochs without a better validation "
                                        "score (never before min_steps); selects best-val by default")
    batch_size: int = option(256, "training batch size (per process under torchrun)")
    lr: float = option(1e-3, "learning rate of the model's parameters")
    optimizer: str = option("adam", f"optimizer: {', '.join(OPTIMIZERS)}")
    weight_decay: float = option(0.0, "weight decay of the model's parameters")
    momentum: float = option(0.9, "SGD momentum (Adam/AdamW use PyTorch's default betas and ignore it)")
    method_lr: float = option(0.025, "learning rate of the method's own parameters (UW, IMTL, GradNorm, ...)")
    clip_grad_norm: float | None = option(None, "clip the global gradient norm after the backward pass")
    rescale: bool = option(True, "scale convex-combination updates x K, onto the scale of the summed losses "
                                 "(Method.natural_scale)")
    seed: int = option(0, "seed of every random generator of the run (0 <= seed < 2**32)")
    tasks: list[str] | None = option(None, "subset of the benchmark's tasks, comma-separated on the command line "
                                           "(one task = a single-task reference run)")
    select: str | None = option(None, "final-metric rule: last, last-k:K (mean of the last K epochs) or best-val "
                                      "(the epoch of the best validation score; its weights are the model); "
                                      "default: best-val with --patience, else last")
    eval_batch_size: int = option(512, "batch size of the evaluation passes")
    max_steps_per_epoch: int | None = option(None, "cap on the optimizer steps of an epoch")
    device: str = option("cpu", "cpu, cuda[:N] or auto (the GPU when one is visible)")
    threads: int | None = option(None, "torch's CPU threads (torch.set_num_threads) for the run; default: torch's "
                                       "own (the physical cores); the count used is recorded in run.json")
    grad_backend: str = option("auto", f"per-task gradient backend: {', '.join(BACKENDS)} (auto = loop; autogram "
                                       "computes only the Gramian)")
    grad_wrt: str = option("parameters", "per-task gradients w.r.t. the shared 'parameters' or the shared "
                                         "'representation' (MGDA-UB's bound)")
    num_workers: int = option(0, "DataLoader worker processes")
    pin_memory: bool | None = option(None, "pinned host memory for the DataLoader (default: when training on a GPU)")
    amp: str = option("none", "bf16: forward pass and losses under torch.autocast in bfloat16")
    deterministic: bool = option(True, "deterministic algorithms (torch.use_deterministic_algorithms, no cudnn "
                                       "benchmarking)")
    scheduler: str = option("none", f"per-epoch learning-rate schedule: {', '.join(SCHEDULERS)}")
    scheduler_options: dict[str, Any] = option(help="options of the schedule (plateau: factor, patience, min_lr, "
                                                    "monitor, threshold; step: step_size, gamma)", factory=dict)
    teleport: str | None = option(None, "teleportation wrapper around the method: cost (COST, symmetry "
                                        "teleportation of the shared trunk)")
    teleport_options: dict[str, Any] = option(help="COST options, e.g. trigger=weak, max_per_epoch=2, adapter=loha",
                                              factory=dict)
    architecture: str = option("hps", "model architecture around the benchmark's model: hps (its own trunk and "
                                      "heads) or normal (NORMAL's neural ODE with task positions)")
    architecture_options: dict[str, Any] = option(help="architecture options, e.g. step_size=0.05", factory=dict)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def for_benchmark(cls, bench_defaults: Mapping[str, Any], **overrides: Any) -> RunConfig:
        """A validated config from a benchmark's recipe (``Benchmark.train_defaults``, with a method's own
        recipe on it under ``per_method``), overridden by the non-None ``overrides``."""
        names = set(cls.field_names())
        unknown = sorted(set(bench_defaults) - names - {"per_method"})
        if unknown:  # a misspelt option in a spec's train: section would otherwise be dropped without a word
            raise InvalidParameterError(f"training default(s) {', '.join(unknown)} (the spec's train: section or the "
                                        "benchmark's recipe) are not `mtlflow train` options; fix the names (see "
                                        "`mtlflow config schema`)")
        values = {k: v for k, v in bench_defaults.items() if k in names}
        # a method's own recipe on this benchmark (e.g. LDC-MTL's Table 5 step sizes), still below the user's
        values.update(bench_defaults.get("per_method", {}).get(overrides.get("method"), {}))
        given = {k: v for k, v in overrides.items() if v is not None or k not in names}
        return cls.from_mapping(layered_budget(values, given)[0])

    @property
    def selection(self) -> str:
        """The selection rule in force: ``select``, or by default best-val when early stopping is on, else last."""
        if self.select is not None:
            return self.select
        return BEST_VAL if self.patience is not None else "last"

    def resolved_device(self) -> torch.device:
        """``auto`` means the GPU when one is visible, else the CPU."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def fingerprint(self) -> str:
        """Hash of everything but ``epochs`` and ``device``: a resumed run must match it."""
        data = dataclasses.asdict(self)
        data.pop("epochs")
        data.pop("device")
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    # -- validation -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Every option's check, in one place; raises :class:`InvalidParameterError` naming the option."""
        def bad(msg: str) -> None:
            raise InvalidParameterError(msg)

        self.check_types()
        check_seed(self.seed)
        if self.epochs < 1:
            bad(f"epochs must be a positive integer, got {self.epochs!r}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            bad(f"batch_size must be an integer from 1 to {MAX_BATCH_SIZE} (2**31), got {self.batch_size!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            bad(f"lr must be a positive finite number, got {self.lr!r}")
        if self.optimizer not in OPTIMIZERS:
            bad(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.weight_decay < 0 or not math.isfinite(self.weight_decay):
            bad(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0 <= self.momentum < 1:
            bad(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not self.method_lr > 0:
            bad(f"method_lr must be > 0, got {self.method_lr!r}")
        if self.clip_grad_norm is not None and not (self.clip_grad_norm > 0):
            bad(f"clip_grad_norm must be > 0 when set, got {self.clip_grad_norm!r}")
        if not 1 <= self.eval_batch_size <= MAX_BATCH_SIZE:
            bad(f"eval_batch_size must be an integer from 1 to {MAX_BATCH_SIZE} (2**31), got "
                f"{self.eval_batch_size!r}")
        for name in ("min_steps", "min_steps_per_epoch", "patience", "threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                bad(f"{name} must be a positive integer when set, got {getattr(self, name)!r}")
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch < 1:
            bad(f"max_steps_per_epoch must be >= 1 when set, got {self.max_steps_per_epoch!r}")
        if self.grad_backend not in BACKENDS:
            bad(f"unknown gradient backend {self.grad_backend!r}; valid gradient backends: {', '.join(BACKENDS)}")
        if self.num_workers < 0:
            bad(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.amp not in AMP_MODES:
            bad(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        validate_scheduler(self.scheduler, self.scheduler_options)
        teleport.validate(self.teleport, self.teleport_options)
        architectures.resolve(self.architecture, self.architecture_options)
        architectures.check_gradient_backend(self.architecture, self.architecture_options, self.grad_backend)
        if self.grad_wrt not in GRAD_WRT:
            bad(f"grad_wrt must be one of {', '.join(GRAD_WRT)}, got {self.grad_wrt!r}")
        method = method_registry.get(self.method)
        if self.teleport and method.custom_step:
            bad(f"--teleport {self.teleport} wraps methods that use the trainer's step; {self.method!r} owns its "
                "training step (custom_step); drop --teleport")
        if self.grad_backend == "autogram" and needs_full_jacobian(method, self.grad_wrt):
            bad(autogram_needs_gramian(self.method))
        if self.grad_wrt == "representation" and needs_full_jacobian(method):
            bad(f"grad_wrt 'representation' applies to Gramian-weighting methods (their weights carry over to the "
                f"parameters); {self.method!r} combines full gradients; use grad_wrt=parameters")
        kind, window = parse_selection(self.selection)
        if window > self.epochs:
            bad(f"selection rule {self.selection!r} averages {window} epochs but the run has only {self.epochs}")
        if (kind == BEST_VAL or self.patience is not None) and hasattr(method, "front_due"):
            bad(f"{self.method!r} selects a Pareto front from its last epochs; early stopping and select "
                f"{BEST_VAL} do not apply to it: drop patience and use select last or last-k:K")
        try:
            device = self.resolved_device()
        except RuntimeError:
            bad(f"device {self.device!r} is not valid; use auto, cpu or cuda[:N]")
        if device.type == "cuda" and not torch.cuda.is_available():
            bad(f"device {self.device!r} requested but no CUDA GPU is visible; use --device auto or cpu")


def autogram_needs_gramian(method: str) -> str:
    return _AUTOGRAM_NEEDS_GRAMIAN.format(method=method)


def parse_hparams(assignments: Mapping[str, Any], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--hp [METHOD.]NAME=VALUE``, the one grammar of every command: ``{"famo.gamma": 0, "alpha": 1}`` ->
    ``{"famo": {"gamma": 0}, ...}``. A name without ``METHOD.`` applies to every method in ``methods``;
    a ``METHOD.`` prefix must name one of them."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in assignments.items():
        method, dot, name = key.rpartition(".")
        if dot and not (method and name):
            raise InvalidParameterError(f"--hp {key}=... must look like [METHOD.]NAME=VALUE, e.g. famo.gamma=0")
        if dot and method not in methods:
            raise InvalidParameterError(f"--hp {key}=... names method {method!r}, which this command does not run "
                                        f"(it runs: {', '.join(methods)})")
        for target in [method] if dot else methods:
            out.setdefault(target, {})[name] = value
    return out


def cli_flag(name: str) -> str:
    """The ``mtlflow train`` flag of a :class:`RunConfig` field: ``--batch-size`` for ``batch_size``; a
    mapping field is the repeatable ``--<name>-option KEY=VALUE`` (``--hp`` for ``hparams``)."""
    f = {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    if f.metadata["flag"]:
        return f.metadata["flag"]
    flag = "--" + name.replace("_", "-")
    return flag.removesuffix("s") if typing.get_origin(typing.get_type_hints(RunConfig)[name]) is dict else flag


def train_arguments(options: Mapping[str, Any]) -> list[str]:
    """The ``mtlflow train`` arguments that set these :class:`RunConfig` fields (what the command line
    parses back into the same values); ``None`` values are left out."""
    unknown = sorted(set(options) - set(RunConfig.field_names()))
    if unknown:
        raise InvalidParameterError(f"unknown training option(s) {', '.join(unknown)}; valid: "
                                    f"{', '.join(RunConfig.field_names())}")
    arguments: list[str] = []
    for name, value in sorted(options.items()):
        flag = cli_flag(name)
        if value is None:
            continue
        if isinstance(value, dict):
            for key, item in sorted(value.items()):
                arguments += [flag, f"{key}={json.dumps(item) if isinstance(item, (list, dict)) else item}"]
        elif isinstance(value, bool):
            arguments.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, (list, tuple)):
            arguments += [flag, ",".join(map(str, value))]
        else:
            arguments += [flag, str(value)]
    return arguments
