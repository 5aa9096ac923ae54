"""Reports of one run: a self-contained HTML page (metrics, learning curves, telemetry) and Markdown
summaries (a run, an evaluation with confusion matrices) for the Kubeflow UI and ``mtlflow report``.

:func:`render_report` renders the HTML report of any finished run directory (``metrics.json`` +
``run.json``) or of an aggregate results directory (``results.json``: the sweep report again).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.core import atomic
from mtlflow.core.errors import DataError
from mtlflow.engine.rundir import run_label
from mtlflow.jobs.compare.summary import read_summary
from mtlflow.jobs.report import curves_plot, html_report, pareto_plot

#: confusion matrices with more classes are left out of the Markdown (they stay in evaluation.json)
MAX_MARKDOWN_CLASSES = 20


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """``run.json`` and ``metrics.json`` of a run in any state (completed, failed, still running)."""
    run_dir = Path(run_dir)
    run = atomic.read_json(run_dir / "run.json", "run description")
    metrics = atomic.read_json(run_dir / "metrics.json", "run metrics")
    if not metrics.get("epochs"):
        raise DataError(f"run {run_dir} has no completed epoch yet; report it after its first epoch")
    return {"dir": str(run_dir), "run": run, "metrics": metrics}


def _label(run: Mapping[str, Any]) -> str:
    return run_label(run)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _final_rows(metrics: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Final (selected) metrics, or the last epoch's when the run did not finish: one row per task."""
    values = metrics.get("final") or metrics["epochs"][-1]["splits"]
    splits = list(values)
    names = list(dict.fromkeys(m for task in metrics["tasks"] for m in metrics["metric_specs"][task]))
    header = ["task"] + [f"{split} {name}" for split in splits for name in names]
    rows = [[task] + [_fmt(values[split][task].get(name, "–")) for split in splits for name in names]
            for task in metrics["tasks"]]
    return header, rows


def _telemetry_rows(metrics: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["epoch", "train loss", "step s (median)", "samples/s", "peak MiB", "conflict ratio", "teleports"]
    rows = []
    for e in metrics["epochs"]:
        teleports = (e.get("cost") or {}).get("teleports", "–")
        rows.append([str(e["epoch"]), _fmt(sum(e["train_loss"].values())), _fmt(e["step_seconds_median"]),
                     _fmt(e["samples_per_second"]), _fmt(e["peak_memory_bytes"] / 2**20),
                     _fmt(e.get("conflict_ratio", "–")), _fmt(teleports)])
    return header, rows


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def run_markdown(run_dir: str | Path) -> str:
    """Markdown summary of one run: identity, status, final metrics, last-epoch telemetry."""
    loaded = load_run(run_dir)
    run, metrics = loaded["run"], loaded["metrics"]
    config = run["config"]
    last = metrics["epochs"][-1]
    parts = [f"# {_label(run)} on {run.get('dataset', run['benchmark'])} (seed {config['seed']})", "",
             f"- status: **{run.get('status', 'unknown')}**" + (f" ({run['error']})" if run.get("error") else ""),
             f"- epochs: {last['epoch']} of {config['epochs']}; selection rule: {metrics['selection']['rule']}",
             f"- tasks: {', '.join(metrics['tasks'])} ({run.get('kind', 'multi-task')})",
             f"- data hash: `{run['data_hash']}`",
             f"- step time (median): {last['step_seconds_median']:.4f} s; {last['samples_per_second']:.1f} samples/s; "
             f"peak memory {last['peak_memory_bytes'] / 2**20:.0f} MiB",
             *([f"- gradient conflict ratio: {last['conflict_ratio']:.3f}"] if "conflict_ratio" in last else []),
             "", "## Final metrics" if metrics.get("final") else "## Last epoch's metrics", "",
             _markdown_table(*_final_rows(metrics))]
    return "\n".join(parts)


def evaluation_markdown(result: Mapping[str, Any]) -> str:
    """Markdown of ``jobs.evaluate``'s result: metrics per task and the confusion matrices."""
    split = result["split"]
    names = sorted({m for values in result["metrics"].values() for m in values})
    rows = [[task] + [_fmt(result["metrics"][task].get(m, "–")) for m in names] for task in result["tasks"]]
    parts = [f"# Evaluation of {result['method']} on {result.get('dataset', result['benchmark'])} ({split} split)", "",
             f"- data hash: `{result['data_hash']}`", "", _markdown_table(["task", *names], rows)]
    for task, cm in (result.get("confusion_matrices") or {}).items():
        parts.append(f"## Confusion matrix: {task} (rows: true class, columns: predicted)\n")
        if len(cm["categories"]) > MAX_MARKDOWN_CLASSES:
            parts.append(f"{len(cm['categories'])} classes: see the ClassificationMetrics artifact or "
                         "evaluation.json.\n")
            continue
        parts.append(_markdown_table(["true \\ predicted", *cm["categories"]],
                                     [[c, *map(str, row)]
                                      for c, row in zip(cm["categories"], cm["matrix"], strict=True)]))
    return "\n".join(parts)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)  # no bbox_inches="tight": its layout pass costs more than the drawing
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(metrics: Mapping[str, Any]) -> list[tuple[str, dict[str, list[float]]]]:
    """(title, {series label: value per epoch}) of every plot: the learning curves (the primary metric of
    every task on each evaluated split, the training losses), then the telemetry (step time, throughput,
    peak memory and -- when recorded -- gradient conflict, cosines to the mean gradient, method weights,
    teleports). A fixed number of panels, whatever the number of tasks."""
    tasks, primary, epochs = metrics["tasks"], metrics["primary_metrics"], metrics["epochs"]
    panels: list[tuple[str, dict[str, list[float]]]] = [
        (f"{split}: primary metric", {f"{t} {primary[t]}": [e["splits"][split][t][primary[t]] for e in epochs]
                                      for t in tasks})
        for split in epochs[-1]["splits"]]
    panels += [
        ("training loss", {t: [e["train_loss"][t] for e in epochs] for t in tasks}),
        ("step time, median (s)", {"": [e["step_seconds_median"] for e in epochs]}),
        ("samples / s", {"": [e["samples_per_second"] for e in epochs]}),
        ("peak memory (MiB)", {"": [e["peak_memory_bytes"] / 2**20 for e in epochs]}),
    ]
    if all("conflict_ratio" in e for e in epochs):
        panels.append(("gradient conflict ratio", {"": [e["conflict_ratio"] for e in epochs]}))
    for field, title in (("cosine_to_mean", "cosine to mean gradient"), ("method_weights_mean", "method weights")):
        if all(field in e for e in epochs):
            panels.append((title, {t: [e[field][t] for e in epochs] for t in tasks}))
    if any("cost" in e for e in epochs):
        panels.append(("teleports", {"": [(e.get("cost") or {}).get("teleports", 0) for e in epochs]}))
    return panels


def run_figure_png(metrics: Mapping[str, Any], columns: int = 4) -> bytes:
    """Learning curves and telemetry per epoch in one figure (one PNG to render and embed)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    x = [e["epoch"] for e in metrics["epochs"]]
    panels = _panels(metrics)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.7 * rows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, panels, strict=False):  # the grid may have more cells than panels
        for name, values in series.items():
            ax.plot(x, values, marker=".", label=name or None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if 1 < len(series) <= 10:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.2 / rows, top=1 - 0.08 / rows, wspace=0.3, hspace=0.55)
    data = _png(fig)
    plt.close(fig)
    return data


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(data).decode()}"/>'


def run_report_html(run_dir: str | Path) -> str:
    """Self-contained HTML report of one run (plots embedded as PNG)."""
    loaded = load_run(run_dir)
    run, metrics = loaded["run"], loaded["metrics"]
    config = run["config"]
    title = f"{_label(run)} on {run.get('dataset', run['benchmark'])} (seed {config['seed']})"
    status = html.escape(str(run.get("status", "unknown"))) + (
        f" &mdash; {html.escape(run['error'])}" if run.get("error") else "")
    settings = [[k, _fmt(v)] for k, v in sorted(config.items()) if v not in (None, {}, [])]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>mtlflow run: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:0.5em 0}}
td,th{{border:1px solid #bbb;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}</style>
</head><body>
<h1>mtlflow run: {html.escape(title)}</h1>
<p>Status <b>{status}</b>; {len(metrics['epochs'])} of {config['epochs']} epochs; selection rule
<b>{html.escape(metrics['selection']['rule'])}</b> (the test split never selects an epoch); data hash
<code>{html.escape(run['data_hash'])}</code>; tasks {html.escape(', '.join(metrics['tasks']))}.</p>
<h2>{'Final metrics' if metrics.get('final') else "Last epoch's metrics"}</h2>{_html_table(*_final_rows(metrics))}
<h2>Learning curves and telemetry</h2>{_img(run_figure_png(metrics), 'learning curves and telemetry')}
{_html_table(*_telemetry_rows(metrics))}
<h2>Configuration</h2>{_html_table(['option', 'value'], settings)}
</body></html>
"""


def aggregate_report_html(results_dir: str | Path) -> str:
    """The sweep report of an aggregate results directory, re-rendered from ``results.json``: learning
    curves from the runs when their directories still exist, else the directory's ``curves.png``."""
    results_dir = Path(results_dir)
    summary = read_summary(results_dir / "results.json")
    run_dirs = [d for row in summary.methods.values() for d in row.runs]
    if run_dirs and all((Path(d) / "metrics.json").is_file() for d in run_dirs):
        curves = curves_plot([jobs.read_run(d) for d in run_dirs], summary.split)
    elif (results_dir / "curves.png").is_file():
        curves = (results_dir / "curves.png").read_bytes()
    else:
        raise DataError(f"{results_dir} has neither the run directories of results.json nor curves.png; "
                        "re-run `mtlflow aggregate`")
    return html_report(summary, pareto_plot(summary), curves)


def render_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a run directory or an aggregate results directory; returns its path
    (default ``<path>/report.html``)."""
    path = Path(path)
    if (path / "results.json").is_file():
        page = aggregate_report_html(path)
    elif (path / "metrics.json").is_file() and (path / "run.json").is_file():
        page = run_report_html(path)
    else:
        raise DataError(f"{path} is neither a run directory (run.json + metrics.json) nor an aggregate results "
                        "directory (results.json); give the --out of `mtlflow train` or `mtlflow aggregate`")
    target = Path(out) if out else path / "report.html"
    atomic.write_text(target, page)
    return target
