"""The report's baseline rows (:attr:`~mtlflow.jobs.compare.summary.Summary.baselines`): in the results table,
marked as baselines, with their test metrics and nothing in the columns they take no part in (Δm%, mean rank,
hypervolume, Pareto); and the table of every method against every baseline, paired over the test examples."""

from __future__ import annotations

from mtlflow.jobs.compare.summary import Summary
from mtlflow.metrics.intervals import format_estimate

#: what a baseline's row says in the columns it takes no part in
NOT_SCORED = "–"
#: the mark of a baseline's row in the results table (its seeds column: fitted once)
MARK = "baseline (fitted once)"


def result_rows(summary: Summary, columns: int) -> list[list[str]]:
    """The baselines' rows of the results table (``columns`` cells each): the name, the mark and each task's
    primary metric (fitted once: no interval)."""
    rows = []
    for name, row in (summary.baselines or {}).items():
        cells = [name, MARK, *(f"{row.mean[t][summary.primary_metrics[t]]:.4f}" for t in summary.tasks)]
        rows.append(cells + [NOT_SCORED] * (columns - len(cells)))
    return rows


def comparison_table(summary: Summary) -> dict[str, list] | None:
    """Every method against every baseline, per task on its primary metric: both values, the paired difference of
    the per-example error over the test examples (the method minus the baseline, at the Bonferroni-corrected
    level), P(improvement) and the verdict -- or why there is no paired comparison: ``{"header", "rows"}``, None
    without baselines."""
    if not summary.baselines:
        return None
    header = ["method", "against", "on", "baseline", "method value [95 %]", "paired error difference [interval]",
              "P(improvement)", "verdict"]
    rows = []
    for name, baseline in summary.baselines.items():
        for method, paired in baseline.versus.items():
            row = summary.methods[method]
            for task in summary.tasks:
                metric = summary.primary_metrics[task]
                cells = [method, name, f"{task} {metric}", f"{baseline.mean[task][metric]:.4f}",
                         format_estimate(row.intervals[task][metric])]
                if paired.available:
                    d = paired.tasks[task]
                    cells += [f"{d.mean_difference:+.4f} [{d.low:+.4f}, {d.high:+.4f}] ({d.statistic}, "
                              f"{100 * d.confidence:g} %)", f"{d.probability_of_improvement:.2f}", d.verdict]
                else:
                    cells += [NOT_SCORED, NOT_SCORED, paired.verdict]
                rows.append(cells)
    return {"header": header, "rows": rows}
