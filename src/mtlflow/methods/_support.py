"""Building blocks shared by several method files (not a method module; the registry skips it).

* :class:`MethodGenerator` -- a ``torch.Generator`` owned by a method (RLW's weights, PCGrad's and
  GradVac's visiting orders, GradDrop's thresholds), seeded from the run seed and checkpointed, so a
  resumed run draws exactly what the uninterrupted run would have drawn and the global RNG streams
  (data order, dropout) are untouched.
* :func:`gramian_numpy` -- the Gramian as a symmetric float64 array for the K x K computations.
* :func:`min_losses_hparam` / :func:`shifted_losses` -- methods built on log-losses or loss ratios
  need positive losses; ``min_losses`` gives lower bounds L^min (default 0) and the method works on
  L - L^min, as FAMO does. A loss at or below its bound stops training with a one-line error.
* :func:`last_shared_layer` -- GradNorm's W: the parameters of the trunk's last parametrised module.
* :func:`scale_head_gradients` -- for methods whose paper trains each head on a rescaled loss
  c_i L_i (IMTL, DB-MTL): the trainer's Jacobian pass gives head i the plain gradient of L_i, which
  these methods multiply by c_i in place.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam
from mtlflow.core.numerics import gramian_array


def method_seed(method_name: str, seed: int) -> int:
    """The seed of a method's private random stream: the run seed and the method's name, so that two
    methods of one run, or one method in two runs, never share a stream."""
    return (int(seed) * 1_000_003 + zlib.crc32(method_name.encode())) % (2**63)


class MethodGenerator:
    """A CPU ``torch.Generator`` private to one method, seeded from (run seed, method name)."""

    def __init__(self, method_name: str, seed: int = 0):
        self.method_name = method_name
        self.generator = torch.Generator()
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(method_seed(self.method_name, seed))

    def permutation(self, n: int) -> list[int]:
        return torch.randperm(n, generator=self.generator).tolist()

    def visiting_orders(self, k: int) -> list[list[int]]:
        """For every task i, the other K - 1 tasks in a fresh random order."""
        orders = []
        for i in range(k):
            others = [j for j in range(k) if j != i]
            orders.append([others[p] for p in self.permutation(k - 1)])
        return orders

    def state_dict(self) -> Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: Tensor) -> None:
        self.generator.set_state(state.to("cpu"))  # checkpoints may be loaded onto the GPU


def gramian_numpy(gramian: Tensor, method: str) -> np.ndarray:
    """The K x K Gramian as a symmetric PSD float64 numpy array (the small solvers run on the CPU);
    NaN or Inf raise :class:`~mtlflow.core.errors.NonFiniteValueError` (see :mod:`mtlflow.core.numerics`)."""
    return gramian_array(gramian, method)


def min_losses_hparam() -> HParam:
    return HParam(None, "lower bounds L^min of the task losses, one per task (default 0); the method uses "
                  "L - L^min, which must stay positive (the toy problem needs [-21·scale, -21])",
                  lambda v: v is None or all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v),
                  "a list of numbers, one per task", kind=list)


def loss_bounds(method: str, n_tasks: int, bounds: list[float] | None) -> Tensor:
    """The ``min_losses`` hyper-parameter as a float64 tensor, checked against the task count."""
    if bounds is not None and len(bounds) != n_tasks:
        raise InvalidParameterError(f"{method}: min_losses has {len(bounds)} entries for {n_tasks} tasks; "
                                    "give one lower bound per task")
    return torch.tensor(bounds if bounds is not None else [0.0] * n_tasks, dtype=torch.float64)


def shifted_losses(method: str, losses: Tensor, bounds: Tensor) -> Tensor:
    """L - L^min (differentiable), refusing non-positive values with a one-line error."""
    shifted = losses - bounds.to(losses)
    if bool((shifted.detach() <= 0).any()):
        raise InvalidParameterError(
            f"{method}: the method needs losses above their lower bounds, got losses "
            f"{[round(float(v), 6) for v in losses.detach()]} and min_losses {bounds.tolist()}; "
            "set --hp min_losses=[...] below the attainable losses")
    return shifted


def last_shared_layer(model: nn.Module) -> list[nn.Parameter]:
    """Shared parameters owned directly by the last module of ``model.trunk`` that has any.

    Only shared ones (``MultiTaskModel.shared_parameters``): SegNet-MTAN's trunk ends with task 1's attention
    masks, whose weights no other task's loss reaches (GradNorm's norms of the other tasks would be 0)."""
    shared = {id(p) for p in model.shared_parameters()}
    last: list[nn.Parameter] = []
    for module in model.trunk.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) in shared]
        if own:
            last = own
    if not last:
        raise InvalidParameterError("the model's shared trunk has no trainable parameters; "
                                    "this method needs a shared layer")
    return last


def head_parameters(trainer: TrainerView) -> list[list[nn.Parameter]]:
    model = trainer.model
    return [model.task_parameters(i) for i in range(len(model.heads))]


def scale_head_gradients(heads: Sequence[Sequence[Tensor]] | None, scales: Tensor) -> None:
    """Multiply the ``.grad`` of head i by ``scales[i]`` (the head then holds ∇(c_i L_i))."""
    if heads is None:
        return
    for params, c in zip(heads, scales.tolist(), strict=True):
        for p in params:
            if p.grad is not None:
                p.grad.mul_(c)
