"""The two-objective, two-parameter toy problem of CAGrad (Liu et al., NeurIPS 2021, Sec. 5 / App.).

With x = (x1, x2) and LOWER = 5e-6::

    f1a = log max(|0.5(-x1 - 7) - tanh(-x2)|, LOWER) + 6
    f2a = log max(|0.5(-x1 + 3) + tanh(-x2) + 2|, LOWER) + 6
    f1b = ((-x1 + 7)^2 + 0.1 (-x2 - 8)^2) / 10 - 20
    f2b = ((-x1 - 7)^2 + 0.1 (-x2 - 8)^2) / 10 - 20
    c1 = max(tanh(0.5 x2), 0),  c2 = max(tanh(-0.5 x2), 0)
    L1 = scale * (c1 f1a + c2 f1b),  L2 = c1 f2a + c2 f2b

``scale`` = 0.1 is the imbalance used by Nash-MTL (Navon et al. 2022) and FAMO (Liu et al. 2023);
``scale`` = 1 is CAGrad's original. The LDC-MTL paper prints ``- tanh(-x2)`` in f2a, but all three
public implementations use ``+``; we follow them (see methods-palora-ldc.md §II.11).
The Pareto set is x2 = -8.3552, x1 in [-7, 7].
"""

from __future__ import annotations

import torch
from torch import Tensor

LOWER = 5e-6
#: The five start points of the Nash-MTL and FAMO toy experiments.
START_POINTS: tuple[tuple[float, float], ...] = ((-8.5, 7.5), (0.0, 0.0), (9.0, 9.0), (-7.5, -0.5), (9.0, -1.0))
PARETO_X2 = -8.3552
PARETO_X1_RANGE = (-7.0, 7.0)


def _relu_inclusive(t: Tensor) -> Tensor:
    """max(t, 0) with derivative 1 at t = 0, as torch.clamp had when the reference code was written.

    torch 2.x gives clamp a zero derivative at its boundary, which would freeze every method at the
    published start point (0, 0), where both gates are exactly at 0.
    """
    return torch.where(t >= 0, t, torch.zeros_like(t))


def toy_losses(x: Tensor, scale: float = 0.1) -> Tensor:
    """Both objectives at ``x`` (shape ``[..., 2]``); returns ``[..., 2]``."""
    x1, x2 = x[..., 0], x[..., 1]
    lower = torch.as_tensor(LOWER, dtype=x.dtype, device=x.device)
    f1a = torch.log(torch.maximum((0.5 * (-x1 - 7) - torch.tanh(-x2)).abs(), lower)) + 6
    f2a = torch.log(torch.maximum((0.5 * (-x1 + 3) + torch.tanh(-x2) + 2).abs(), lower)) + 6
    c1 = _relu_inclusive(torch.tanh(0.5 * x2))
    f1b = ((-x1 + 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    f2b = ((-x1 - 7) ** 2 + 0.1 * (-x2 - 8) ** 2) / 10 - 20
    c2 = _relu_inclusive(torch.tanh(-0.5 * x2))
    return torch.stack([scale * (c1 * f1a + c2 * f1b), c1 * f2a + c2 * f2b], dim=-1)


def distance_to_pareto_set(x: Tensor) -> Tensor:
    """Euclidean distance from ``x`` (``[..., 2]``) to the segment x2 = -8.3552, x1 in [-7, 7]."""
    lo, hi = PARETO_X1_RANGE
    dx = x[..., 0] - x[..., 0].clamp(lo, hi)
    dy = x[..., 1] - PARETO_X2
    return torch.sqrt(dx**2 + dy**2)
