"""aggregate: Δm% table, mean rank, hypervolume and a Pareto plot over all runs of a sweep."""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"
SERVICES = ("Prometheus Pushgateway (optional: the comparison)",)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def aggregate(runs: dsl.Input[List[dsl.Artifact]], references: dsl.Input[List[dsl.Artifact]],
              method_set: List[str], results: dsl.Output[dsl.Artifact], report: dsl.Output[dsl.HTML],
              metrics: dsl.Output[dsl.Metrics], summary: dsl.Output[dsl.Markdown],
              pushgateway: str = "", pipeline_name: str = "", run_name: str = "",
              baselines: dsl.Input[List[dsl.Artifact]] = None):
    """Compare the runs against the single-task references; the HTML report embeds the Pareto plot,
    the per-method table and the learning curves, ``summary`` is the Markdown table, ``metrics`` holds
    per method its Δm%, mean rank, hypervolume and each task's primary metric. With ``pushgateway``
    (else ``$MTLFLOW_PUSHGATEWAY``; neither: off) the comparison is pushed to Prometheus under
    ``pipeline_name`` and ``run_name`` (the pipeline run's name).

    Args:
        runs: the run artifacts of the sweep
        references: the single-task reference runs (for Δm%)
        method_set: the methods the mean rank is taken over
        results: results folder (results.json/.md/.csv, plots)
        report: HTML report
        metrics: per method its Δm%, mean rank, hypervolume and each task's primary metric, shown in the
            Kubeflow UI
        summary: the Markdown table
        pushgateway: Prometheus Pushgateway URL for telemetry (default ``$MTLFLOW_PUSHGATEWAY``; empty: off)
        pipeline_name: the ``pipeline`` label of the pushed metrics
        run_name: the ``run`` label of the pushed metrics (the pipeline run's name)
        baselines: the baselines' run-like directories (``baseline``), rows beside the methods (none: no baselines)
    """
    import json

    from mtlflow.jobs import pipeline_steps

    result = pipeline_steps.aggregate([r.path for r in runs], [r.path for r in references], method_set, results.path,
                                      report.path, summary.path, pushgateway, pipeline_name, run_name,
                                      baselines=[b.path for b in baselines or []])
    results.metadata.update(result["metadata"])
    for name, value in result["metrics"].items():
        metrics.log_metric(name, value)
    with open(metrics.path, "w") as fh:
        fh.write(json.dumps(result["scores"]))
