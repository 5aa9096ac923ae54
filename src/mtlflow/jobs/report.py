"""Aggregate outputs: results.json, a Markdown and CSV table, a Pareto plot, learning curves and an
HTML report that embeds both plots (one self-contained file for the Kubeflow UI)."""

from __future__ import annotations

import base64
import csv
import html
import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from mtlflow.core import atomic
from mtlflow.pareto.front import front_tables


def _fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    tasks, primary = summary["tasks"], summary["primary_metrics"]
    header = ["method", "seeds"] + [f"{t} {primary[t]}" for t in tasks]
    has_dm = summary["references"] is not None
    paper = summary.get("paper_references")
    if has_dm:
        header.append("Δm% (own STL) ↓" if paper else "Δm% ↓")
    if paper:
        header.append(f"Δm% ({paper['label']}) ↓")
    header += ["MR ↓", "HV ↑", "Pareto", "step s"]
    rows = []
    for label, row in sorted(summary["methods"].items(),
                             key=lambda kv: (kv[1].get("delta_m", 0.0), kv[1].get("mean_rank", 0.0))):
        cells = [label, str(len(row["seeds"]))]
        for t in tasks:
            m = primary[t]
            cells.append(f"{row['mean'][t][m]:.4f} ± {row['std'][t][m]:.4f}")
        if has_dm:
            cells.append(f"{row['delta_m']:.2f} ± {row['delta_m_std']:.2f}")
        if paper:
            cells.append(f"{row['delta_m_paper']:.2f} ± {row['delta_m_paper_std']:.2f}")
        cells += [_fmt(row.get("mean_rank"), 2), _fmt(row["hypervolume"]), "yes" if row["pareto_optimal"] else "",
                  f"{row['step_seconds_median']:.4f}"]
        rows.append(cells)
    return header, rows


def markdown_table(summary: Mapping[str, Any]) -> str:
    header, rows = table_rows(summary)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_summary(summary: Mapping[str, Any]) -> str:
    refs = summary["references"]
    parts = [f"# mtlflow results: {summary.get('dataset', summary['benchmark'])}", "",
             f"- data hash: `{summary['data_hash']}`",
             f"- split: {summary['split']}; selection rule(s): {', '.join(summary['selection_rules'])}",
             f"- hypervolume reference point: {summary['hypervolume_reference_point']} "
             f"({summary['hypervolume_objective']})",
             f"- mean rank over: {', '.join(summary['mean_rank_method_set'])}",
             f"- Pareto set: {', '.join(summary['pareto_set'])}",
             "- Δm% references: " + ("single-task runs " + ", ".join(
                 f"{t}: " + ", ".join(f"{m}={v:.4f}" for m, v in vals.items())
                 for t, vals in refs["metrics"].items()) if refs else "none (Δm% not computed)"),
             *([f"- Δm% {summary['paper_references']['label']} references: "
                f"{summary['paper_references']['source']}"] if summary.get("paper_references") else []),
             *[f"- Δm% leaves out (reference 0 or undefined, against the {kind.replace('_', ' ')}): " + ", ".join(
                 f"{t}/{m}" for t, names in excluded.items() for m in names)
               for kind, excluded in summary.get("delta_m_excluded", {}).items() if excluded],
             "", markdown_table(summary)]
    for title, header, rows in front_tables(summary):
        parts += ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        parts += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(parts)


def _figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def pareto_plot(summary: Mapping[str, Any]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = summary["tasks"]
    labels = sorted(summary["methods"])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    fronts = summary.get("preference_front_methods") or []
    if len(tasks) == 2:
        colours = {}
        for label in labels:
            row = summary["methods"][label]
            x, y = row["primary_errors"]
            points = ax.scatter([x], [y], s=60, marker="*" if row["pareto_optimal"] else "o", label=label)
            colours[label] = points.get_facecolor()[0]
        for label in fronts:  # a Pareto-front method's grid points, in the colour of its single point
            learned = summary["methods"][label]["preference_front"]
            ax.plot([e[0] for e in learned["errors"]], [e[1] for e in learned["errors"]], marker=".", lw=1,
                    color=colours[label], label=f"{label}: learned front (HV {learned['hypervolume']:.4f})")
        front = sorted((summary["methods"][m]["primary_errors"] for m in summary["pareto_set"]))
        if len(front) > 1:
            ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, label="Pareto set")
        ax.set_xlabel(f"{tasks[0]} error ({summary['primary_metrics'][tasks[0]]})")
        ax.set_ylabel(f"{tasks[1]} error ({summary['primary_metrics'][tasks[1]]})")
        ax.set_title("Per-task errors (lower-left is better; * = non-dominated)")
    else:
        for label in labels:
            ax.plot(range(len(tasks)), summary["methods"][label]["primary_errors"], marker="o", label=label)
        ax.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right")
        ax.set_ylabel("error of the primary metric")
        ax.set_title("Per-task errors (parallel coordinates)")
    if fronts:  # more entries: beside the axes, not over the points
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        ax.legend(fontsize=8)
    data = _figure_png(fig)
    plt.close(fig)
    return data


def curves_plot(runs: Sequence[Mapping[str, Any]], split: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtlflow.engine.rundir import run_label

    tasks = runs[0]["metrics"]["tasks"]
    primary = runs[0]["metrics"]["primary_metrics"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in runs:
            epochs = r["metrics"]["epochs"]
            ax.plot([e["epoch"] for e in epochs], [e["splits"][split][task][primary[task]] for e in epochs],
                    label=f"{run_label(r['run'])} s{r['run']['config']['seed']}", lw=1)
        ax.set_title(f"{task}: {split} {primary[task]}")
        ax.set_xlabel("epoch")
    axes[0][0].legend(fontsize=7)
    data = _figure_png(fig)
    plt.close(fig)
    return data


def html_report(summary: Mapping[str, Any], pareto_png: bytes, curves_png: bytes) -> str:
    header, rows = table_rows(summary)
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    table += "</table>"
    refs = summary["references"]
    ref_html = "<p>No single-task references: Δm% not computed.</p>"
    if refs:
        ref_html = "<ul>" + "".join(
            f"<li>{html.escape(t)}: " + ", ".join(f"{html.escape(m)} = {v:.4f}" for m, v in vals.items()) + "</li>"
            for t, vals in refs["metrics"].items()) + "</ul>"

    def img(data: bytes, alt: str) -> str:
        return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(data).decode()}"/>'

    title = html.escape(summary.get("dataset", summary["benchmark"]))  # summaries before datasets had labels
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>mtlflow report: {title}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}</style>
</head><body>
<h1>mtlflow report: {title}</h1>
<p>Data hash <code>{html.escape(summary['data_hash'])}</code>; split <b>{html.escape(summary['split'])}</b>;
selection rule(s): {html.escape(', '.join(summary['selection_rules']))}; the test split never selects an epoch.</p>
<h2>Results</h2>{table}
<p>Mean rank over: {html.escape(', '.join(summary['mean_rank_method_set']))}.
Hypervolume reference point {summary['hypervolume_reference_point']} on {html.escape(summary['hypervolume_objective'])};
HV of all methods together: {summary['hypervolume_all_methods']:.4f}.
Pareto set: {html.escape(', '.join(summary['pareto_set']))}.</p>
{_fronts_html(summary)}<h2>Single-task references</h2>{ref_html}{_paper_html(summary)}
<h2>Pareto plot</h2>{img(pareto_png, 'Pareto plot')}
<h2>Learning curves</h2>{img(curves_png, 'learning curves')}
</body></html>
"""


def _fronts_html(summary: Mapping[str, Any]) -> str:
    """The Pareto-front methods' tables (PaLoRA): front hypervolume and every grid point."""
    parts = []
    for title, header, rows in front_tables(summary):
        parts.append(f"<h3>{html.escape(title)}</h3><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                     + "</tr>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                                         for r in rows) + "</table>")
    return ("<h2>Learned Pareto fronts</h2>" + "".join(parts)) if parts else ""


def _paper_html(summary: Mapping[str, Any]) -> str:
    paper = summary.get("paper_references")
    if not paper:
        return ""
    values = "".join(f"<li>{html.escape(t)}: " + ", ".join(f"{html.escape(m)} = {v:g}" for m, v in vals.items())
                     + "</li>" for t, vals in paper["metrics"].items())
    return (f"<p>Δm% ({html.escape(paper['label'])}) uses the published single-task values of "
            f"{html.escape(paper['source'])}:</p><ul>{values}</ul>")


def write_report(summary: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
    """Write every aggregate output into ``out_dir`` (each file atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pareto_png = pareto_plot(summary)
    curves_png = curves_plot(runs, summary["split"])
    atomic.write_json(out_dir / "results.json", summary)
    atomic.write_text(out_dir / "results.md", markdown_summary(summary))
    header, rows = table_rows(summary)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic.write_text(out_dir / "results.csv", buf.getvalue())
    atomic.write_bytes(out_dir / "pareto.png", pareto_png)
    atomic.write_bytes(out_dir / "curves.png", curves_png)
    atomic.write_text(out_dir / "report.html", html_report(summary, pareto_png, curves_png))
