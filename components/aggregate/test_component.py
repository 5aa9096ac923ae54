import json
from pathlib import Path

from kfp import dsl

from mtlflow.components.aggregate.component import aggregate


def test_aggregate_writes_report_and_scalars(tiny_runs, tmp_path):
    results = dsl.Artifact(uri=str(tmp_path / "results"))
    report = dsl.HTML(uri=str(tmp_path / "report.html"))
    metrics = dsl.Metrics(uri=str(tmp_path / "metrics.json"))
    markdown = dsl.Markdown(uri=str(tmp_path / "summary.md"))
    aggregate.python_func(runs=[tiny_runs["ls"]["run"], tiny_runs["mgda"]["run"]],
                          references=[tiny_runs["ref-left"]["run"], tiny_runs["ref-right"]["run"]],
                          method_set=["ls", "mgda"], results=results, report=report, metrics=metrics,
                          summary=markdown)
    summary = json.loads((Path(results.path) / "results.json").read_text())
    assert set(summary["methods"]) == {"ls", "mgda"}
    assert summary["references"]["metrics"].keys() == {"left", "right"}
    html = Path(report.path).read_text()
    assert "data:image/png;base64," in html and "Δm%" in html
    for label in ("ls", "mgda"):
        row = summary["methods"][label]
        assert metrics.metadata[f"{label}.delta_m_pct"] == row["delta_m"]
        assert metrics.metadata[f"{label}.mean_rank"] == row["mean_rank"]
        assert metrics.metadata[f"{label}.left.acc"] == row["mean"]["left"]["acc"]
    text = Path(markdown.path).read_text()
    assert text.startswith("# mtlflow results: multimnist") and "| mgda |" in text and "Δm%" in text
    # ranks of two methods on every metric sum to 1 + 2, so their mean ranks do too
    assert summary["methods"]["ls"]["mean_rank"] + summary["methods"]["mgda"]["mean_rank"] == 3.0
