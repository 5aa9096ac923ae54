"""Per-task gradients with respect to the shared parameters.

The K-loop backend calls ``torch.autograd.grad`` once per task with ``retain_graph`` and asks, in the
same call, for the gradient of that task's head: a head depends on its own loss only, so each head
gets its plain gradient for free. On the CPU this loop is the fastest way to build the Jacobian
(faster than ``is_grads_batched``, ``torch.func`` and TorchJD's autojac; see
environment-and-dependencies.md §5).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def flatten(tensors: Sequence[Tensor | None], like: Sequence[Tensor]) -> Tensor:
    """Concatenate gradients into one vector, with zeros where a parameter got no gradient."""
    parts = [(t if t is not None else torch.zeros_like(p)).reshape(-1) for t, p in zip(tensors, like)]
    return torch.cat(parts) if parts else torch.zeros(0)


def write_flat_grad(params: Sequence[Tensor], flat: Tensor, accumulate: bool = False) -> None:
    """Write the vector ``flat`` into ``p.grad`` of ``params`` (in order)."""
    offset = 0
    for p in params:
        n = p.numel()
        chunk = flat[offset:offset + n].view_as(p).to(p.dtype)
        if accumulate and p.grad is not None:
            p.grad.add_(chunk)
        else:
            p.grad = chunk.clone()
        offset += n
    if offset != flat.numel():
        raise ValueError(f"gradient vector has {flat.numel()} entries for {offset} parameters")


def task_jacobian(losses: Sequence[Tensor], shared: Sequence[Tensor],
                  task_params: Sequence[Sequence[Tensor]] | None = None, retain_graph: bool = False) -> Tensor:
    """Per-task gradients ``[K, P]`` of ``losses`` w.r.t. ``shared``.

    When ``task_params`` is given, the gradient of loss i w.r.t. ``task_params[i]`` is accumulated
    into their ``.grad`` in the same autograd call. The graph is freed after the last task unless
    ``retain_graph``.
    """
    k = len(losses)
    rows = []
    for i, loss in enumerate(losses):
        own = list(task_params[i]) if task_params is not None else []
        grads = torch.autograd.grad(loss, list(shared) + own, retain_graph=retain_graph or i < k - 1,
                                    allow_unused=True)
        rows.append(flatten(grads[:len(shared)], shared))
        for p, g in zip(own, grads[len(shared):]):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g.detach().clone()
            else:
                p.grad.add_(g)
    return torch.stack(rows)
