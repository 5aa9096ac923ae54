"""The verdict of a measurement against its claim (:func:`judge`), by the claim's rule:

* ``at_most`` / ``at_least`` a bound (a cost ratio, a count): *reproduced* when the whole 95 % interval of the
  mean is on the paper's side of the bound, *not reproduced* when the whole of it is on the other side,
  *within interval* when the bound lies inside it (with one value and no interval: the mean decides);
* ``equals`` a number (up to the paper's rounding, ``tolerance``): *reproduced* when the mean is within the
  tolerance, *within interval* when the paper's number is inside the 95 % interval, else *not reproduced*;
* ``gain`` over a baseline trained with the same seeds: *reproduced* when the interval of the difference
  (method − baseline, stratified bootstrap, :func:`mtlflow.metrics.intervals.compare`) excludes 0 on the paper's
  side, *within interval* when it holds 0 and the paper's difference, else *not reproduced*.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments.claims.model import Claim
from mtlflow.metrics.intervals import BETTER, INDISTINGUISHABLE, compare, mean_interval

REPRODUCED, WITHIN, NOT_REPRODUCED = "reproduced", "within interval", "not reproduced"


def _gain(claim: Claim, values: Sequence[float], baseline: Sequence[float] | None) -> dict[str, Any]:
    """The baseline's estimate, the difference to it and the verdict of a ``gain`` claim."""
    if baseline is None:
        raise InvalidParameterError(f"claim {claim.key}: a gain needs the baseline's values")
    target = claim.paper_value
    comparison = compare(values, baseline, claim.lower_is_better)
    out: dict[str, Any] = {"baseline": mean_interval(baseline).as_dict(), "difference": comparison.as_dict()}
    low, high = comparison.low, comparison.high
    if comparison.verdict == BETTER:
        out["verdict"] = REPRODUCED
    elif comparison.verdict == INDISTINGUISHABLE and (target is None or (low is not None and low <= target <= high)):
        out["verdict"] = WITHIN
    else:
        out["verdict"] = NOT_REPRODUCED
    return out


def _bound(claim: Claim, low: float, high: float) -> str:
    """The verdict of an ``at_most`` / ``at_least`` claim from the interval of the mean."""
    target = claim.paper_value
    if claim.rule == "at_most":
        on_side = (lambda v: v < target) if claim.strict else (lambda v: v <= target)
    else:
        on_side = (lambda v: v > target) if claim.strict else (lambda v: v >= target)
    if on_side(low) and on_side(high):
        return REPRODUCED
    if not on_side(low) and not on_side(high):
        return NOT_REPRODUCED
    return WITHIN


def judge(claim: Claim, values: Sequence[float], baseline: Sequence[float] | None = None) -> dict[str, Any]:
    """The measured estimate (and, for a gain, the difference to the baseline) and the verdict under the
    claim's rule (module docstring)."""
    estimate = mean_interval(values)
    out: dict[str, Any] = {"estimate": estimate.as_dict()}
    if claim.rule == "gain":
        return {**out, **_gain(claim, values, baseline)}
    target = claim.paper_value
    assert target is not None, f"claim {claim.key}: rule {claim.rule} needs the paper's value"
    mean, low, high = estimate.mean, estimate.low, estimate.high
    if low is None or high is None:
        low = high = mean
    if claim.rule == "equals":
        if abs(mean - target) <= claim.tolerance:
            out["verdict"] = REPRODUCED
        else:
            out["verdict"] = WITHIN if low <= target <= high else NOT_REPRODUCED
        return out
    out["verdict"] = _bound(claim, low, high)
    return out
