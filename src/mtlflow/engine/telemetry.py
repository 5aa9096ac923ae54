"""What training measures besides its metrics: one epoch's step telemetry (:class:`EpochTelemetry`), the
gradient cosines of a step, and the peak memory of the device.

The epoch record's telemetry fields (``metrics.json``, the Prometheus exporter) are computed here:
``train_loss``, ``steps``, timings, ``samples_per_second``, ``peak_memory_bytes`` and, when the steps
report them, the solver and engine times, the method's mean weights and the gradient conflicts.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since the last reset: CUDA allocator peak, or the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def cosines_to_mean(gram: Tensor) -> Tensor:
    """Cosine of every task gradient to the mean gradient, from the Gramian of the task gradients."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    mean_dot = gram.mean(dim=1)
    mean_norm = gram.mean().clamp_min(0).sqrt()
    return mean_dot / (norms * mean_norm).clamp_min(1e-30)


def jacobian_cosines_to_mean(grads: Tensor) -> Tensor:
    """Cosine of every row of ``grads [K, P]`` to their mean, in O(KP) (no K x K Gramian)."""
    mean = grads.mean(dim=0)
    return (grads @ mean) / (grads.norm(dim=1) * mean.norm()).clamp_min(1e-30)


class EpochTelemetry:
    """One epoch's step telemetry, from its creation (the epoch's start; the device's peak memory is reset)
    to :meth:`end_training`, summarised by :meth:`timing` and :meth:`step_statistics`.

    The sums stay on the training device in float64 and are read once, at the epoch's end: a per-step
    copy to the host would wait for the GPU on every step."""

    def __init__(self, n_tasks: int, device: torch.device):
        self.device = device
        self.started = time.perf_counter()
        self.train_seconds = 0.0
        #: optimizer steps recorded so far
        self.steps = 0
        self._step_times: list[float] = []
        self._solver_times: list[float] = []
        self._engine_times: list[float] = []
        self._loss_sums = torch.zeros(n_tasks, dtype=torch.float64, device=device)
        self._weight_sums: Tensor | None = None
        self._cos_sum = torch.zeros(n_tasks, dtype=torch.float64, device=device)
        self._conflict_count = torch.zeros((), dtype=torch.int64, device=device)
        self._cos_steps = 0
        reset_peak_memory(device)

    def add_step(self, info: Mapping[str, Any], seconds: float) -> None:
        """A step's telemetry (``Trainer.train_step``'s answer) and its wall-clock time."""
        self._step_times.append(seconds)
        self.steps += 1
        # a method's own step (custom_step) may report its losses on another device than the model's
        self._loss_sums.add_(info["losses"].detach().to(self.device))
        if "solver_seconds" in info:
            self._solver_times.append(info["solver_seconds"])
        if "engine_seconds" in info:
            self._engine_times.append(info["engine_seconds"])
        if "weights" in info:
            weights = info["weights"].detach().to(self.device)
            self._weight_sums = (weights.to(torch.float64, copy=True) if self._weight_sums is None
                                 else self._weight_sums.add_(weights))
        if "cosines" in info:
            cos = info["cosines"].detach().to(self.device)
            self._cos_sum.add_(cos)
            self._conflict_count.add_((cos < 0).any())
            self._cos_steps += 1

    def end_training(self) -> None:
        """The epoch's last step is done (evaluation counts in ``epoch_seconds``, not ``train_seconds``)."""
        self.train_seconds = time.perf_counter() - self.started

    def timing(self, task_names: Sequence[str], samples_per_step: int) -> dict[str, Any]:
        """The mean training losses, the step count, timings, throughput and the peak memory so far."""
        return {
            "train_loss": {name: float(v) for name, v in
                           zip(task_names, self._loss_sums.cpu() / max(self.steps, 1), strict=False)},
            "steps": self.steps,
            "train_seconds": self.train_seconds,
            "epoch_seconds": time.perf_counter() - self.started,
            "step_seconds_median": statistics.median(self._step_times) if self._step_times else 0.0,
            "samples_per_second": (self.steps * samples_per_step) / max(self.train_seconds, 1e-9),
            "peak_memory_bytes": peak_memory_bytes(self.device),
        }

    def step_statistics(self, task_names: Sequence[str]) -> dict[str, Any]:
        """What the steps reported beyond their losses: solver and engine times, weights, gradient conflicts."""
        out: dict[str, Any] = {}
        if self._solver_times:  # median over the steps that solved; per_step amortises over all steps
            out["solver_seconds_median"] = statistics.median(self._solver_times)
            out["solver_seconds_per_step"] = sum(self._solver_times) / self.steps
            out["weight_solves"] = len(self._solver_times)
        if self._engine_times:
            out["engine_seconds_median"] = statistics.median(self._engine_times)
        if self._weight_sums is not None:
            out["method_weights_mean"] = {name: float(v) for name, v in
                                          zip(task_names, self._weight_sums.cpu() / self.steps, strict=False)}
        if self._cos_steps:
            out["conflict_ratio"] = int(self._conflict_count) / self._cos_steps
            out["cosine_to_mean"] = {name: float(v) for name, v in
                                     zip(task_names, self._cos_sum.cpu() / self._cos_steps, strict=False)}
        return out
