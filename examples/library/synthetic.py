"""What both library-mode examples share: the problem (three tasks on one synthetic table, a shared MLP trunk
and one linear head per task), their command line and their progress line. Nothing here is mtlflow's; it
stands for the user's own data and model."""

from __future__ import annotations

import argparse

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

N_FEATURES = 10
TASKS = ("wave", "trend", "sign")


def dataset(n_rows: int = 512, seed: int = 0) -> TensorDataset:
    """Features x and three targets: a non-linear and a linear regression target, and a binary label."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, N_FEATURES, generator=generator)
    directions = torch.randn(3, N_FEATURES, generator=generator)
    wave = torch.sin(2 * x @ directions[0])
    trend = x @ directions[1] / N_FEATURES ** 0.5
    sign = (x @ directions[2] > 0).float()
    return TensorDataset(x, torch.stack([wave, trend, sign], dim=1))


class MultiTaskNet(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(N_FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(width, 1) for _ in TASKS])

    def task_losses(self, x: Tensor, targets: Tensor) -> list[Tensor]:
        """One scalar loss per task: mean squared error for the regression targets, logistic loss for the label."""
        z = self.trunk(x)
        wave, trend, sign = (head(z).squeeze(1) for head in self.heads)
        return [F.mse_loss(wave, targets[:, 0]), F.mse_loss(trend, targets[:, 1]),
                F.binary_cross_entropy_with_logits(sign, targets[:, 2])]


def command_line(description: str, method: str, epochs: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--method", default=method, help="a method that runs in library mode")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def print_epoch(epoch: int, mean_losses: Tensor) -> None:
    """The line the tests read: the epoch's mean total loss, then each task's."""
    print(f"epoch {epoch} loss {float(mean_losses.sum()):.4f} "
          + " ".join(f"{task}={float(value):.4f}" for task, value in zip(TASKS, mean_losses)))
