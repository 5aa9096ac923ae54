"""Aggregate outputs: results.json, a Markdown and a CSV table, the comparison figure, learning curves and an
HTML report (one self-contained file for the Kubeflow UI) rendered from the Jinja2 templates in
``templates/``.

Every number of a method is a mean over seeds with its 95 % interval (``mean [low, high]``; one seed: "1 seed:
no interval"); the verdict box on top says what won, by how much, with what confidence, and what to be wary
of (:func:`verdict_box`). One colour per method in every figure (:func:`method_colours`).
"""

from __future__ import annotations

import base64
import csv
import io
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.core import atomic
from mtlflow.engine.rundir import run_label
from mtlflow.jobs import report_baselines
from mtlflow.jobs.compare.summary import MethodRow, Paired, References, Summary, Versus, to_json
from mtlflow.metrics.intervals import BETTER, INDISTINGUISHABLE, NO_INTERVAL, WORSE, format_estimate
from mtlflow.metrics.task import metric_error
from mtlflow.pareto.front import front_tables

TEMPLATES = Path(__file__).parent / "templates"


def _fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def method_colours(labels: Sequence[str]) -> dict[str, str]:
    """One colour per method, the same in every figure of a report: the methods in sorted order take the
    colours of matplotlib's tab10 (tab20 beyond 10 methods) in turn."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    ordered = sorted(set(labels))
    cmap = colormaps["tab10" if len(ordered) <= 10 else "tab20"]
    return {label: to_hex(cmap(i % cmap.N)) for i, label in enumerate(ordered)}


def unit_note(summary: Summary, task: str) -> str:
    """What a task's primary metric is measured in: a bounded score, or the target's own units."""
    spec = summary.primary_spec(task)
    if spec.get("unit"):
        return str(spec["unit"])
    return "0-1" if spec["unit_interval"] else "target's units"


def _arrow(summary: Summary, task: str) -> str:
    return "↑" if summary.primary_spec(task)["higher_is_better"] else "↓"


def _pareto_cell(row: MethodRow) -> str:
    if row.pareto_optimal:
        return "yes"
    return "within 95 %" if row.pareto_confident else ""


def _rank_cell(row: MethodRow) -> str:
    if row.mean_rank is None:
        return "–"
    interval = row.mean_rank.interval
    if interval is None:
        return f"{row.mean_rank.mean:.2f} (no interval)"
    return f"{row.mean_rank.mean:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _order(summary: Summary) -> list[tuple[str, MethodRow]]:
    """Methods best first: by Δm% when references exist, else by mean rank."""
    def key(item: tuple[str, MethodRow]) -> tuple:
        row = item[1]
        delta_m = row.delta_m.mean if row.delta_m is not None else 0.0
        rank = (row.mean_rank.mean if row.mean_rank is not None else None) or 0.0
        return (delta_m != delta_m, delta_m, rank, item[0])  # an undefined (NaN) Δm% last

    return sorted(summary.methods.items(), key=key)


def table_rows(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """The results table: raw per-task values (with their units), Δm%, the verdict against LS, mean rank,
    normalised hypervolume, Pareto membership; each number ``mean [95 % interval]`` over seeds."""
    tasks, primary = summary.tasks, summary.primary_metrics
    header = ["method", "seeds"] + [f"{t} {primary[t]} ({unit_note(summary, t)}) {_arrow(summary, t)}"
                                    for t in tasks]
    has_dm = summary.best_by == "delta_m"  # references whose metrics are all ill-conditioned give no Δm%
    paper = summary.paper_references
    if has_dm:
        header.append("Δm% (own STL) ↓" if paper else "Δm% ↓")
    if paper:
        header.append(f"Δm% ({paper.label}) ↓")
    baseline = summary.baseline
    if baseline:
        header.append(f"vs {baseline}")
    header += ["MR ↓", "HV (normalised) ↑", "Pareto (95 %)", STEP_TIME_COLUMN]
    rows = []
    for label, row in _order(summary):
        cells = [label, str(len(row.seeds))]
        cells += [format_estimate(row.intervals[t][primary[t]]) for t in tasks]
        if has_dm:
            cells.append(format_estimate(row.delta_m.interval, 2, signed=True))
        if paper:
            cells.append(format_estimate(row.delta_m_paper.interval, 2, signed=True))
        if baseline:
            cells.append(_versus_cell(row.versus.get("ls"), tasks) if label != baseline else "baseline")
        cells += [_rank_cell(row), format_estimate(row.hypervolume_interval), _pareto_cell(row),
                  f"{row.step_seconds_median:.4f}"]
        rows.append(cells)
    rows += report_baselines.result_rows(summary, len(header))  # yardsticks, marked: after the methods
    return header, rows


def _versus_cell(comparison: Versus | None, tasks: Sequence[str]) -> str:
    """The verdict of a comparison in one cell: on Δm% when it exists, else per task."""
    if comparison is None:
        return "–"
    if comparison.delta_m is not None:
        return comparison.delta_m.verdict
    return "; ".join(f"{t}: {comparison.tasks[t].verdict}" for t in tasks)


def comparison_rows(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """Each method against LS and against the best method: the difference of means (this method minus the
    other) with its 95 % interval over seeds, the probability of improvement and the verdict, on Δm% when
    references exist and on every task's primary metric; beside them the paired comparison over the shared
    test examples (the per-example error, averaged over each method's seeds, this method minus the other):
    per task at the Bonferroni-corrected level, and on its own row the mean over tasks at 95 % -- or why there
    is none."""
    tasks, primary = summary.tasks, summary.primary_metrics
    header = ["method", "against", "on", "difference [95 %]", "P(improvement)", "verdict",
              *PAIRED_COLUMNS]
    rows = []
    for label, row in _order(summary):
        for role, versus in row.versus.items():
            other = summary.baseline if role == "ls" else summary.best_method
            against = f"{other} ({'baseline' if role == 'ls' else 'best'})"
            paired = versus.paired
            measures = ([("Δm%", versus.delta_m, 2, None)] if versus.delta_m is not None else []) + [
                (f"{t} {primary[t]}", versus.tasks[t], 4, t) for t in tasks]
            for name, c, digits, task in measures:
                rows.append([label, against, name, format_estimate(c.estimate(), digits, signed=True),
                             f"{c.probability_of_improvement:.2f}", c.verdict,
                             *_paired_cells(paired, task, name != "Δm%")])
            if paired and paired.available and paired.combined is not None:  # none for errors in different units
                rows.append([label, against, PAIRED_COMBINED_ROW, "–", "–", "–",
                             *_paired_cells(paired, None, True)])
    return header, rows


#: the comparison table's paired columns and the row of the paired mean over tasks
PAIRED_COLUMNS = ("paired Δ error [95 %]", "paired P(improvement)", "paired verdict")
PAIRED_COMBINED_ROW = "all tasks: mean error (paired)"


def _paired_cells(paired: Paired | None, task: str | None, shown: bool) -> list[str]:
    """The paired columns of one row: the task's paired difference (``task``) or the mean over tasks
    (``None``); why there is none when the comparison has none; empty where the row has no paired counterpart
    (Δm%)."""
    if not shown:
        return ["", "", ""]
    if paired is None:  # a summary written before paired comparisons
        return ["–", "–", "–"]
    if not paired.available:
        return ["–", "–", paired.verdict]
    d = paired.tasks[task] if task is not None else paired.combined
    estimate = {"mean": d.mean_difference, "low": d.low, "high": d.high, "n": d.n}
    return [f"{format_estimate(estimate, 4, signed=True)} ({100 * d.confidence:g} %, n={d.n})",
            f"{d.probability_of_improvement:.2f}", d.verdict]


def delta_rows(summary: Summary) -> tuple[list[str], list[list[str]]] | None:
    """Per-task Δ% against the single-task references (positive = worse than single-task; no units), or
    None without references."""
    if summary.references is None:
        return None
    tasks, primary = summary.tasks, summary.primary_metrics
    header = ["method"] + [f"{t} Δ% ({primary[t]}) ↓" for t in tasks]
    rows = [[label] + [format_estimate((row.delta_task or {}).get(t), 2, signed=True) for t in tasks]
            for label, row in _order(summary)]
    return header, rows


def _verdicts(versus: Versus, by_delta_m: bool) -> list[str]:
    return [versus.delta_m.verdict] if by_delta_m else [v.verdict for v in versus.tasks.values()]


def _headline(summary: Summary, by_verdict: Mapping[str, list[str]], by_delta_m: bool, on: str) -> str:
    """The verdict box's first line: the winner only when some method is worse than it at 95 %; otherwise, first,
    that no method is distinguishable (from LS when no method differs from LS either), then the lowest value."""
    rows, best = summary.methods, summary.best_method
    best_row = rows[best]
    seeds = f"over {len(best_row.seeds)} seed(s)"
    if by_delta_m:
        lowest = (f"{best} has the lowest Δm%: {format_estimate(best_row.delta_m.interval, 2, signed=True)} "
                  "against the single-task references")
    else:
        lowest = (f"{best} has the lowest mean rank: {_rank_cell(best_row)} over {len(summary.mean_rank_method_set)} "
                  "methods (no single-task references: Δm% not computed)")
    if len(rows) == 1 or by_verdict[WORSE] or by_verdict[BETTER]:
        return f"{lowest} ({seeds}; lower is better)."
    if not by_verdict[INDISTINGUISHABLE]:  # no comparison has an interval
        return f"No method can be told apart from another: 1 seed gives no interval. {lowest}, without a verdict."
    baseline, anchor = summary.baseline, best
    if baseline and all(set(_verdicts(rows[m].versus["ls"], by_delta_m)) == {INDISTINGUISHABLE}
                        for m in rows if m != baseline):
        anchor = baseline
    return (f"No method is distinguishable from {anchor} at 95 % ({on}, {seeds}). {lowest} (lower is better), "
            "not shown better than any other method.")


def verdict_box(summary: Summary) -> dict[str, Any]:
    """What a reader needs first: ``headline`` (what won and by how much, or that no method is distinguishable),
    ``findings`` (which differences are real at 95 %), ``confident`` (the winner beats every other method with
    confidence) and ``warnings``."""
    rows, best, baseline = summary.methods, summary.best_method, summary.baseline
    best_row = rows[best]
    findings: list[str] = []
    by_delta_m = summary.best_by == "delta_m"
    by_verdict: dict[str, list[str]] = {BETTER: [], WORSE: [], INDISTINGUISHABLE: []}
    for label, row in sorted(rows.items()):
        versus = row.versus.get("best")
        if versus is None:
            continue
        verdicts = _verdicts(versus, by_delta_m)
        if all(v == WORSE for v in verdicts):
            by_verdict[WORSE].append(label)
        elif any(v == BETTER for v in verdicts):
            by_verdict[BETTER].append(label)
        elif any(v == INDISTINGUISHABLE for v in verdicts) or any(v == WORSE for v in verdicts):
            by_verdict[INDISTINGUISHABLE].append(label)
    on = "Δm%" if by_delta_m else "every task's primary metric"
    headline = _headline(summary, by_verdict, by_delta_m, on)
    if by_verdict[WORSE]:
        findings.append(f"Worse than {best} at 95 % ({on}): {', '.join(by_verdict[WORSE])}.")
    if by_verdict[INDISTINGUISHABLE]:
        findings.append(f"Not shown different from {best} at 95 % ({on}): {', '.join(by_verdict[INDISTINGUISHABLE])}.")
    if baseline and baseline != best:
        versus = best_row.versus["ls"]
        if by_delta_m:
            c = versus.delta_m
            findings.append(f"{best} against {baseline}: Δm% {format_estimate(c.estimate(), 2, signed=True)}, "
                            f"P(improvement) {c.probability_of_improvement:.2f}: {_said(c.verdict)}.")
        else:
            findings.append(f"{best} against {baseline}: " + "; ".join(
                f"{t} {_said(c.verdict)} (P(improvement) {c.probability_of_improvement:.2f})"
                for t, c in versus.tasks.items()) + ".")
    findings.append("Not dominated with confidence (Pareto set at 95 %): "
                    f"{', '.join(summary.pareto_set_confident)}.")
    confident = bool(rows) and len(rows) > 1 and len(by_verdict[WORSE]) == len(rows) - 1
    return {"headline": headline, "findings": findings, "confident": confident,
            "warnings": list(summary.warnings)}


def _said(verdict: str) -> str:
    return "no verdict without an interval" if verdict == NO_INTERVAL else verdict


def _figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _error_box(summary: Summary, row: MethodRow, task: str) -> tuple[float, float, float]:
    """A method's primary-metric error on ``task``: (mean, low, high) of its interval (low = high = mean
    without one); a higher-is-better metric's interval turns over with the error."""
    spec = summary.primary_spec(task)
    e = row.intervals[task][summary.primary_metrics[task]]
    ends = [metric_error(v, spec["higher_is_better"], spec["unit_interval"])
            for v in ((e.low, e.high) if e.low is not None else (e.mean, e.mean))]
    return metric_error(e.mean, spec["higher_is_better"], spec["unit_interval"]), min(ends), max(ends)


def _front_axes(ax, summary: Summary, colours: Mapping[str, str], i: int, j: int, legend: bool) -> None:
    """Two tasks' primary errors: one cross per method (its 95 % intervals), a star for the Pareto set."""
    tasks, primary = summary.tasks, summary.primary_metrics
    for label in sorted(summary.methods):
        row = summary.methods[label]
        x, x_low, x_high = _error_box(summary, row, tasks[i])
        y, y_low, y_high = _error_box(summary, row, tasks[j])
        ax.errorbar([x], [y], xerr=[[x - x_low], [x_high - x]], yerr=[[y - y_low], [y_high - y]],
                    fmt="*" if row.pareto_optimal else "o", ms=9 if row.pareto_optimal else 6,
                    color=colours[label], capsize=3, lw=1.2, label=label if legend else None)
    ax.set_xlabel(f"{tasks[i]} error ({primary[tasks[i]]}, {unit_note(summary, tasks[i])})", fontsize=8)
    ax.set_ylabel(f"{tasks[j]} error ({primary[tasks[j]]}, {unit_note(summary, tasks[j])})", fontsize=8)
    ax.tick_params(labelsize=7)


def pareto_plot(summary: Summary) -> bytes:
    """The comparison figure. Two tasks: the per-task errors, one cross per method spanning its 95 %
    intervals. One, three or more: a heat map of the per-task Δ% against the single-task references (the error
    relative to each task's hypervolume reference without references), and the pairwise fronts."""
    plt = _pyplot()
    tasks = summary.tasks
    labels = sorted(summary.methods)
    colours = method_colours(labels)
    if len(tasks) == 2:
        fig, ax = plt.subplots(figsize=(6.4, 4.8))
        _front_axes(ax, summary, colours, 0, 1, legend=True)
        for label in summary.preference_front_methods:  # a Pareto-front method's grid points, in its colour
            learned = summary.methods[label].preference_front
            ax.plot([e[0] for e in learned.errors], [e[1] for e in learned.errors], marker=".", lw=1,
                    color=colours[label], label=f"{label}: learned front (HV {learned.hypervolume:.4f})")
        front = sorted(list(summary.methods[m].primary_errors) for m in summary.pareto_set)
        if len(front) > 1:
            ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, label="Pareto set (means)")
        ax.set_title("Per-task errors, mean and 95 % interval over seeds\n(lower-left is better; * = non-dominated)",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        pairs = list(itertools.combinations(range(len(tasks)), 2))  # none for a single task: the heat map alone
        columns = max(1, min(3, len(pairs)))
        grid_rows = 1 + -(-len(pairs) // columns)
        fig = plt.figure(figsize=(4.2 * columns, 3.6 * grid_rows + 0.35 * len(labels)))
        spec = fig.add_gridspec(grid_rows, columns)
        _heat_map(fig.add_subplot(spec[0, :]), summary, labels, colours)
        for n, (i, j) in enumerate(pairs):
            _front_axes(fig.add_subplot(spec[1 + n // columns, n % columns]), summary, colours, i, j, legend=n == 0)
        fig.legend(loc="lower center", ncol=min(len(labels), 6), fontsize=8, bbox_to_anchor=(0.5, -0.02))
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    data = _figure_png(fig)
    plt.close(fig)
    return data


def _heat_map(ax, summary: Summary, labels: Sequence[str], colours: Mapping[str, str]) -> None:
    """Methods x tasks, no units: Δ% against the single-task reference (0 = as good; red = worse), or without
    references the error as a share of the task's hypervolume reference error."""
    tasks = summary.tasks
    rows = summary.methods
    relative = summary.references is not None
    values = np.full((len(labels), len(tasks)), np.nan)
    text = [["" for _ in tasks] for _ in labels]
    for a, label in enumerate(labels):
        for b, task in enumerate(tasks):
            if relative:
                e = (rows[label].delta_task or {}).get(task)
                if e is not None:
                    values[a, b] = e.mean
                    text[a][b] = format_estimate(e, 1, signed=True).replace(" [", "\n[")
            else:
                scale = summary.hypervolume_normalised.scale[b]
                values[a, b] = rows[label].primary_errors[b] / scale
                text[a][b] = f"{values[a, b]:.3f}"
    finite = np.abs(values[np.isfinite(values)])
    if relative:
        bound = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        title = "Δ% per task against the single-task reference (mean [95 %]; < 0 better, > 0 worse)"
    else:
        image = ax.imshow(values, cmap="Reds", vmin=0, aspect="auto")
        title = "error / the task's hypervolume reference error (lower is better)"
    for a in range(len(labels)):
        for b in range(len(tasks)):
            dark = np.isfinite(values[a, b]) and image.norm(values[a, b]) > 0.8 or image.norm(values[a, b]) < 0.2
            ax.text(b, a, text[a][b] or "–", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    ax.set_xticks(range(len(tasks)), [f"{t} ({summary.primary_metrics[t]})" for t in tasks], fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for tick, label in zip(ax.get_yticklabels(), labels, strict=False):  # matplotlib may add no tick
        tick.set_color(colours[label])
        tick.set_fontweight("bold")
    ax.set_title(title, fontsize=9)
    ax.figure.colorbar(image, ax=ax, fraction=0.025, pad=0.01)


def curves_plot(runs: Sequence[Mapping[str, Any]], split: str) -> bytes:
    """The primary metric per epoch on ``split``: one colour per method (the report's palette), one line
    style per seed."""
    plt = _pyplot()
    tasks = runs[0]["metrics"]["tasks"]
    primary = runs[0]["metrics"]["primary_metrics"]
    colours = method_colours([run_label(r["run"]) for r in runs])
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):  # the grid may have more cells than tasks
        seen: dict[str, int] = {}
        for r in sorted(runs, key=lambda r: (run_label(r["run"]), r["run"]["config"]["seed"])):
            label = run_label(r["run"])
            nth = seen[label] = seen.get(label, -1) + 1
            epochs = r["metrics"]["epochs"]
            ax.plot([e["epoch"] for e in epochs], [e["splits"][split][task][primary[task]] for e in epochs],
                    color=colours[label], ls=styles[nth % len(styles)], lw=1,
                    label=f"{label} s{r['run']['config']['seed']}")
        ax.set_title(f"{task}: {split} {primary[task]}")
        ax.set_xlabel("epoch")
    axes[0][0].legend(fontsize=7)
    data = _figure_png(fig)
    plt.close(fig)
    return data


def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(loader=FileSystemLoader(TEMPLATES),
                      autoescape=select_autoescape(enabled_extensions=("html.j2",), default=False),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env


def _context(summary: Summary) -> dict[str, Any]:
    header, rows = table_rows(summary)
    refs = summary.references
    excluded = (("references", summary.delta_m_excluded.references),
                ("paper references", summary.delta_m_excluded.paper_references))
    return {
        "s": summary, "title": summary.dataset, "box": verdict_box(summary),
        "results": {"header": header, "rows": rows},
        "comparisons": dict(zip(("header", "rows"), comparison_rows(summary), strict=True)),
        "deltas": dict(zip(("header", "rows"), delta_rows(summary), strict=True)) if refs else None,
        "baselines": report_baselines.comparison_table(summary),
        "reference_values": {t: ", ".join(f"{m}={_reference_value(refs, t, m, v)}" for m, v in vals.items())
                             for t, vals in refs.metrics.items()} if refs else None,
        "excluded": [(kind, ", ".join(f"{t}/{m}" for t, names in by_task.items() for m in names))
                     for kind, by_task in excluded if by_task],
        "fronts": front_tables(to_json(summary)),  # the pareto layer reads results.json's form
        "units": {t: unit_note(summary, t) for t in summary.tasks},
        "paired_statistics": _paired_statistics(summary), "paired_row": PAIRED_COMBINED_ROW,
        "averaged": averaged_metrics(summary),
    }


def averaged_metrics(summary: Summary) -> str:
    """Which metrics of each task Δm% and the mean rank average (the other metrics are shown, not averaged)."""
    rule = summary.headline
    if rule is None:
        return "every metric but the loss (a results.json written before the headline rule)"

    def listed(metrics: Mapping[str, Sequence[str]]) -> str:
        return "; ".join(f"{t}: {', '.join(names) or 'none'}" for t, names in metrics.items())

    said = {"primary": "each task's primary metric", "all": "every metric but the loss"}[rule.rule]
    text = f"{said} (other metrics are shown, not averaged in); mean rank over {listed(rule.mean_rank_metrics)}"
    if summary.references is not None:
        text += f"; Δm% over {listed(rule.delta_m_metrics)}"
    if summary.paper_references is not None:
        text += f"; Δm% ({summary.paper_references.label}) over {listed(rule.delta_m_paper_metrics)}"
    return f"{text}. {rule.ill_conditioned}"


def _paired_statistics(summary: Summary) -> dict[str, str]:
    """Each task's per-example error of the paired comparisons (the first available one; all share the test
    set), or the default rule's words when no comparison is paired."""
    for row in summary.methods.values():
        for versus in row.versus.values():
            if versus.paired is not None and versus.paired.available:
                return dict(versus.paired.statistics)
    return {t: "0/1 error or per-example mean error, else the loss" for t in summary.tasks}


def _reference_value(refs: References, task: str, metric: str, mean: float) -> str:
    """A reference metric: its mean with the interval over the reference seeds."""
    interval = refs.intervals.get(task, {}).get(metric)
    return format_estimate(interval) if interval else f"{mean:.4f}"


def markdown_table(summary: Summary) -> str:
    header, rows = table_rows(summary)
    return _markdown(header, rows)


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _render_markdown(template: str, summary: Summary) -> str:
    env = _environment()
    env.filters["markdown"] = lambda table: _markdown(table["header"], table["rows"])
    return env.get_template(template).render(**_context(summary))


def markdown_summary(summary: Summary) -> str:
    return _render_markdown("results.md.j2", summary)


#: the results table's column that measures this machine rather than the methods: left out of the headline
STEP_TIME_COLUMN = "step s"


def headline_markdown(summary: Summary) -> str:
    """The verdict (what won, which differences are real, the warnings) and the results table without its step
    time: what ``mtlflow pipeline run`` prints after a sweep and the README's demo table, which the same command
    on the same kind of machine reproduces to the last digit (the step time is the machine's, not the result's)."""
    env = _environment()
    env.filters["markdown"] = lambda table: _markdown(table["header"], table["rows"])
    context = _context(summary)
    header, rows = context["results"]["header"], context["results"]["rows"]
    keep = [i for i, name in enumerate(header) if name != STEP_TIME_COLUMN]
    context["results"] = {"header": [header[i] for i in keep], "rows": [[r[i] for i in keep] for r in rows]}
    return env.get_template("headline.md.j2").render(**context).strip() + "\n"


def html_report(summary: Summary, pareto_png: bytes, curves_png: bytes) -> str:
    """The self-contained HTML report (figures embedded as PNG data URIs, no external resource)."""
    images = {"comparison": base64.b64encode(pareto_png).decode(), "curves": base64.b64encode(curves_png).decode()}
    return _environment().get_template("report.html.j2").render(images=images, **_context(summary))


def csv_rows(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """One row per method, every interval in its own numeric columns (mean, low, high; empty without an
    interval) and the verdicts against LS and the best method -- over seeds, and paired over the test examples
    on the mean over tasks of the error (empty, the verdict saying why, without one) -- for spreadsheets."""
    tasks, primary = summary.tasks, summary.primary_metrics
    header = ["method", "seeds"]
    estimates: list[tuple[str, Any]] = [(f"{t} {primary[t]}", lambda row, t=t: row.intervals[t][primary[t]])
                                        for t in tasks]
    if summary.references is not None:
        estimates += [(f"{t} delta%", lambda row, t=t: (row.delta_task or {}).get(t)) for t in tasks]
    if summary.best_by == "delta_m":
        estimates.append(("delta_m%", lambda row: row.delta_m.interval))
    if summary.paper_references:
        estimates.append(("delta_m% paper", lambda row: row.delta_m_paper.interval))
    estimates.append(("hypervolume (normalised)", lambda row: row.hypervolume_interval))
    for name, _ in estimates:
        header += [name, f"{name} low", f"{name} high"]
    header += ["mean rank", "mean rank low", "mean rank high"]
    roles = [("ls", summary.baseline), ("best", summary.best_method)]
    for role, other in roles:
        if other:
            header += [f"vs {role} on", f"vs {role} difference", f"vs {role} low", f"vs {role} high",
                       f"vs {role} P(improvement)", f"vs {role} verdict",
                       f"vs {role} paired error difference", f"vs {role} paired low", f"vs {role} paired high",
                       f"vs {role} paired P(improvement)", f"vs {role} paired verdict"]
    header += ["pareto (means)", "pareto (95 %)", "step s"]

    def number(value: float | None) -> str:
        return "" if value is None else repr(float(value))

    rows = []
    for label, row in _order(summary):
        cells = [label, str(len(row.seeds))]
        for _, get in estimates:
            e = get(row)
            cells += [number(e and e.mean), number(e and e.low), number(e and e.high)]
        rank = row.mean_rank
        interval = (rank.interval if rank is not None else None) or [None, None]
        cells += [number(rank.mean if rank is not None else None), number(interval[0]), number(interval[1])]
        for role, other in roles:
            if not other:
                continue
            versus = row.versus.get(role)
            if versus is None:
                cells += [""] * 11
                continue
            on, c = ("delta_m%", versus.delta_m) if versus.delta_m is not None else (
                f"{tasks[0]} {primary[tasks[0]]}", versus.tasks[tasks[0]])
            cells += [on, number(c.difference), number(c.low), number(c.high),
                      number(c.probability_of_improvement), c.verdict]
            paired = versus.paired
            if paired is not None and paired.combined is not None:  # the mean over tasks of the per-example errors
                d = paired.combined
                cells += [number(d.mean_difference), number(d.low), number(d.high),
                          number(d.probability_of_improvement), d.verdict]
            else:
                cells += ["", "", "", "", paired.short_verdict if paired is not None else ""]
        cells += ["yes" if row.pareto_optimal else "no", "yes" if row.pareto_confident else "no",
                  number(row.step_seconds_median)]
        rows.append(cells)
    return header, rows


def write_report(summary: Summary, runs: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
    """Write every aggregate output into ``out_dir`` (each file atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pareto_png = pareto_plot(summary)
    curves_png = curves_plot(runs, summary.split)
    atomic.write_json(out_dir / "results.json", to_json(summary))
    atomic.write_text(out_dir / "results.md", markdown_summary(summary))
    header, rows = csv_rows(summary)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic.write_text(out_dir / "results.csv", buf.getvalue())
    atomic.write_bytes(out_dir / "pareto.png", pareto_png)
    atomic.write_bytes(out_dir / "curves.png", curves_png)
    atomic.write_text(out_dir / "report.html", html_report(summary, pareto_png, curves_png))
