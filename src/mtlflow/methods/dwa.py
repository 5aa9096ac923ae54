"""DWA: dynamic weight average.

Liu, Johns & Davison, "End-to-End Multi-Task Learning with Attention", CVPR 2019 (the two equations of
its "Dynamic Weight Average" paragraph):

    w_k(t) = K exp(r_k(t-1) / T) / Σ_i exp(r_i(t-1) / T),     r_k(t-1) = L_k(t-1) / L_k(t-2),

with T = 2, L_k(t) the average training loss of task k over epoch t, and w_k(t) = 1 for the first two
epochs; the model minimises Σ_k w_k L_k (the weights sum to K). A task whose loss decreases more
slowly (larger ratio r_k) gets a larger weight.

``window="epoch"`` (default) is the paper: the per-epoch average losses are collected in
``objective`` and closed in ``on_epoch_end``. ``window="iterations"`` is the variant of the
Nash-MTL/FAMO code (the implementation most papers ran): r is the ratio of the mean losses of the last
``iteration_window`` (25) steps to the mean of the ``iteration_window`` steps before them; as in that
code, the current step's loss enters the window before the weights are computed (the weights of step
t use the losses of steps t-2·window+1 .. t). Two deviations remain, by design: the weights stay equal
until 2·window losses have been seen (the Nash-MTL code starts after window + 1 steps from a buffer
padded with ones, i.e. compares real losses with 1.0), and the objective is Σ w L, not mean(w L)
(a factor 1/K; the trainer's scale convention, see :class:`~mtlflow.methods.base.Method`).
``min_losses`` shifts losses that can be negative (the toy problem).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtlflow.core.hparams import HParam, one_of, positive
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods._support import min_losses_hparam, shifted_losses
from mtlflow.methods.base import LossWeighting


class DynamicWeightAverage(LossWeighting):
    name = "dwa"
    paper = "Liu, Johns & Davison, End-to-End Multi-Task Learning with Attention, CVPR 2019"
    equations = "DWA: w_k = K softmax(r/T)_k, r_k = L_k(t-1)/L_k(t-2) over epochs; w = 1 for t = 1, 2"
    hparams = {
        "temperature": HParam(2.0, "softmax temperature T", positive),
        "window": HParam("epoch", "'epoch' (paper: per-epoch average losses) or 'iterations' "
                         "(Nash-MTL code: means over the last iteration_window steps)",
                         one_of("epoch", "iterations")),
        "iteration_window": HParam(25, "steps per averaging window when window='iterations'", positive),
        "min_losses": min_losses_hparam(),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        #: per-epoch mean losses of the last two completed epochs (window="epoch")
        self.epoch_means: list[Tensor] = []
        self._epoch_sum = torch.zeros(n_tasks, dtype=torch.float64)
        self._epoch_steps = 0
        #: the last 2·iteration_window losses, oldest first (window="iterations")
        self.recent: list[Tensor] = []

    def weights(self, losses: Tensor) -> Tensor:
        ratio = self.loss_ratio()
        if ratio is None:
            return torch.ones_like(losses)
        return (self.n_tasks * torch.softmax(ratio / self.hp["temperature"], dim=0)).to(losses)

    def loss_ratio(self) -> Tensor | None:
        """r = L(t-1) / L(t-2) (float64), or None while fewer than two epochs/windows were seen."""
        if self.hp["window"] == "epoch":
            if len(self.epoch_means) < 2:
                return None
            return self.epoch_means[-1] / self.epoch_means[-2]
        window = self.hp["iteration_window"]
        if len(self.recent) < 2 * window:
            return None
        history = torch.stack(self.recent)
        return history[window:].mean(dim=0) / history[:window].mean(dim=0)

    def objective(self, losses: Tensor) -> Tensor:
        shifted = shifted_losses(self.name, losses, self.min_losses)
        # recorded first: window="iterations" includes this step's loss (the Nash-MTL code); the epoch
        # window only closes in on_epoch_end, so its weights are unaffected by the order
        self._record(cpu_float64(shifted))
        w = self.weights(shifted.detach())
        self.last_weights = w
        return (w * shifted).sum()

    def _record(self, shifted: Tensor) -> None:
        if self.hp["window"] == "epoch":
            self._epoch_sum += shifted
            self._epoch_steps += 1
            return
        self.recent.append(shifted)
        del self.recent[:-2 * self.hp["iteration_window"]]

    def on_epoch_end(self, epoch: int) -> None:
        if self.hp["window"] != "epoch" or self._epoch_steps == 0:
            return
        self.epoch_means = [*self.epoch_means, self._epoch_sum / self._epoch_steps][-2:]
        self._epoch_sum = torch.zeros(self.n_tasks, dtype=torch.float64)
        self._epoch_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_means": [m.clone() for m in self.epoch_means], "epoch_sum": self._epoch_sum.clone(),
                "epoch_steps": self._epoch_steps, "recent": [r.clone() for r in self.recent]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch_means = [cpu_float64(m) for m in state["epoch_means"]]
        self._epoch_sum = cpu_float64(state["epoch_sum"])
        self._epoch_steps = int(state["epoch_steps"])
        self.recent = [cpu_float64(r) for r in state["recent"]]
