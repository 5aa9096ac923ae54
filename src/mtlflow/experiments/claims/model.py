"""What a claim is: :class:`Claim` (the paper's number, the rule that judges it, a :class:`Scale` per scale) and
the :class:`SeedwiseRunner` that measures it, one seed at a time, in a :class:`RunContext`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES = ("paper", "ci")
RULES = ("at_most", "at_least", "equals", "gain")


@dataclass
class RunContext:
    """Where a runner may write intermediate runs, its device and whether it prints progress."""

    work_dir: Path
    device: str = "cpu"
    progress: bool = True
    data_options: Mapping[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        if self.progress:
            print(f"reproduce: {text}", flush=True)


#: one seed's runs: ``(config, seed, ctx) -> part`` (JSON: a pipeline task's output artifact)
MeasureSeed = Callable[[Mapping[str, Any], int, RunContext], dict[str, Any]]
#: every seed's parts, in seed order: ``(config, parts, ctx) -> {values, baseline?, details}``
CombineSeeds = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], RunContext], dict[str, Any]]


@dataclass(frozen=True)
class SeedwiseRunner:
    """A runner in two steps, so that each seed can run as a task of its own (the ``reproduce`` pipeline's loop):
    ``measure(config, seed, ctx)`` runs one seed and returns its part, and ``combine(config, parts, ctx)`` turns
    the parts of every seed, in seed order, into ``{values, baseline?, details}``. A seed's value never depends on
    another seed's runs except where ``combine`` says so (Δm%'s references are the mean over every seed's
    single-task runs), so the seeds can run anywhere: one after the other in `mtlflow reproduce`, a task each in
    the pipeline."""

    measure: MeasureSeed
    combine: CombineSeeds


@dataclass(frozen=True)
class Scale:
    """One scale of a claim: what it runs, in words, and the runner's configuration."""

    description: str
    config: Mapping[str, Any]
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class Claim:
    """One headline claim: the paper's number and where it is printed, the rule that judges a measurement
    against it, the runner that measures it and its configuration at each scale."""

    key: str
    paper: str
    source: str            # table / figure / section of the paper
    statement: str
    paper_text: str        # the paper's number as printed
    paper_value: float | None  # the bound, the number, or the claimed difference (gain); None: qualitative
    metric: str            # what one seed's value is
    rule: str
    lower_is_better: bool
    runner: SeedwiseRunner
    scales: Mapping[str, Scale]
    data: str | None = None  # data the project cannot ship: what it is and the option that points at it
    tolerance: float = 0.0
    if_not: str = ""       # the likely reason when the verdict is not "reproduced"
    no_seeds: str = ""     # why a claim has one value (a deterministic count), if it has
    strict: bool = False   # at_most / at_least: the bound itself is on the wrong side (ρ < 0, not ρ ≤ 0)

    def command(self, scale: str) -> str:
        return f"mtlflow reproduce {self.key} --scale {scale}"
