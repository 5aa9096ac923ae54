"""Multi-input multi-task models: every task has its own input (Office-31/Office-Home domains).

A batch holds one sample of every task per row, ``x [B, K_all, C, H, W]`` (see
:class:`mtlflow.benchmarks._office.MultiInputDataset`). The shared trunk encodes each task's images
separately (BatchNorm statistics per task batch, as LibMTL's multi-input trainer), giving the shared
features ``z [K, B, D]``; head i classifies ``z[i]``. A model trained on a subset of the tasks (a
single-task reference) reads only those tasks' inputs (``input_index``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from mtlflow.models.base import MultiTaskModel


class MultiInputModel(MultiTaskModel):
    def __init__(self, trunk: nn.Module, heads: Sequence[nn.Module], task_names: Sequence[str],
                 input_index: Sequence[int]):
        super().__init__(trunk, heads, task_names)
        self.input_index = list(input_index)

    def features(self, x: Tensor) -> Tensor:
        return torch.stack([self.trunk(x[:, j]) for j in self.input_index])

    def forward_heads(self, z: Tensor) -> list[Tensor]:
        return [head(z[i]) for i, head in enumerate(self.heads)]
