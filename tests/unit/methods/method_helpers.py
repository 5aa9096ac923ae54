"""What the method tests share: seeded Jacobians and losses, the cases they run on, hook contexts, a
stand-in trainer, a small model, state round trips."""

from __future__ import annotations

import copy
import io
from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import settings
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from mtlflow import methods
from mtlflow.methods.base import StepContext
from mtlflow.models.base import MultiTaskModel

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True)

# (seed, K, P): full-rank Jacobians (K <= P; K = 2 included everywhere) and rank-deficient ones (K > P)
FULL_RANK = [(0, 2, 3), (1, 2, 40), (2, 3, 10), (3, 4, 4), (4, 5, 30), (5, 8, 20), (6, 10, 64)]
RANK_DEFICIENT = [(7, 5, 3), (8, 8, 2), (9, 3, 2)]
SHAPES = FULL_RANK + RANK_DEFICIENT


def jacobian(seed: int, k: int, p: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(k, p, generator=gen, dtype=torch.float64) * scale


def rank_deficient_jacobians(k: int, p: int) -> dict[str, torch.Tensor]:
    """K task gradients in ℝ^P of rank < K with unequal norms (a linear dependence among equal-norm gradients,
    such as g2 = −g1, hides solvers that only handle that case):

    * ``antiparallel``: g_i = (−2)^i·g, rank 1, every task conflicting with its neighbour (0 in the hull);
    * ``parallel``: g_i = 2^i·g, rank 1, no conflict;
    * ``dependent``: random rows of rank K − 1 with norms spread over two decades;
    * ``aligned-dependent``: non-negative rows of rank K − 1 (no conflict), norms over two decades.
    """
    gen = torch.Generator().manual_seed(4242)
    g = torch.randn(p, generator=gen, dtype=torch.float64)
    powers = torch.arange(k, dtype=torch.float64)
    spread = torch.logspace(0, 2, k, dtype=torch.float64)[:, None]
    basis = torch.randn(k - 1, p, generator=gen, dtype=torch.float64)
    mix = torch.randn(k, k - 1, generator=gen, dtype=torch.float64)
    return {
        "antiparallel": ((-2.0) ** powers)[:, None] * g,
        "parallel": (2.0 ** powers)[:, None] * g,
        "dependent": (mix @ basis) * spread,
        "aligned-dependent": (mix.abs() @ basis.abs()) * spread,
    }


def gramian(grads: torch.Tensor) -> np.ndarray:
    return (grads @ grads.T).numpy()


def positive_losses(seed: int, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return torch.rand(k, generator=gen, dtype=torch.float64) * 3 + 0.05


def random_orders(seed: int, k: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.permutation([j for j in range(k) if j != i])) for i in range(k)]


def direction(name: str, grads: torch.Tensor, **hparams) -> tuple[np.ndarray, methods.Method]:
    """The method's direction on ``grads`` (losses all 1) and the method."""
    method = methods.build(name, grads.shape[0], **hparams)
    d = method.combine(grads, torch.ones(grads.shape[0], dtype=grads.dtype))
    return d.numpy(), method


def ctx(losses: torch.Tensor, step: int = 0, epoch: int = 1) -> StepContext:
    return StepContext(step=step, epoch=epoch, losses=losses.detach(), recompute_losses=lambda: losses)


def fake_trainer(model: nn.Module | None = None, seed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(model=model, config=SimpleNamespace(seed=seed))


def small_model(k: int, seed: int = 0) -> MultiTaskModel:
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4))
    return MultiTaskModel(trunk, [nn.Linear(4, 1) for _ in range(k)], [f"t{i}" for i in range(k)]).double()


def through_torch_save(state: dict) -> dict:
    """``state`` after a save and a load, as a checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def roundtrip(method: methods.Method) -> methods.Method:
    """A fresh instance with the same hyper-parameters, loaded from a deep copy of the state."""
    clone = methods.build(method.name, method.n_tasks, **method.hp)
    clone.load_state_dict(copy.deepcopy(method.state_dict()))
    return clone


def hide_module(monkeypatch, module: str) -> None:
    """Make ``import <module>`` fail from now on in this test, as on a machine without it."""
    import builtins

    real_import = builtins.__import__

    def without_module(name, *args, **kwargs):
        if name == module:
            raise ImportError(f"No module named '{module}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_module)


def hide_cvxpy(monkeypatch) -> None:
    """Make ``import cvxpy`` fail from now on in this test, as on a machine without it."""
    hide_module(monkeypatch, "cvxpy")


#: the torch functions that multiply matrices or vectors (what TF32/bf16 precision settings affect)
PRODUCTS = {"mm", "matmul", "__matmul__", "mv", "addmm", "addmv", "dot", "bmm"}


class TensorWatch(TorchFunctionMode):
    """Watches every torch operation inside ``with``: the largest float64 tensor taken or made
    (``largest_float64``, in entries) and the float32 matmul precision each float32 product ran at
    (``precisions``)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_float64, self.precisions = 0, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
        self.largest_float64 = max([self.largest_float64] + [x.numel() for x in tensors if x.dtype == torch.float64])
        if getattr(func, "__name__", "") in PRODUCTS and any(x.dtype == torch.float32 for x in tensors):
            self.precisions.add(torch.get_float32_matmul_precision())
        return out
