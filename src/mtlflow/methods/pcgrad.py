"""PCGrad: projecting conflicting gradients ("gradient surgery").

Yu, Kumar, Gupta, Levine, Hausman & Finn, "Gradient Surgery for Multi-Task Learning", NeurIPS 2020
(Alg. 1). For every task i, starting from g_i^PC = g_i, visit the other tasks j in random order and,
when g_i^PC · g_j < 0, project g_i^PC onto the normal plane of the original g_j:

    g_i^PC ← g_i^PC - (g_i^PC · g_j / ||g_j||²) g_j ;        d = Σ_i g_i^PC   (sum reduction).

Invariant: right after visiting j, g_i^PC · g_j ≥ 0 (= 0 when it projected). A later projection onto
another g_k can make it negative again, so only the last visited task is guaranteed on the final
g_i^PC; for two tasks each projected gradient is non-conflicting with the other original one, and
d · g_i ≥ 0 for both.

Every quantity is an inner product, so the method runs on the K × K Gramian: g_i^PC = Σ_k C_ik g_k
and d = (Σ_i C_i) · G (the same reformulation as TorchJD's PCGradWeighting; the tests check both
agree on the same visiting orders). The orders come from a generator owned by the method, seeded from
the run seed and checkpointed. Gradients w.r.t. the shared parameters; the heads get their own
gradients. Nash-MTL's code does not clip; the trainer clips (when asked) after this step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting


def pcgrad_coefficients(gramian: np.ndarray, orders: Sequence[Sequence[int]]) -> np.ndarray:
    """C with g_i^PC = Σ_k C_ik g_k after Alg. 1, given each task's visiting order of the others
    (all orders of equal length; a prefix of the full orders stops the algorithm after that many visits)."""
    k = gramian.shape[0]
    coef = np.eye(k)
    rows = np.arange(k)
    order_matrix = np.asarray(orders, dtype=np.int64).reshape(k, -1)
    for step in range(order_matrix.shape[1]):
        js = order_matrix[:, step]
        dots = (coef * gramian[js]).sum(axis=1)          # g_i^PC · g_{j_i}
        sq_norms = gramian[js, js]
        conflict = (dots < 0) & (sq_norms > 0)
        coef[rows[conflict], js[conflict]] -= dots[conflict] / sq_norms[conflict]
    return coef


class PCGrad(GramianWeighting):
    name = "pcgrad"
    paper = "Yu et al., Gradient Surgery for Multi-Task Learning, NeurIPS 2020"
    stochastic = True
    equations = "Alg. 1: g_i ← g_i - (g_i·g_j/||g_j||²) g_j if g_i·g_j < 0, random order; d = Σ_i g_i"

    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        orders = self.rng.visiting_orders(self.n_tasks)
        coef = pcgrad_coefficients(gramian_numpy(gramian, self.name), orders)
        return torch.from_numpy(coef.sum(axis=0)).to(gramian.device)
