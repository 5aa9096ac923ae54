"""Flat gradient vectors and ``.grad`` bookkeeping shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def flatten_rows(rows: Sequence[Tensor | None], like: Sequence[Tensor], k: int) -> Tensor:
    """Concatenate per-parameter Jacobians ``[K, *p.shape]`` into ``[K, P]`` (zeros for ``None``)."""
    parts = [(r if r is not None else p.new_zeros((k, *p.shape))).reshape(k, -1)
             for r, p in zip(rows, like, strict=True)]
    return torch.cat(parts, dim=1) if parts else torch.zeros(k, 0)


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


def accumulate_grads(params: Sequence[Tensor], grads: Sequence[Tensor | None]) -> None:
    """``p.grad += g`` for every parameter that got a gradient."""
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g.detach().clone()
        else:
            p.grad.add_(g)
