"""PEFT adapters on the shared trunk: inject, train, merge and unload (COST paper Fig. 4, App. B.2).

The teleport works on a copy of the trainer's model: Hugging Face PEFT's LoRA (or LoHa, or OFT) is
injected into every ``Conv2d``/``Linear`` layer whose weight is a shared parameter (shared by every
task, ``MultiTaskModel.shared_parameters``) -- never the heads nor task-specific trunk modules such as
SegNet-MTAN's attention masks ("LoRA is only applied to the shared backbone", Fig. 4) -- with rank 5 and PEFT's
other defaults (App. B.2). After training, ``merge_and_unload`` folds the adapters into the weights
(no adapter module or parameter remains) and :func:`copy_shared_into` writes the merged shared
parameters into the trainer's own parameter tensors in place, so the optimizer's state (Adam's
moments) stays attached to the same tensors.

OFT is refused on ``Conv2d`` layers: in peft 0.21 its Conv2d path (unfold -> fold) changes the output
already at initialisation and its merge does not reproduce the adapter model
(``environment-and-dependencies.md`` §4).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mtlflow.core.errors import InvalidParameterError


@dataclass
class AdaptedModel:
    """A copy of the model with adapters in its trunk layers."""

    model: nn.Module                 # the copy, adapters injected (frozen base weights)
    tuner: object                    # the PEFT tuner (LoraModel / LoHaModel / OFTModel) that can merge
    adapter_parameters: list[Tensor]
    #: name in ``model`` of each shared parameter, in the order of the original ``shared`` list
    shared_names: list[str]
    targets: list[str]


def adapter_targets(model: nn.Module, shared: Sequence[Tensor]) -> list[str]:
    """Names of the ``Conv2d``/``Linear`` modules of ``model`` whose weight is a shared parameter."""
    shared_ids = {id(p) for p in shared}
    return [name for name, module in model.named_modules()
            if isinstance(module, (nn.Conv2d, nn.Linear)) and id(module.weight) in shared_ids]


def check_wrappable(model: nn.Module, n_tasks: int, adapter: str) -> None:
    """COST's refusals of a model before any work: fewer than 2 tasks, or no layer ``adapter`` can go on.

    One place for the trainer's check (:meth:`CostTeleport.check`) and the job's dry check
    (:func:`mtlflow.teleport.check_benchmark`)."""
    if n_tasks < 2:
        raise InvalidParameterError("--teleport cost needs at least 2 tasks (gradient conflicts between tasks "
                                    "trigger it); drop --tasks or --teleport")
    check_targets(model, model.shared_parameters(), adapter)


def check_targets(model: nn.Module, shared: Sequence[Tensor], adapter: str) -> list[str]:
    """The adapter targets, or a one-line error when there are none or the adapter cannot handle them."""
    targets = adapter_targets(model, shared)
    if not targets:
        raise InvalidParameterError("COST needs Conv2d or Linear layers in the shared trunk to put adapters on; "
                                    "this model's trunk has none (use a benchmark with a convolutional or MLP trunk)")
    if adapter == "oft":
        convs = [n for n in targets if isinstance(model.get_submodule(n), nn.Conv2d)]
        if convs:
            raise InvalidParameterError(
                f"COST adapter 'oft' is wrong on Conv2d layers in peft 0.21 (its output differs at initialisation; "
                f"trunk layers {', '.join(convs[:3])}{'...' if len(convs) > 3 else ''}); use adapter=lora or loha")
    return targets


def _peft_tuner(adapter: str, rank: int, targets: Sequence[str]):
    """(tuner class, config) of PEFT for ``adapter``; every other setting is PEFT's default (App. B.2)."""
    import peft
    from peft.tuners.loha import LoHaModel
    from peft.tuners.lora import LoraModel
    from peft.tuners.oft import OFTModel

    pattern = "^(" + "|".join(re.escape(t) for t in targets) + ")$"  # full names: no suffix matching
    if adapter == "lora":
        return LoraModel, peft.LoraConfig(r=rank, target_modules=pattern)
    if adapter == "loha":
        return LoHaModel, peft.LoHaConfig(r=rank, target_modules=pattern)
    if adapter == "oft":
        return OFTModel, peft.OFTConfig(r=rank, oft_block_size=0, target_modules=pattern)
    raise InvalidParameterError(f"unknown COST adapter {adapter!r}; valid: lora, loha, oft")


def inject(model: nn.Module, shared: Sequence[Tensor], adapter: str = "lora", rank: int = 5) -> AdaptedModel:
    """A deep copy of ``model`` with ``adapter`` in its trunk layers; only the adapter is trainable."""
    targets = check_targets(model, shared, adapter)
    index = {id(p): i for i, p in enumerate(shared)}
    original = dict(model.named_parameters())
    shared_names_before = [""] * len(shared)
    for name, p in original.items():
        if id(p) in index:
            shared_names_before[index[id(p)]] = name
    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.grad = None
        p.requires_grad_(False)
    clone_params = dict(clone.named_parameters())
    shared_in_clone = [clone_params[n] for n in shared_names_before]
    tuner_cls, config = _peft_tuner(adapter, rank, targets)
    tuner = tuner_cls(clone, config, "default")
    ids_after = {id(p): n for n, p in clone.named_parameters()}
    shared_names = [ids_after[id(p)] for p in shared_in_clone]  # e.g. trunk.fc.1.base_layer.weight
    adapter_parameters = [p for p in clone.parameters() if p.requires_grad]
    return AdaptedModel(clone, tuner, adapter_parameters, shared_names, targets)


def merge_and_unload(adapted: AdaptedModel) -> nn.Module:
    """Fold the adapters into the copy's weights and remove every adapter module (PEFT's merge)."""
    merged = adapted.tuner.merge_and_unload()
    leftovers = [n for n, _ in merged.named_modules() if "lora_" in n or "hada_" in n or "oft_" in n]
    if leftovers:  # pragma: no cover - PEFT's contract; checked because the trainer must get plain layers
        raise RuntimeError(f"adapter modules remain after merge_and_unload: {leftovers[:3]}")
    return merged


def copy_shared_into(merged: nn.Module, model: nn.Module, shared: Sequence[Tensor]) -> None:
    """Write ``merged``'s shared parameters into ``model``'s (same names), in place: the tensors -- and
    therefore the optimizer state keyed by them -- stay the same objects."""
    merged_params = dict(merged.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in shared:
            p.copy_(merged_params[names[id(p)]])
