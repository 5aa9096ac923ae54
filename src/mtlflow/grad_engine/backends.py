"""Backends that compute per-task gradient information for one training step.

Jacobian backends return the per-task gradients ``J [K, P]`` w.r.t. the shared parameters and, when
asked, give every head its plain gradient (head i depends on loss i only):

* ``loop``    -- K calls of ``torch.autograd.grad`` with ``retain_graph``; each call also returns the
  gradient of that task's head. The fastest on the CPU (environment-and-dependencies.md §5).
* ``batched`` -- one ``torch.autograd.grad`` call over the stacked losses with ``grad_outputs = I_K``
  and ``is_grads_batched=True`` (vmap over the backward pass); heads in one extra head-only backward.
* ``func``    -- ``torch.func.jacrev`` over ``torch.func.functional_call`` of the whole model: the
  forward pass is re-run functionally inside the transform (the trainer does not run its own), the
  heads' Jacobian rows are summed into their plain gradients, and buffers (BatchNorm running
  statistics) are passed as explicit, non-differentiated inputs so their in-place update is allowed.
* ``autojac`` -- TorchJD's ``autojac.mtl_backward(losses, features=z)``: the heads get plain
  gradients, the shared parameters a ``.jac`` field that is read and removed.

The Gramian-only backend ``autogram`` (:class:`AutogramGramian`) computes ``G = J Jᵀ`` layer by layer
with TorchJD's ``autogram.Engine`` without ever materialising ``J``; it applies to methods whose
weights depend on the Gramian only (:class:`~mtlflow.methods.base.GramianWeighting`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.func import jacrev

from mtlflow.grad_engine._flat import accumulate_grads, flatten_rows


@dataclass(frozen=True)
class ForwardPass:
    """One forward pass over a batch: the K task losses as separate graph nodes and the shared features
    ``z`` (the input of every head), or ``None`` when the pass did not expose them. Frozen: a pass whose
    losses change (DDP's global-batch values) is a new pass, so ``stacked`` never goes stale."""

    losses: list[Tensor]
    features: Tensor | None = None

    @cached_property
    def stacked(self) -> Tensor:
        """The K losses as one ``[K]`` tensor, stacked once: the finite check, the hooks and the update of a
        step share one graph node (a second ``torch.stack`` per step is a measurable cost of a small model)."""
        return torch.stack(self.losses)


@dataclass
class StepProblem:
    """What the engine differentiates for one batch; built by the trainer.

    ``forward()`` runs the model and the task losses with autograd recording. ``functional_losses``
    evaluates the stacked losses with some parameters and buffers replaced (``torch.func``).
    """

    model: nn.Module
    shared: list[Tensor]
    task_params: list[list[Tensor]]
    forward: Callable[[], ForwardPass]
    functional_losses: Callable[[dict[str, Tensor]], Tensor] | None = None


#: The shared parameters, differentiated per task.
Params = Sequence[Tensor]
#: The heads' parameters, one list per task (head i depends on loss i only), or None when the
#: heads' gradients are not wanted.
HeadParams = Sequence[Sequence[Tensor]] | None


def _head_params(task_params: HeadParams) -> list[Tensor]:
    return [p for params in task_params or () for p in params]


class JacobianBackend:
    """Per-task gradients w.r.t. the shared parameters; subclasses implement :meth:`differentiate`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    #: True when the backend runs the forward pass itself (use :meth:`jacobian`, not :meth:`differentiate`)
    runs_forward: ClassVar[bool] = False

    def jacobian(self, problem: StepProblem, heads: bool = True,
                 retain_graph: bool = False) -> tuple[ForwardPass, Tensor]:
        """Run the forward pass and return it with ``J [K, P]``; with ``heads`` every head's ``.grad``
        receives its plain gradient. The graph is freed unless ``retain_graph``."""
        forward = problem.forward()
        grads = self.differentiate(forward, problem.shared, problem.task_params if heads else None, retain_graph)
        return forward, grads

    def differentiate(self, forward: ForwardPass, shared: Params, heads: HeadParams, retain_graph: bool) -> Tensor:
        raise NotImplementedError


class LoopBackend(JacobianBackend):
    name = "loop"
    summary = "K autograd.grad calls (fastest on the CPU); heads in the same calls"

    def differentiate(self, forward: ForwardPass, shared: Params, heads: HeadParams, retain_graph: bool) -> Tensor:
        k = len(forward.losses)
        if not shared:
            return torch.zeros(k, 0)
        # each row is copied once into a preallocated [K, P] matrix (no per-row cat, then stack)
        jac = torch.empty(k, sum(p.numel() for p in shared), dtype=shared[0].dtype, device=shared[0].device)
        for i, loss in enumerate(forward.losses):
            own = list(heads[i]) if heads is not None else []
            grads = torch.autograd.grad(loss, [*shared, *own], retain_graph=retain_graph or i < k - 1,
                                        allow_unused=True)
            offset = 0
            for p, g in zip(shared, grads[:len(shared)], strict=True):
                block = jac[i, offset:offset + p.numel()]
                if g is None:
                    block.zero_()
                else:
                    block.copy_(g.reshape(-1))
                offset += p.numel()
            accumulate_grads(own, grads[len(shared):])
        return jac


class BatchedBackend(JacobianBackend):
    name = "batched"
    summary = "one autograd.grad call with is_grads_batched (vmap over the backward)"

    def differentiate(self, forward: ForwardPass, shared: Params, heads: HeadParams, retain_graph: bool) -> Tensor:
        stacked = forward.stacked
        k = stacked.shape[0]
        head_list = _head_params(heads)
        if head_list:  # head i only sees loss i, so the gradient of Σ L_i is each head's plain gradient
            plain = torch.autograd.grad(stacked.sum(), head_list, retain_graph=True, allow_unused=True)
            accumulate_grads(head_list, plain)
        eye = torch.eye(k, dtype=stacked.dtype, device=stacked.device)
        rows = torch.autograd.grad(stacked, list(shared), grad_outputs=eye, is_grads_batched=True,
                                   retain_graph=retain_graph, allow_unused=True)
        return flatten_rows(rows, shared, k)


class FuncBackend(JacobianBackend):
    name = "func"
    summary = "torch.func.jacrev over functional_call (re-runs the forward inside the transform)"
    runs_forward = True

    def jacobian(self, problem: StepProblem, heads: bool = True,
                 retain_graph: bool = False) -> tuple[ForwardPass, Tensor]:
        if problem.functional_losses is None:
            raise ValueError("the func backend needs StepProblem.functional_losses")
        if retain_graph:
            raise ValueError("the func backend builds no autograd graph to retain; use loop or batched")

        names = {id(p): n for n, p in problem.model.named_parameters()}
        shared = list(problem.shared)
        head_params = _head_params(problem.task_params) if heads else []
        shared_names = [names[id(p)] for p in shared]
        head_names = [names[id(p)] for p in head_params]
        named_buffers = list(problem.model.named_buffers())
        buffer_names = [n for n, _ in named_buffers]
        buffers = tuple(b for _, b in named_buffers)

        def losses_at(shared_values: tuple[Tensor, ...], head_values: tuple[Tensor, ...],
                      buffer_values: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
            overrides = {**dict(zip(shared_names, shared_values, strict=True)),
                         **dict(zip(head_names, head_values, strict=True)),
                         **dict(zip(buffer_names, buffer_values, strict=True))}
            losses = problem.functional_losses(overrides)
            return losses, losses

        (shared_rows, head_rows), losses = jacrev(losses_at, argnums=(0, 1), has_aux=True)(
            tuple(shared), tuple(head_params), tuple(buffers))
        k = losses.shape[0]
        if head_params:
            accumulate_grads(head_params, [rows.detach().sum(0) for rows in head_rows])
        detached = losses.detach()
        return ForwardPass([detached[i] for i in range(k)]), flatten_rows(shared_rows, shared, k).detach()


class AutojacBackend(JacobianBackend):
    name = "autojac"
    summary = "TorchJD autojac.mtl_backward (fills .jac; heads get plain gradients)"

    def differentiate(self, forward: ForwardPass, shared: Params, heads: HeadParams, retain_graph: bool) -> Tensor:
        from torchjd.autojac import mtl_backward

        if forward.features is None:
            raise ValueError("the autojac backend needs the shared features of the forward pass")
        k = len(forward.losses)
        if heads is None:
            raise ValueError("the autojac backend always gives the heads their gradients; use loop instead")
        # mtl_backward needs separate loss tensors, not views of one stack (TorchJD API trap #1)
        mtl_backward(list(forward.losses), features=forward.features, tasks_params=[list(t) for t in heads],
                     shared_params=list(shared), retain_graph=retain_graph)
        rows = []
        for p in shared:
            rows.append(getattr(p, "jac", None))
            if hasattr(p, "jac"):
                del p.jac
        return flatten_rows(rows, shared, k)


JACOBIAN_BACKENDS: dict[str, type[JacobianBackend]] = {
    cls.name: cls for cls in (LoopBackend, BatchedBackend, FuncBackend, AutojacBackend)}


class AutogramGramian:
    """``G = J Jᵀ`` w.r.t. the parameters of a model's trunk with TorchJD's autogram, without ``J``.

    TorchJD's engine hooks the modules it is given, and a hooked module must not run a forward pass
    with gradients outside ``compute_gramian`` (TorchJD API trap #2). The engine therefore hooks a
    *clone* of the trunk that shares every parameter and buffer with it; :meth:`hooked` swaps the clone
    into ``model.trunk`` for the forward passes whose Gramian is computed, and every other pass
    (evaluation, amortised steps, callbacks) goes through the unhooked trunk. ``batch_dim=None``
    because the task losses are batch means (per-sample losses would give a [K·B, K·B] Gramian); in
    that mode BatchNorm is supported.
    """

    def __init__(self, trunk: nn.Module):
        self.trunk = trunk
        self._build()

    def _build(self) -> None:
        from torchjd.autogram import Engine

        shared_state = {id(t): t for t in (*self.trunk.parameters(), *self.trunk.buffers())}
        self._clone = copy.deepcopy(self.trunk, shared_state)
        self._engine = Engine(self._clone, batch_dim=None)
        self._param_ids = [id(p) for p in self.trunk.parameters()]

    @contextmanager
    def hooked(self, model: nn.Module) -> Iterator[None]:
        """Run ``model``'s forward passes inside the block through the hooked clone of its trunk."""
        if getattr(model, "trunk", None) is not self.trunk:
            raise ValueError("AutogramGramian was built for another trunk")
        if [id(p) for p in self.trunk.parameters()] != self._param_ids:  # modules replaced (e.g. adapters)
            self._build()
        self._clone.train(self.trunk.training)
        model.trunk = self._clone
        try:
            yield
        finally:
            model.trunk = self.trunk

    def gramian(self, stacked_losses: Tensor) -> Tensor:
        """``[K, K]`` Gramian of the per-task gradients of a forward pass run inside :meth:`hooked`."""
        return self._engine.compute_gramian(stacked_losses).detach()


def representation_jacobian(forward: ForwardPass, task_params: Sequence[Sequence[Tensor]]) -> Tensor:
    """Per-task gradients ``[K, numel(z)]`` w.r.t. the shared features ``z`` (MGDA-UB's bound).

    Each call goes through one head only, so the K calls together cost about one backward pass of the
    heads; every head gets its plain gradient in the same call. The graph is kept for the backward
    pass of the combined direction through the trunk.
    """
    z = forward.features
    if z is None:
        raise ValueError("representation gradients need the shared features of the forward pass")
    rows = []
    for loss, own in zip(forward.losses, task_params, strict=True):
        grads = torch.autograd.grad(loss, [z, *own], retain_graph=True, allow_unused=True)
        rows.append((grads[0] if grads[0] is not None else torch.zeros_like(z)).reshape(-1))
        accumulate_grads(list(own), grads[1:])
    return torch.stack(rows)


def backward_heads(losses: Sequence[Tensor], task_params: Sequence[Sequence[Tensor]]) -> None:
    """Every head gets its plain gradient ``∇L_i`` (one backward pass restricted to the heads with
    ``inputs=``; head i sees loss i only). The graph is kept for the shared parameters."""
    heads = _head_params(task_params)
    if heads:
        torch.autograd.backward(torch.stack(list(losses)).sum(), inputs=heads, retain_graph=True)


def backward_shared_weighted(losses: Sequence[Tensor], weights: Tensor, shared: Sequence[Tensor]) -> None:
    """The shared parameters get ``Σ_i w_i ∇L_i`` (one backward pass restricted with ``inputs=``); frees
    the graph. Call :func:`backward_heads` first: the heads must keep their plain gradients."""
    stacked = torch.stack(list(losses))
    torch.autograd.backward((weights.detach().to(stacked) * stacked).sum(), inputs=list(shared))
