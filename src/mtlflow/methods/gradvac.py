"""GradVac: gradient vaccine.

Wang, Tsvetkov, Firat & Cao, "Gradient Vaccine: Investigating and Improving Multi-task Optimization in
Massively Multilingual Models", ICLR 2021 (the GradVac update rule). PCGrad only acts when two gradients
conflict (cosine < 0); GradVac sets a per-pair target cosine φ̂_ij, an EMA of the observed cosines
(φ̂_ij = 0 at start), and raises the cosine to the target whenever it falls below. For every task i,
starting from g_i' = g_i and visiting the other tasks j in random order, with φ_ij = cos(g_i', g_j):

    if φ_ij < φ̂_ij:  g_i' ← g_i' + ||g_i'|| (φ̂_ij √(1-φ_ij²) - φ_ij √(1-φ̂_ij²)) / (||g_j|| √(1-φ̂_ij²)) g_j,
    φ̂_ij ← (1 - β) φ̂_ij + β φ_ij,           d = Σ_i g_i'.

After the correction cos(g_i', g_j) = φ̂_ij exactly. With all targets at 0 (the first step) this is
PCGrad. β = 0.5 (the default of LibMTL and TorchJD; we could not check the paper's value in the
sources available to us). The target is updated for every visited pair, as in the paper's algorithm
and TorchJD; LibMTL updates it only when it corrected the pair.

Granularity: whole model (LibMTL's group type 0): one cosine per pair over all shared parameters;
the paper's per-layer variants are not implemented. Like PCGrad it runs on the K × K Gramian
(g_i' = Σ_k C_ik g_k). Cosines use exact norms; a pair is skipped when a gradient is zero or the
target is ±1 (then no finite correction exists). Visiting orders come from a generator owned by the
method (seeded from the run seed); φ̂ and the generator are checkpointed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, unit_interval
from mtlflow.core.numerics import cpu_float64, one_blas_thread
from mtlflow.methods._support import gramian_numpy
from mtlflow.methods.base import GramianWeighting


def gradvac_coefficients(gramian: np.ndarray, targets: np.ndarray, orders: Sequence[Sequence[int]],
                         beta: float) -> tuple[np.ndarray, np.ndarray]:
    """(C, new targets) after one GradVac step: g_i' = Σ_k C_ik g_k; ``targets`` is not modified."""
    k = gramian.shape[0]
    coef = np.eye(k)
    targets = targets.copy()
    rows = np.arange(k)
    order_matrix = np.asarray(orders, dtype=np.int64).reshape(k, -1)
    for step in range(order_matrix.shape[1]):
        js = order_matrix[:, step]
        dots = (coef * gramian[js]).sum(axis=1)                          # g_i' · g_j
        norm_i = np.sqrt(np.clip(((coef @ gramian) * coef).sum(axis=1), 0.0, None))
        norm_j = np.sqrt(np.clip(gramian[js, js], 0.0, None))
        nonzero = (norm_i > 0) & (norm_j > 0)
        cos = np.where(nonzero, dots / np.where(nonzero, norm_i * norm_j, 1.0), 0.0)
        cos = np.clip(cos, -1.0, 1.0)
        target = targets[rows, js]
        sin_target = np.sqrt(np.clip(1.0 - target**2, 0.0, None))
        correct = nonzero & (cos < target) & (sin_target > 0)
        amount = (norm_i * (target * np.sqrt(np.clip(1.0 - cos**2, 0.0, None)) - cos * sin_target)
                  / np.where(correct, norm_j * sin_target, 1.0))
        coef[rows[correct], js[correct]] += amount[correct]
        targets[rows, js] = (1.0 - beta) * target + beta * cos
    return coef, targets


class GradVac(GramianWeighting):
    name = "gradvac"
    paper = ("Wang et al., Gradient Vaccine: Investigating and Improving Multi-task Optimization in Massively "
             "Multilingual Models, ICLR 2021")
    equations = "update rule: raise cos(g_i, g_j) to the EMA target φ̂_ij; φ̂ ← (1-β)φ̂ + βφ; d = Σ_i g_i'"
    hparams = {"beta": HParam(0.5, "EMA factor β of the target cosines", unit_interval)}

    stochastic = True

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.targets = np.zeros((n_tasks, n_tasks))

    @one_blas_thread
    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        orders = self.rng.visiting_orders(self.n_tasks)
        coef, self.targets = gradvac_coefficients(gramian_numpy(gramian, self.name), self.targets, orders, self.hp["beta"])
        return torch.from_numpy(coef.sum(axis=0)).to(gramian.device)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "targets": torch.from_numpy(self.targets.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.targets = cpu_float64(state["targets"]).numpy()
