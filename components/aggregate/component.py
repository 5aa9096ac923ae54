"""aggregate: Δm% table, mean rank, hypervolume and a Pareto plot over all runs of a sweep."""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def aggregate(runs: dsl.Input[List[dsl.Artifact]], references: dsl.Input[List[dsl.Artifact]],
              method_set: List[str], results: dsl.Output[dsl.Artifact], report: dsl.Output[dsl.HTML],
              metrics: dsl.Output[dsl.Metrics], summary: dsl.Output[dsl.Markdown],
              pushgateway: str = "", pipeline_name: str = ""):
    """Compare the runs against the single-task references; the HTML report embeds the Pareto plot,
    the per-method table and the learning curves, ``summary`` is the Markdown table, ``metrics`` holds
    per method its Δm%, mean rank, hypervolume and each task's primary metric. With ``pushgateway``
    (else ``$MTLFLOW_PUSHGATEWAY``; neither: off) the comparison is pushed to Prometheus under
    ``pipeline_name``."""
    import json
    import shutil

    from mtlflow import jobs
    from mtlflow.core import atomic
    from mtlflow.ops.observability import export_summary

    labels = sorted({jobs.run_label(jobs.read_run(r.path)["run"]) for r in runs})
    declared = [m for m in labels if m in method_set or m.split("(")[0] in method_set]
    outcome = jobs.aggregate([r.path for r in runs], results.path, reference_dirs=[r.path for r in references],
                             method_set=declared or None)
    shutil.copyfile(f"{results.path}/report.html", report.path)
    shutil.copyfile(f"{results.path}/results.md", summary.path)
    results.metadata.update({"benchmark": outcome["benchmark"], "data_hash": outcome["data_hash"],
                             "pareto_set": outcome["pareto_set"]})
    primary = outcome["primary_metrics"]
    for label, row in outcome["methods"].items():
        if "delta_m" in row:
            metrics.log_metric(f"{label}.delta_m_pct", float(row["delta_m"]))
        if "delta_m_paper" in row:
            metrics.log_metric(f"{label}.delta_m_paper_pct", float(row["delta_m_paper"]))
        metrics.log_metric(f"{label}.mean_rank", float(row["mean_rank"]))
        metrics.log_metric(f"{label}.hypervolume", float(row["hypervolume"]))
        for task in outcome["tasks"]:
            metrics.log_metric(f"{label}.{task}.{primary[task]}", float(row["mean"][task][primary[task]]))
    atomic.write_text(metrics.path, json.dumps(
        {k: {m: v for m, v in r.items() if m in ("delta_m", "delta_m_paper", "mean_rank", "hypervolume")}
         for k, r in outcome["methods"].items()}))
    export_summary(outcome, pushgateway or None, pipeline=pipeline_name or "kfp")
