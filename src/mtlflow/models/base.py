"""The model every benchmark builds: a shared trunk and one head per task.

The split between trunk and heads, and which trunk parameters belong to one task only, is the single
definition of "shared" used by the gradient engine, COST and PaLoRA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn


class MultiTaskModel(nn.Module):
    """A shared trunk followed by one head per task.

    ``forward(x)`` returns the list of per-task predictions. The split is explicit so that the
    gradient engine can take per-task gradients with respect to :meth:`shared_parameters` (or to the
    shared representation) and give every head its own gradient.
    """

    def __init__(self, trunk: nn.Module, heads: Sequence[nn.Module], task_names: Sequence[str]):
        super().__init__()
        if len(heads) != len(task_names):
            raise ValueError("one head per task is required")
        self.trunk = trunk
        self.heads = nn.ModuleList(heads)
        self.task_names = list(task_names)

    def features(self, x: Any) -> Tensor:
        return self.trunk(x)

    def forward_heads(self, z: Tensor) -> list[Tensor]:
        return [head(z) for head in self.heads]

    def forward(self, x: Any) -> list[Tensor]:
        return self.forward_heads(self.features(x))

    def trunk_task_parameters(self, index: int) -> list[nn.Parameter]:
        """Parameters inside the trunk that only task ``index`` uses (SegNet-MTAN's attention masks); none
        by default. They belong to that task, not to the shared set."""
        return []

    def shared_parameters(self) -> list[nn.Parameter]:
        """The parameters every task's output depends on: the trunk minus any task-specific trunk parameters.

        One definition for the gradient engine (per-task gradients), COST (adapters on the shared trunk
        only, paper Fig. 4) and PaLoRA; ``tests/unit/benchmarks/test_shared_parameters.py`` checks it against per-task
        autograd reachability on every benchmark's model."""
        own = {id(p) for i in range(len(self.heads)) for p in self.trunk_task_parameters(i)}
        return [p for p in self.trunk.parameters() if p.requires_grad and id(p) not in own]

    def task_parameters(self, index: int) -> list[nn.Parameter]:
        """Head ``index`` plus the trunk parameters only task ``index`` uses: they get the plain ∇L_index."""
        head = [p for p in self.heads[index].parameters() if p.requires_grad]
        return head + [p for p in self.trunk_task_parameters(index) if p.requires_grad]
