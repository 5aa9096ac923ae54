"""Model architectures that wrap any benchmark's model, selected with ``RunConfig.architecture``.

* ``hps`` (default) -- hard parameter sharing: the benchmark's own shared trunk and task heads.
* ``normal`` -- NORMAL (Ye, PhD thesis UTS 2024, ch. 5): a shared heavy-ball neural ODE between the
  benchmark's backbone and its heads, each task reading the ODE at its own learnable position
  (:mod:`mtlflow.models.normal`).

A plug-in architecture is a model factory ``factory(bench, task_names, **options) -> MultiTaskModel``
declared as an entry point of group ``mtlflow.models`` (its name is the architecture's name) or given as
an import path ``my_pkg.models:wide_mlp``. Its options are its keyword parameters after the first two,
each with a default (the default's type is the option's type): ``--architecture-option width=256``.

An architecture is independent of the optimisation method: every method trains every architecture
through the same trainer. ``model.pt`` records :func:`architecture_spec` so that evaluation rebuilds
the same model without data.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, Subset

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam, resolve_architecture_options
from mtlflow.core.registry import Registry, described
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.normal import OPTIONS, NormalModel, resolve_options

if TYPE_CHECKING:
    from mtlflow.benchmarks.base import Benchmark

#: name -> one-line description (``mtlflow architectures`` lists them with their options)
ARCHITECTURES: dict[str, str] = {
    "hps": "hard parameter sharing: the benchmark's own shared trunk + one head per task (default)",
    "normal": "NORMAL (Ye, PhD thesis UTS 2024, ch. 5, Alg. 4): backbone -> shared heavy-ball neural ODE "
              "(torchdiffeq) -> each task reads the ODE state at its learnable position p_i -> its head",
}

#: A plug-in architecture: ``factory(bench, task_names, **options)`` returns the benchmark's model
ModelFactory = Callable[..., MultiTaskModel]


def _model_factory(obj: Any, name: str) -> ModelFactory:
    """``obj`` if it can be called as ``obj(bench, task_names, **options)`` with a default for every option."""
    try:
        parameters = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # not callable, or a builtin without a signature
        parameters = []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # bench and task_names are two named positional parameters: os.path.join(a, *p) takes two arguments too,
    # but is no model factory
    if len(parameters) < 2 or any(p.kind not in positional for p in parameters[:2]) \
            or any(p.default is p.empty for p in parameters[2:] if p.kind not in variadic):
        raise InvalidParameterError(f"architecture {name} is {described(obj)}, not a model factory "
                                    "factory(bench, task_names, **options) -> MultiTaskModel with a default "
                                    "for every option")
    return obj


REGISTRY: Registry[str | ModelFactory] = Registry("architecture", "mtlflow.models", lambda: ARCHITECTURES,
                                                  _model_factory)


def plugin_factory(name: str) -> ModelFactory | None:
    """The factory of plug-in architecture ``name``; None for a built-in (an UnknownNameError if neither)."""
    found = REGISTRY.get(name)
    return None if name in ARCHITECTURES else found


def options_of(name: str) -> dict[str, HParam]:
    """The option specifications (:class:`~mtlflow.core.hparams.HParam`) of architecture ``name``."""
    factory = plugin_factory(name)
    if factory is not None:
        return {p.name: HParam(p.default, f"keyword argument of {factory.__module__}.{factory.__qualname__}")
                for p in list(inspect.signature(factory).parameters.values())[2:] if p.default is not p.empty}
    if name == "hps":
        return {}

    return dict(OPTIONS)


def resolve(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Validated options of architecture ``name`` with their defaults (bad input: one-line error)."""
    if plugin_factory(name) is not None:
        return resolve_architecture_options(name, options_of(name), options)
    if name == "hps":
        if options:
            raise InvalidParameterError(f"architecture 'hps' takes no options, got {', '.join(sorted(options))}; "
                                        "use --architecture normal for NORMAL's options")
        return {}

    return resolve_options(options)


def check_gradient_backend(name: str, options: dict[str, Any] | None, grad_backend: str) -> None:
    """Reject gradient backends that cannot differentiate the architecture (one-line error with the fix).

    NORMAL's ODE solver writes its solution in place, which the vmap-based backends cannot batch through
    the adjoint's ``autograd.Function``; TorchJD's autogram also needs a backward pass through every hooked
    module, which the ODE's last velocity (read detached, Eq. 5.11) never gets."""
    if name != "normal":
        return
    if grad_backend == "autogram":
        raise InvalidParameterError("grad_backend 'autogram' cannot run through NORMAL's ODE; use --grad-backend "
                                    "loop (default), batched, func or autojac")
    if grad_backend in ("batched", "func", "autojac") and resolve(name, options)["gradient"] == "adjoint":
        raise InvalidParameterError(f"grad_backend {grad_backend!r} (vmap) cannot run through NORMAL's adjoint "
                                    "solver; use --grad-backend loop (default) or --architecture-option gradient=direct")


def feature_shape(bench: Benchmark, model: MultiTaskModel, dataset: Dataset) -> list[int]:
    """Per-sample shape of the backbone's features, measured on two training samples in eval mode
    (no statistics updated; the loader draws its seed from a private generator, so the global RNG
    streams are untouched)."""
    probe = Subset(dataset, list(range(min(2, len(dataset)))))
    loader = bench.make_loader(probe, batch_size=len(probe), shuffle=False, generator=torch.Generator().manual_seed(0))
    inputs, _ = bench.unpack(next(iter(loader)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            features = model.features(inputs)
    finally:
        model.train(was_training)
    if not isinstance(features, torch.Tensor):
        raise InvalidParameterError(f"{bench.name}'s model exposes no single feature tensor; NORMAL needs one")
    skip = 2 if getattr(model, "input_index", None) is not None else 1  # multi-input features are [K, B, ...]
    return list(features.shape[skip:])


def build_model(bench: Benchmark, task_names: Sequence[str], name: str = "hps",
                options: dict[str, Any] | None = None, probe: Dataset | None = None) -> MultiTaskModel:
    """The benchmark's model for ``task_names`` in architecture ``name`` (``probe``: data to measure the
    backbone's feature shape, needed by ``normal``)."""
    resolved = resolve(name, options)
    if plugin_factory(name) is not None:
        return plugin_model(bench, task_names, name, resolved)
    base = bench.make_model(list(task_names))
    if name == "hps":
        return base
    if probe is None:
        raise InvalidParameterError("architecture 'normal' needs training data to size its ODE")

    return NormalModel(base, feature_shape(bench, base, probe), resolved)


def architecture_spec(model: MultiTaskModel) -> dict[str, Any]:
    """``{"name", "options", ...}`` of a built model, enough to rebuild it without data."""
    spec = getattr(model, "architecture_spec", None)
    return spec() if callable(spec) else {"name": "hps", "options": {}}


def rebuild_model(bench: Benchmark, task_names: Sequence[str], spec: dict[str, Any] | None) -> MultiTaskModel:
    """The model described by a recorded :func:`architecture_spec` (``None``: an HPS model from before
    architectures were recorded)."""
    if spec and plugin_factory(spec["name"]) is not None:
        return plugin_model(bench, task_names, spec["name"], spec["options"])
    base = bench.make_model(list(task_names))
    if not spec or spec.get("name", "hps") == "hps":
        return base

    return NormalModel(base, spec["feature_shape"], spec["options"])


def plugin_model(bench: Benchmark, task_names: Sequence[str], name: str, options: dict[str, Any]) -> MultiTaskModel:
    """The model of plug-in architecture ``name``, checked to have one head per task and made to record
    its name and options (so that ``model.pt`` rebuilds it)."""
    model = REGISTRY.get(name)(bench, list(task_names), **options)
    if not isinstance(model, MultiTaskModel):
        raise InvalidParameterError(f"architecture {name} returned {described(model)}, not a MultiTaskModel")
    if list(model.task_names) != list(task_names):
        raise InvalidParameterError(f"architecture {name} built heads for tasks {', '.join(model.task_names)}, "
                                    f"not for {', '.join(task_names)}; build one head per task, in that order")
    model.architecture_spec = functools.partial(dict, name=name, options=dict(options))  # what model.pt records
    return model


def describe() -> list[dict[str, Any]]:
    """Every architecture with its options (default, help) and the distribution it comes from, for
    ``mtlflow architectures``."""
    return [{"name": name, "description": ARCHITECTURES.get(name) or first_line(plugin_factory(name)),
             "from": REGISTRY.origin(name),
             "options": {k: {"default": h.default, "help": h.help} for k, h in options_of(name).items()}}
            for name in REGISTRY.names()]


def first_line(obj: Any) -> str:
    """The first line of ``obj``'s docstring ("" without one)."""
    return (inspect.getdoc(obj) or "").partition("\n")[0]
