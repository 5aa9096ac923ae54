"""The gradient engine: per-task gradient information for gradient-based MTL methods.

A method declares what it needs in ``Method.requires`` (:class:`~mtlflow.methods.base.GradInput`) and
the trainer asks the engine for exactly that:

* ``LOSSES``         -- nothing: the method's objective is back-propagated once;
* ``JACOBIAN``       -- ``J [K, P]`` w.r.t. the shared parameters, from a Jacobian backend
  (``loop``, ``batched``, ``func``, ``autojac``; see :mod:`mtlflow.grad_engine.backends`);
* ``GRAMIAN``        -- ``G = J Jᵀ`` only: from ``J`` with a Jacobian backend, or without ``J`` with
  ``autogram``; the trainer then back-propagates ``Σ w_i L_i`` to the shared parameters;
* ``REPRESENTATION`` -- per-task gradients w.r.t. the shared features ``z`` (MGDA-UB, Sener & Koltun
  2018 Sec. 3.3): K backward passes through the heads only, then one backward pass of the combined
  direction through the trunk.

In every mode each head receives its plain gradient ``∇L_i`` (the methods combine only the shared
parameters' gradients).

``grad_backend="auto"`` resolves to ``loop`` on every device: on the CPU the K-loop is the fastest
(1.0-1.5x faster than ``batched``, 1.3-3x faster than ``func`` and TorchJD; measured in
environment-and-dependencies.md §5 and by ``mtlflow bench``); no GPU measurement exists yet to justify
another default there (``mtlflow bench --device cuda`` measures it side by side).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from mtlflow.core.errors import UnknownNameError
from mtlflow.grad_engine._flat import accumulate_grads, flatten_rows, write_flat_grad
from mtlflow.grad_engine.backends import (
    JACOBIAN_BACKENDS,
    AutogramGramian,
    AutojacBackend,
    BatchedBackend,
    ForwardPass,
    FuncBackend,
    JacobianBackend,
    LoopBackend,
    StepProblem,
    backward_heads,
    backward_shared_weighted,
    representation_jacobian,
)

__all__ = ["BACKENDS", "GRAMIAN_BACKENDS", "JACOBIAN_BACKENDS", "GRAD_WRT", "AutogramGramian", "AutojacBackend",
           "BatchedBackend", "ForwardPass", "FuncBackend", "JacobianBackend", "LoopBackend", "StepProblem",
           "accumulate_grads", "backward_heads", "backward_shared_weighted", "flatten_rows",
           "jacobian_backend", "representation_jacobian", "resolve_backend", "task_jacobian", "write_flat_grad"]

#: Backends computing only the Gramian (no Jacobian), for Gramian-weighting methods.
GRAMIAN_BACKENDS: tuple[str, ...] = ("autogram",)
#: Every value ``RunConfig.grad_backend`` accepts.
BACKENDS: tuple[str, ...] = ("auto", *JACOBIAN_BACKENDS, *GRAMIAN_BACKENDS)
#: What per-task gradients are taken with respect to (``RunConfig.grad_wrt``).
GRAD_WRT: tuple[str, ...] = ("parameters", "representation")


def resolve_backend(name: str) -> str:
    """The concrete backend ``name`` stands for (``auto`` -> ``loop`` on every device, see module doc)."""
    if name not in BACKENDS:
        raise UnknownNameError("gradient backend", name, list(BACKENDS))
    return "loop" if name == "auto" else name


def jacobian_backend(name: str) -> JacobianBackend:
    """An instance of the Jacobian backend ``name`` (``loop``, ``batched``, ``func`` or ``autojac``)."""
    try:
        return JACOBIAN_BACKENDS[name]()
    except KeyError:
        raise UnknownNameError("Jacobian backend", name, list(JACOBIAN_BACKENDS)) from None


def task_jacobian(losses: Sequence[Tensor], shared: Sequence[Tensor],
                  task_params: Sequence[Sequence[Tensor]] | None = None, retain_graph: bool = False) -> Tensor:
    """Per-task gradients ``[K, P]`` of ``losses`` w.r.t. ``shared`` with the K-loop.

    When ``task_params`` is given, the gradient of loss i w.r.t. ``task_params[i]`` is accumulated
    into their ``.grad`` in the same autograd call. The graph is freed after the last task unless
    ``retain_graph``.
    """
    return LoopBackend().differentiate(ForwardPass(list(losses)), shared, task_params, retain_graph)
