"""Learning-rate schedules of the benchmarks' paper recipes, stepped once per epoch by the trainer.

* ``plateau`` -- ``ReduceLROnPlateau`` on a validation quantity (QM9 in Nash-MTL/FAMO/FairGrad/COST:
  factor 0.7, patience 5, min lr 1e-5, on the validation Δm%). ``monitor``: ``val_delta_m`` (Δm%
  against the benchmark's published single-task references, restricted to the trained tasks; the
  papers' choice) or ``val_loss`` (sum of the validation task losses).
* ``step`` -- ``StepLR`` (NYUv2/CityScapes: step_size 100, gamma 0.5).

``RunConfig.scheduler`` names the schedule and ``RunConfig.scheduler_options`` its options; the
state is checkpointed so a resumed run continues the schedule exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mtlflow.config.run import validate_scheduler
from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.scoring import delta_m


class EpochScheduler:
    """A torch LR scheduler stepped with the epoch's validation metrics."""

    def __init__(self, name: str, options: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                 references: Mapping[str, Mapping[str, float]] | None, specs: Mapping[str, Any]):
        validate_scheduler(name, options)
        self.name = name
        self.monitor = options.get("monitor", "val_loss") if name == "plateau" else None
        self.references, self.specs = references, specs
        if self.monitor == "val_delta_m" and not references:
            raise InvalidParameterError("scheduler monitor val_delta_m needs published single-task references for "
                                        "the trained tasks; this benchmark has none -- use monitor=val_loss")
        if name == "plateau":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=float(options.get("factor", 0.1)),
                patience=int(options.get("patience", 10)), min_lr=float(options.get("min_lr", 0.0)),
                threshold=float(options.get("threshold", 1e-4)))
        else:
            self.scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=int(options.get("step_size", 1)),
                                                             gamma=float(options.get("gamma", 0.1)))

    def value(self, val_metrics: Mapping[str, Mapping[str, float]]) -> float | None:
        """The monitored quantity of one epoch (None for schedules that do not monitor anything)."""
        if self.monitor == "val_loss":
            return float(sum(m["loss"] for m in val_metrics.values()))
        if self.monitor == "val_delta_m":
            return delta_m(val_metrics, self.references, self.specs)
        return None

    def step(self, val_metrics: Mapping[str, Mapping[str, float]]) -> float | None:
        value = self.value(val_metrics)
        if value is None:
            self.scheduler.step()
        else:
            self.scheduler.step(value)
        return value

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scheduler.load_state_dict(dict(state))


def build_scheduler(name: str, options: Mapping[str, Any], optimizer: torch.optim.Optimizer, bench,
                    task_names: Sequence[str], specs: Mapping[str, Any]) -> EpochScheduler | None:
    """The schedule of a run, or None for ``none``; Δm references are the benchmark's published ones."""
    if name == "none":
        validate_scheduler(name, options)
        return None
    published = bench.published_references()
    references = published.restricted(task_names) if published is not None else None
    return EpochScheduler(name, options, optimizer, references or None, specs)
