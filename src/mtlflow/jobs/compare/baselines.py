"""The baselines of a comparison: the run-like directories of :mod:`mtlflow.jobs.baselines` (``run.json`` with
``kind: baseline``) as yardsticks beside the methods' rows.

A baseline is fitted once (no seeds) and takes no part in Δm%, mean rank, hypervolume or the Pareto sets. Its
row holds its metrics on the compared split and, against every method, the paired comparison over the shared
test examples (:func:`~mtlflow.jobs.compare.paired.paired_versus`: the method minus the baseline, so negative means
the method makes fewer errors; per task at the Bonferroni-corrected level, 95 % over the tasks together). From
those come two warnings: a method that is not better than the trivial baseline on a task ("learned nothing"),
and a classical per-task model (hgb, linear) that beats every method on a task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.jobs.compare.loading import LoadedRun
from mtlflow.jobs.compare.paired import MethodExamples, method_examples, paired_versus
from mtlflow.jobs.compare.rows import Setting
from mtlflow.jobs.compare.summary import BaselineRow, MethodRow, Paired

#: the ``kind`` of a baseline's run.json
BASELINE_KIND = "baseline"
TRIVIAL = "trivial"
#: the baselines that are classical per-task models
CLASSICAL = ("hgb", "linear")


def is_baseline(run: Mapping[str, Any]) -> bool:
    """Whether a run record (``run.json``) is a baseline's."""
    return run.get("kind") == BASELINE_KIND


def split_baselines(runs: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """:func:`~mtlflow.engine.rundir.read_run` records as (trained runs, baselines)."""
    return [r for r in runs if not is_baseline(r["run"])], [r for r in runs if is_baseline(r["run"])]


def _sweep_tasks(loaded: LoadedRun, tasks: Sequence[str]) -> LoadedRun:
    """A baseline (fitted on every task of the data) restricted to the sweep's tasks: its per-example errors and
    test set then pair with the methods' (which name only the tasks they trained)."""
    if loaded.examples is None:
        return loaded
    test_set = dataclasses.replace(loaded.examples.test_set,
                                   statistics={t: loaded.examples.test_set.statistics[t] for t in tasks})
    examples = dataclasses.replace(loaded.examples, test_set=test_set,
                                   errors={t: loaded.examples.errors[t] for t in tasks})
    return dataclasses.replace(loaded, examples=examples)


def check_baselines(baselines: Sequence[LoadedRun], first: LoadedRun, tasks: Sequence[str]) -> None:
    """Baselines of the runs' benchmark and data version, one per kind, each with every compared task."""
    kinds: dict[str, str] = {}
    for b in baselines:
        if b.run["benchmark"] != first.run["benchmark"]:
            raise InvalidParameterError(f"baseline {b.dir} is of benchmark {b.run['benchmark']!r}, the runs of "
                                        f"{first.run['benchmark']!r}; give the baselines of the compared data")
        if b.run["data_hash"] != first.run["data_hash"]:
            raise DataError(f"baseline {b.dir} was fitted on another data version than the runs; fit it on the "
                            "runs' prepared data (mtlflow baseline --data DIR)")
        absent = [t for t in tasks if t not in b.tasks]
        if absent:
            raise DataError(f"baseline {b.dir} has no task {', '.join(absent)}; fit it on the runs' prepared data")
        kind = b.run["baseline"]["kind"]
        if kind in kinds:
            raise InvalidParameterError(f"baselines {kinds[kind]} and {b.dir} are both {kind}; give each kind once")
        kinds[kind] = b.dir


def baseline_rows(baselines: Sequence[LoadedRun], groups: Mapping[str, Sequence[LoadedRun]],
                  setting: Setting) -> dict[str, BaselineRow]:
    """Each baseline's row (by its method name, ``baseline-<kind>``, sorted): its metrics on the split and its
    paired comparison with every method (the method minus the baseline)."""
    tasks = setting.tasks
    examples: dict[str, MethodExamples] = {m: method_examples(m, group, tasks) for m, group in groups.items()}
    rows = {}
    for b in sorted(baselines, key=lambda b: b.label):
        examples[b.label] = method_examples(b.label, [_sweep_tasks(b, tasks)], tasks)
        mean = {t: dict(b.final(setting.split)[t]) for t in tasks}
        rows[b.label] = BaselineRow(
            method=b.label, kind=b.run["baseline"]["kind"], run=b.dir,
            fitted={t: b.run["baseline"]["tasks"][t] for t in tasks}, mean=mean,
            primary_errors=setting.errors(mean),
            versus={m: paired_versus(m, b.label, examples, setting.specs, setting.primary) for m in sorted(groups)})
    return rows


def _task_entry(row: MethodRow | BaselineRow, paired: Paired, task: str, metric: str) -> str:
    d = paired.tasks[task]
    return (f"{row.method}: {metric} {row.mean[task][metric]:.4f}, paired {d.statistic} difference "
            f"{d.mean_difference:+.4f} [{d.low:+.4f}, {d.high:+.4f}]")


def _learned_nothing(trivial: BaselineRow, rows: Mapping[str, MethodRow], setting: Setting) -> list[str]:
    warnings = []
    for task in setting.tasks:
        metric = setting.primary[task]
        idle = [m for m in sorted(rows) if trivial.versus[m].available
                and trivial.versus[m].tasks[task].verdict != "better"]
        if not idle:
            continue
        entries = "; ".join(_task_entry(rows[m], trivial.versus[m], task, metric) for m in idle)
        warnings.append(f"learned nothing: {', '.join(idle)} {'is' if len(idle) == 1 else 'are'} not better than the "
                        f"trivial baseline ({metric} {trivial.mean[task][metric]:.4f}) on {task} with 95 % confidence "
                        f"({entries}; per task at {100 * trivial.versus[idle[0]].task_confidence:g} %, Bonferroni "
                        "over the tasks)")
    return warnings


def _classical_wins(classical: Sequence[BaselineRow], rows: Mapping[str, MethodRow], setting: Setting) -> list[str]:
    warnings = []
    for task in setting.tasks:
        metric = setting.primary[task]
        winners = [b for b in classical
                   if all(b.versus[m].available and b.versus[m].tasks[task].verdict == "worse" for m in rows)]
        if not winners:
            continue
        lower = not setting.specs[task][metric]["higher_is_better"]
        best = min(rows.values(), key=lambda r: r.mean[task][metric] * (1 if lower else -1))
        models = ", ".join(f"{b.kind} {metric} {b.mean[task][metric]:.4f}" for b in winners)
        warnings.append(f"a classical per-task model ({models}) beats every multi-task method on {task} (best "
                        f"method {best.method}: {metric} {best.mean[task][metric]:.4f}); every method's paired "
                        f"{winners[0].versus[best.method].tasks[task].statistic} difference against it lies above 0 "
                        f"with 95 % confidence")
    return warnings


def _unpaired(baselines: Mapping[str, BaselineRow]) -> list[str]:
    missing = sorted({f"{m} ({p.verdict})" for b in baselines.values() for m, p in b.versus.items()
                      if not p.available})
    if not missing:
        return []
    return [f"no paired comparison with the baselines for {', '.join(missing)}: whether these methods learned "
            "anything is not checked (evaluate their runs with per-example values)"]


def baseline_warnings(baselines: Mapping[str, BaselineRow], rows: Mapping[str, MethodRow],
                      setting: Setting) -> list[str]:
    """"learned nothing" per task where a method is not better than the trivial baseline, a classical model that
    beats every method on a task, and the methods no baseline could be paired with."""
    trivial = [b for b in baselines.values() if b.kind == TRIVIAL]
    classical = [b for b in baselines.values() if b.kind in CLASSICAL]
    return [*(_learned_nothing(trivial[0], rows, setting) if trivial else []),
            *_classical_wins(classical, rows, setting), *_unpaired(baselines)]
