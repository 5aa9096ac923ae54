"""Model architectures that wrap any benchmark's model, selected with ``RunConfig.architecture``.

* ``hps`` (default) -- hard parameter sharing: the benchmark's own shared trunk and task heads.
* ``normal`` -- NORMAL (Ye, PhD thesis UTS 2024, ch. 5): a shared heavy-ball neural ODE between the
  benchmark's backbone and its heads, each task reading the ODE at its own learnable position
  (:mod:`mtlflow.models.normal`).

An architecture is independent of the optimisation method: every method trains every architecture
through the same trainer. ``model.pt`` records :func:`architecture_spec` so that evaluation rebuilds
the same model without data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch.utils.data import Dataset, Subset

from mtlflow.core.errors import InvalidParameterError, UnknownNameError
from mtlflow.models.base import MultiTaskModel

if TYPE_CHECKING:
    from mtlflow.benchmarks.base import Benchmark

#: name -> one-line description (``mtlflow architectures`` lists them with their options)
ARCHITECTURES: dict[str, str] = {
    "hps": "hard parameter sharing: the benchmark's own shared trunk + one head per task (default)",
    "normal": "NORMAL (Ye, PhD thesis UTS 2024, ch. 5, Alg. 4): backbone -> shared heavy-ball neural ODE "
              "(torchdiffeq) -> each task reads the ODE state at its learnable position p_i -> its head",
}


def options_of(name: str) -> dict[str, Any]:
    """The option specifications (:class:`~mtlflow.core.hparams.HParam`) of architecture ``name``."""
    check_name(name)
    if name == "hps":
        return {}
    from mtlflow.models.normal import OPTIONS

    return dict(OPTIONS)


def check_name(name: str) -> None:
    if name not in ARCHITECTURES:
        raise UnknownNameError("architecture", name, list(ARCHITECTURES))


def resolve(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Validated options of architecture ``name`` with their defaults (bad input: one-line error)."""
    check_name(name)
    if name == "hps":
        if options:
            raise InvalidParameterError(f"architecture 'hps' takes no options, got {', '.join(sorted(options))}; "
                                        "use --architecture normal for NORMAL's options")
        return {}
    from mtlflow.models.normal import resolve_options

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
    base = bench.make_model(list(task_names))
    if name == "hps":
        return base
    if probe is None:
        raise InvalidParameterError("architecture 'normal' needs training data to size its ODE")
    from mtlflow.models.normal import NormalModel

    return NormalModel(base, feature_shape(bench, base, probe), resolved)


def architecture_spec(model: MultiTaskModel) -> dict[str, Any]:
    """``{"name", "options", ...}`` of a built model, enough to rebuild it without data."""
    spec = getattr(model, "architecture_spec", None)
    return spec() if callable(spec) else {"name": "hps", "options": {}}


def rebuild_model(bench: Benchmark, task_names: Sequence[str], spec: dict[str, Any] | None) -> MultiTaskModel:
    """The model described by a recorded :func:`architecture_spec` (``None``: an HPS model from before
    architectures were recorded)."""
    base = bench.make_model(list(task_names))
    if not spec or spec.get("name", "hps") == "hps":
        return base
    check_name(spec["name"])
    from mtlflow.models.normal import NormalModel

    return NormalModel(base, spec["feature_shape"], spec["options"])


def describe() -> list[dict[str, Any]]:
    """Every architecture with its options (default, help), for ``mtlflow architectures``."""
    return [{"name": name, "description": text,
             "options": {k: {"default": h.default, "help": h.help} for k, h in options_of(name).items()}}
            for name, text in ARCHITECTURES.items()]
