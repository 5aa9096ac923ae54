"""aggregate: Δm% table, mean rank, hypervolume and a Pareto plot over all runs of a sweep."""

from typing import List

from kfp import dsl

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def aggregate(runs: dsl.Input[List[dsl.Artifact]], references: dsl.Input[List[dsl.Artifact]],
              method_set: List[str], results: dsl.Output[dsl.Artifact], report: dsl.Output[dsl.HTML],
              metrics: dsl.Output[dsl.Metrics]):
    """Compare the runs against the single-task references; the HTML report embeds the plots."""
    import json
    import shutil

    from mtlflow import jobs

    labels = sorted({jobs.run_label(jobs.read_run(r.path)["run"]) for r in runs})
    declared = [m for m in labels if m in method_set or m.split("(")[0] in method_set]
    summary = jobs.aggregate([r.path for r in runs], results.path, reference_dirs=[r.path for r in references],
                             method_set=declared or None)
    shutil.copyfile(f"{results.path}/report.html", report.path)
    results.metadata.update({"benchmark": summary["benchmark"], "data_hash": summary["data_hash"],
                             "pareto_set": summary["pareto_set"]})
    for label, row in summary["methods"].items():
        if "delta_m" in row:
            metrics.log_metric(f"{label}.delta_m_pct", float(row["delta_m"]))
        metrics.log_metric(f"{label}.mean_rank", float(row["mean_rank"]))
        metrics.log_metric(f"{label}.hypervolume", float(row["hypervolume"]))
    with open(metrics.path, "w") as fh:
        json.dump({k: {m: v for m, v in r.items() if m in ("delta_m", "mean_rank", "hypervolume")}
                   for k, r in summary["methods"].items()}, fh)
