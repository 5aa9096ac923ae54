"""The typed comparison of a sweep (:class:`Summary`) and its JSON form, ``results.json``.

Every reader (the report, the Kubeflow step, the DVC stages, the README's demo table) reads these frozen records
by attribute, so a field that does not exist is an ``AttributeError`` (a template's, Jinja2's ``UndefinedError``)
rather than a silent ``None``. :func:`to_json` writes exactly the keys, order and values ``results.json`` has
always had (schema 2); :func:`from_json` reads them back, refusing a file that lacks a field.

How a field maps to JSON is said in its metadata:

* ``OMIT``: the key is left out when the value is None (a row without references has no ``delta_task``); a field
  without it is written as ``null``;
* ``flatten(prefix)``: a nested record whose fields are written into the parent under ``prefix + suffix``
  (its fields' ``suffix`` metadata, ``""`` by default), all of them left out when it is None: ``DeltaM`` under
  ``delta_m`` is the row's ``delta_m``, ``delta_m_std``, ``delta_m_per_seed`` and ``delta_m_interval``.

Adding a statistic is adding a field in the place its key takes in the JSON (a new Δm% variant: one more
``DeltaM`` field flattened under its own prefix).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtlflow.core import atomic
from mtlflow.core.errors import DataError
from mtlflow.metrics.intervals import Comparison, Estimate
from mtlflow.metrics.paired import PairedDifference

#: results.json's layout version
SCHEMA = 2
OMIT = {"omit_none": True}


def flatten(prefix: str) -> dict[str, Any]:
    return {"flatten": prefix}


def suffix(text: str) -> dict[str, Any]:
    return {"suffix": text}


MetricTable = dict[str, dict[str, float]]  # task -> metric -> value


@dataclass(frozen=True)
class SeedComparison:
    """One method against another over seeds (:func:`mtlflow.metrics.intervals.compare`): the difference of
    the means (this method minus the other) with its 95 % interval, P(improvement), the verdict and the two
    numbers of seeds."""

    difference: float
    low: float | None
    high: float | None
    probability_of_improvement: float
    verdict: str
    n: tuple[int, int]

    @classmethod
    def of(cls, comparison: Comparison) -> SeedComparison:
        return cls(comparison.difference, comparison.low, comparison.high, comparison.probability_of_improvement,
                   comparison.verdict, (comparison.n_first, comparison.n_second))

    def estimate(self) -> Estimate:
        """The difference as an estimate over the smaller number of seeds (what the report prints)."""
        return Estimate(self.difference, self.low, self.high, min(self.n))


@dataclass(frozen=True, kw_only=True)
class Paired:
    """The paired comparison over the shared test examples (:func:`mtlflow.metrics.paired.compare_methods`),
    or, ``available`` false, why there is none (``verdict`` in short, ``reason`` in full)."""

    available: bool
    verdict: str | None = field(default=None, metadata=OMIT)
    reason: str | None = field(default=None, metadata=OMIT)
    confidence: float | None = field(default=None, metadata=OMIT)
    task_confidence: float | None = field(default=None, metadata=OMIT)
    n: int | None = field(default=None, metadata=OMIT)
    combined: PairedDifference | None = field(default=None, metadata=OMIT)
    #: why an available comparison has no mean over tasks (``combined`` None: the tasks' errors differ in unit)
    combined_note: str | None = field(default=None, metadata=OMIT)
    tasks: dict[str, PairedDifference] | None = field(default=None, metadata=OMIT)
    statistics: dict[str, str] | None = field(default=None, metadata=OMIT)
    seeds: tuple[int, int] | None = field(default=None, metadata=OMIT)

    @property
    def short_verdict(self) -> str:
        """The verdict on the mean over tasks, or why there is no paired comparison or no mean over tasks."""
        if not self.available:
            return self.verdict
        return self.combined.verdict if self.combined is not None else self.combined_note


@dataclass(frozen=True, kw_only=True)
class Versus:
    """A method against LS or the best method: each task's primary metric, Δm% (with references) and the
    paired comparison."""

    tasks: dict[str, SeedComparison]
    delta_m: SeedComparison | None = field(default=None, metadata=OMIT)
    paired: Paired | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True)
class DeltaM:
    """A method's Δm% over seeds: the mean, the seeds' standard deviation, each seed's value, the interval."""

    mean: float
    std: float = field(metadata=suffix("_std"))
    per_seed: tuple[float, ...] = field(metadata=suffix("_per_seed"))
    interval: Estimate = field(metadata=suffix("_interval"))


@dataclass(frozen=True)
class MeanRank:
    """A method's mean rank over the declared method set and its 95 % interval (None with one seed)."""

    mean: float
    interval: tuple[float, float] | None = field(metadata=suffix("_interval"))


@dataclass(frozen=True)
class PreferenceFront:
    """A Pareto-front method's front over seeds (:func:`mtlflow.pareto.front.aggregate_fronts`) and the
    single-point methods it dominates."""

    preferences: tuple[tuple[float, ...], ...]
    reference_point: tuple[float, ...]
    split: str
    errors: tuple[tuple[float, ...], ...]
    metrics: tuple[MetricTable, ...]
    pareto_mask: tuple[bool, ...]
    non_dominated: int
    spearman: dict[str, float | None]
    hypervolume: float
    hypervolume_per_seed: tuple[float, ...]
    hypervolume_seed_mean: float
    hypervolume_seed_std: float
    dominates: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MethodRow:
    """One method over its seeds: every metric's mean, standard deviation and interval, the primary errors,
    hypervolume, cost, Δm% (own and paper references), mean rank, Pareto membership and the comparisons
    (``versus``: ``"ls"`` and ``"best"``)."""

    method: str
    seeds: tuple[int, ...]
    runs: tuple[str, ...]
    selection: tuple[str, ...]
    mean: MetricTable
    std: MetricTable
    intervals: dict[str, dict[str, Estimate]]
    primary_errors: tuple[float, ...]
    primary_errors_per_seed: tuple[tuple[float, ...], ...]
    hypervolume: float
    hypervolume_interval: Estimate
    hypervolume_per_seed: tuple[float, ...]
    hypervolume_raw: float
    step_seconds_median: float
    peak_memory_bytes: int
    not_converged: tuple[str, ...]
    delta_m: DeltaM | None = field(default=None, metadata=flatten("delta_m"))
    delta_task: dict[str, Estimate] | None = field(default=None, metadata=OMIT)
    delta_m_paper: DeltaM | None = field(default=None, metadata=flatten("delta_m_paper"))
    mean_rank: MeanRank | None = field(default=None, metadata=flatten("mean_rank"))
    pareto_optimal: bool
    pareto_confident: bool
    preference_front: PreferenceFront | None = field(default=None, metadata=OMIT)
    versus: dict[str, Versus]


@dataclass(frozen=True)
class ReferenceSource:
    run: str
    task: str
    seed: int
    selection: str


@dataclass(frozen=True)
class References:
    """Single-task reference metrics: per task the mean over seeds (what Δm% divides by) and its interval."""

    split: str
    data_hash: str | None
    metrics: MetricTable
    intervals: dict[str, dict[str, Estimate]]
    metric_specs: dict[str, dict[str, dict[str, Any]]]
    sources: tuple[ReferenceSource, ...]


@dataclass(frozen=True)
class PaperReferences:
    """The single-task values a benchmark's papers publish (``Benchmark.published_references``)."""

    label: str
    source: str
    note: str | None
    metrics: MetricTable


@dataclass(frozen=True)
class HypervolumeNormalisation:
    scale: tuple[float, ...]
    reference_point: tuple[float, ...]
    definition: str


@dataclass(frozen=True)
class DeltaMExcluded:
    """Per task, the metrics Δm% leaves out (reference 0 or undefined), against each kind of reference."""

    references: dict[str, tuple[str, ...]]
    paper_references: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class StatisticsRule:
    """How every interval and comparison of the summary is computed."""

    confidence: float
    n_resamples: int
    bootstrap_seed: int
    interval: str
    paired: str


@dataclass(frozen=True)
class HeadlineRule:
    """Which metrics the headline statistics average (:mod:`mtlflow.jobs.compare.headline`): the rule
    (``primary`` or ``all``), per task the metrics of Δm% against the own and the published references and of
    the mean rank, and the rule that keeps an ill-conditioned metric out of every denominator."""

    rule: str
    delta_m_metrics: dict[str, tuple[str, ...]]
    delta_m_paper_metrics: dict[str, tuple[str, ...]]
    mean_rank_metrics: dict[str, tuple[str, ...]]
    ill_conditioned: str


@dataclass(frozen=True, kw_only=True)
class BaselineRow:
    """A baseline of the sweep (:mod:`mtlflow.jobs.baselines`), a yardstick in no Δm%, mean rank, hypervolume or
    Pareto set: its kind and directory, what it fitted per task, its metrics on the split (fitted once: no seeds),
    each task's primary error, and per method the paired comparison over the shared test examples (``versus``:
    the method minus the baseline, negative = the method makes fewer errors)."""

    method: str
    kind: str
    run: str
    fitted: dict[str, Any]
    mean: MetricTable
    primary_errors: tuple[float, ...]
    versus: dict[str, Paired]


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The comparison of a sweep's runs (``results.json``); see docs/guides/reading-the-report.md."""

    schema: int
    benchmark: str
    dataset: str
    data_hash: str
    split: str
    tasks: tuple[str, ...]
    metric_specs: dict[str, dict[str, dict[str, Any]]]
    primary_metrics: dict[str, str]
    hypervolume_reference_point: tuple[float, ...]
    hypervolume_objective: str
    hypervolume_normalised: HypervolumeNormalisation
    hypervolume_all_methods: float
    pareto_set: tuple[str, ...]
    pareto_set_confident: tuple[str, ...]
    preference_front_methods: tuple[str, ...]
    mean_rank_method_set: tuple[str, ...]
    selection_rules: tuple[str, ...]
    references: References | None
    paper_references: PaperReferences | None
    delta_m_excluded: DeltaMExcluded
    statistics: StatisticsRule
    baseline: str | None
    best_method: str
    best_by: str
    methods: dict[str, MethodRow]
    baselines: dict[str, BaselineRow] | None = field(default=None, metadata=OMIT)  # None: no baseline compared
    warnings: tuple[str, ...]
    #: None in a results.json written before the headline rule (every metric averaged)
    headline: HeadlineRule | None = field(default=None, metadata=OMIT)

    def primary_spec(self, task: str) -> dict[str, Any]:
        """The metric spec of ``task``'s primary metric."""
        return self.metric_specs[task][self.primary_metrics[task]]


def to_json(value: Any) -> Any:
    """The JSON form of a summary record (or any value inside one): records as objects in field order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        _write_fields(value, out, "")
        return out
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _write_fields(record: Any, out: dict[str, Any], prefix: str) -> None:
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if "flatten" in f.metadata:
            if value is not None:
                _write_fields(value, out, f.metadata["flatten"])
            continue
        if value is None and f.metadata.get("omit_none"):
            continue
        out[prefix + f.metadata.get("suffix", "") if prefix else f.name] = to_json(value)


def from_json(kind: type, data: Any, where: str = "results.json") -> Any:
    """``data`` (JSON values) as ``kind``, a summary record or a type its fields use; a record lacking a field
    is a DataError naming it."""
    return _parse(kind, data, where)


def _parse(kind: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _parse(inner, data, where)
    if dataclasses.is_dataclass(kind):
        return kind(**_record_fields(kind, data, "", where))
    if origin is tuple:
        inner = args[0] if args[-1] is Ellipsis else None
        return tuple(_parse(inner or args[i], v, where) for i, v in enumerate(data))
    if origin in (dict, Mapping):
        return {k: _parse(args[1], v, f"{where}.{k}") for k, v in data.items()}
    return data  # str, int, float, bool, Any: as JSON has them (an int stays an int)


def _record_fields(kind: type, data: Mapping[str, Any], prefix: str, where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise DataError(f"{where} is not an object; re-run `mtlflow aggregate`")
    hints = typing.get_type_hints(kind)
    values = {}
    for f in dataclasses.fields(kind):
        if "flatten" in f.metadata:
            nested = f.metadata["flatten"]
            if nested in data:
                (inner,) = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
                values[f.name] = inner(**_record_fields(inner, data, nested, where))
            continue
        key = prefix + f.metadata.get("suffix", "") if prefix else f.name
        if key in data:
            values[f.name] = _parse(hints[f.name], data[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DataError(f"{where} lacks {key!r} (written by another mtlflow version); re-run `mtlflow aggregate`")
    return values


def read_summary(path: str | Path) -> Summary:
    """A results.json file as a :class:`Summary`."""
    return from_json(Summary, atomic.read_json(path, "aggregate results"), str(path))
