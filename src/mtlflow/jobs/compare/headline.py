"""Which metrics of each task the headline statistics average (Δm%, mean rank), by one stated rule.

By default each task's primary metric alone: the secondary metrics are shown in the tables but not averaged
into the headline, so a task does not weigh more for recording more metrics. A spec's
``comparison: {delta_m_metrics: all}`` averages every metric but the training loss instead. Hypervolume and the
Pareto sets always use the primary metric's error.

Δm% divides each metric's change by its single-task reference, so a reference near 0 turns noise into the
headline (a reference R² of -0.03 made one task's relative R² change 95 % of a Δm% of -10). A metric is never a
denominator (:data:`ILL_CONDITIONED_RULE`) when

* it is a coefficient of determination or a correlation (:data:`NEVER_DENOMINATORS`): values near 0 or below are
  ordinary. The task's error-type metric takes its place when the task records one (RMSE, else MAE: R² is
  1 - MSE / variance, so the squared error carries its information with a well-conditioned reference), else
  it is left out with a warning;
* its reference is within noise of 0: ``|mean| <= 2 x`` the sample standard deviation over the reference seeds
  (with at least 2 seeds), or below 0.01 for a score bounded to [0, 1] (a change against a 1-point score is
  magnified 100-fold): left out with a warning;
* its reference is 0 or undefined (NaN): left out (``delta_m_excluded``, as before).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the headline averages: each task's primary metric (the default) or every metric but the loss
HEADLINE_RULES = ("primary", "all")
#: metrics whose relative change is ill-conditioned by construction, with the error-type metrics (in order of
#: preference) that replace them in Δm% when the task records one
NEVER_DENOMINATORS = {"r2": ("rmse", "mae")}
#: a reference whose |mean| is at most this many of its seeds' standard deviations is within noise of 0
SPREAD_FACTOR = 2.0
#: a bounded [0, 1] score below this is too close to 0 to divide by, whatever its spread
UNIT_INTERVAL_FLOOR = 0.01
ILL_CONDITIONED_RULE = (f"a metric is never a denominator of Δm% when it is {', '.join(sorted(NEVER_DENOMINATORS))} "
                        f"(replaced by the task's {' or '.join(NEVER_DENOMINATORS['r2'])} when recorded) or its "
                        f"single-task reference is within noise of 0: |mean| <= {SPREAD_FACTOR:g} x its sample "
                        f"standard deviation over the reference seeds, or < {UNIT_INTERVAL_FLOOR:g} for a score "
                        f"bounded to [0, 1]")


@dataclass(frozen=True)
class HeadlineChoice:
    """Per task, the metrics Δm% averages (``metrics``), and why a requested metric left it (``notes``, one
    sentence each, for the warnings)."""

    metrics: dict[str, list[str]]
    notes: tuple[str, ...]


def requested_metrics(rule: str, tasks: Sequence[str], primary: Mapping[str, str],
                      recorded: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Per task, the metrics the headline rule asks for: the primary one, or every recorded one but the loss."""
    if rule not in HEADLINE_RULES:
        raise ValueError(f"unknown headline rule {rule!r}; valid: {', '.join(HEADLINE_RULES)}")
    if rule == "primary":
        return {t: [primary[t]] for t in tasks}
    return {t: [m for m in recorded[t] if m != "loss"] for t in tasks}


def _near_zero(value: float, spread: float | None, spec: Mapping[str, Any]) -> str | None:
    """Why a finite, non-zero reference is too close to 0 to divide by, or None."""
    if spread is not None and math.isfinite(spread) and abs(value) <= SPREAD_FACTOR * spread:
        return (f"its single-task reference {value:.4g} is within {SPREAD_FACTOR:g} x its seed standard deviation "
                f"({spread:.3g}) of 0")
    if spec.get("unit_interval") and abs(value) < UNIT_INTERVAL_FLOOR:
        return f"its single-task reference {value:.4g} is below {UNIT_INTERVAL_FLOOR:g} (a bounded score near 0)"
    return None


def _conditioned(value: float | None, spread: float | None, spec: Mapping[str, Any] | None) -> bool:
    """Whether a recorded reference value is a usable denominator: finite, not 0, not within noise of 0."""
    return (value is not None and spec is not None and math.isfinite(value) and value != 0
            and _near_zero(value, spread, spec) is None)


def delta_m_metrics(requested: Mapping[str, Sequence[str]], references: Mapping[str, Mapping[str, float]],
                    spreads: Mapping[str, Mapping[str, float]] | None, specs: Mapping[str, Mapping[str, Any]],
                    against: str) -> HeadlineChoice:
    """The metrics Δm% averages against ``references`` (``against`` names them in the notes): the requested ones
    that are well-conditioned denominators, an error-type metric in place of an R²; ``spreads`` the references'
    seed standard deviations (None: published references, no spread). A task without a reference is skipped; a
    reference of 0 or NaN is left out silently here (the degenerate-reference warning says so)."""
    chosen: dict[str, list[str]] = {}
    notes = []
    for task, names in requested.items():
        if task not in references:
            continue
        ref, spread = references[task], (spreads or {}).get(task, {})
        kept: list[str] = []
        for name in names:
            if name in NEVER_DENOMINATORS:
                substitute = next((m for m in NEVER_DENOMINATORS[name]
                                   if _conditioned(ref.get(m), spread.get(m), specs[task].get(m))), None)
                if substitute is None:
                    notes.append(f"{task}: {name} left out of Δm% ({against}): a relative change of {name} is "
                                 f"ill-conditioned (values near 0 are ordinary) and the task records no "
                                 f"{' or '.join(NEVER_DENOMINATORS[name])} to use instead")
                elif substitute not in names:
                    notes.append(f"{task}: {substitute} stands in for {name} in Δm% ({against}): a relative change "
                                 f"of {name} is ill-conditioned (values near 0 are ordinary)")
                    kept.append(substitute)
                else:
                    notes.append(f"{task}: {name} left out of Δm% ({against}): a relative change of {name} is "
                                 f"ill-conditioned; {substitute}, already averaged, carries its information")
                continue
            value = ref.get(name)
            if value is None or not math.isfinite(value) or value == 0:
                continue
            why = _near_zero(value, spread.get(name), specs[task][name])
            if why is not None:
                notes.append(f"{task}: {name} left out of Δm% ({against}): {why}, so its relative change is "
                             "ill-conditioned")
                continue
            kept.append(name)
        chosen[task] = list(dict.fromkeys(kept))
    return HeadlineChoice(metrics=chosen, notes=tuple(notes))
