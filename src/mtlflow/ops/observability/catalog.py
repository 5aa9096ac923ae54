"""Every Prometheus metric mtlflow exports: name, type, labels, meaning (one table, no prometheus_client).

Conventions (Prometheus naming guide): the ``mtlflow_`` prefix, base units in the name (``_seconds``,
``_bytes``), ``_total`` for counters, ``_timestamp_seconds`` for Unix times. The identity of a
training run is (pipeline, benchmark, method, seed, tasks, run) -- ``method`` is the run label of the
aggregate report (name plus non-default hyper-parameters, e.g. ``fairgrad(alpha=2.0)``), ``tasks`` is
``all`` for a multi-task run or the trained subset (``left`` for a single-task reference) and ``run``
is the run key in a pipeline (the run directory under the checkpoint root: a hash of spec, data,
epochs and options, so a retried or reused training is the same run) or the run directory's name
from the command line.

Every Pushgateway grouping key names its run, so concurrent runs never overwrite each other's
series: training groups by its identity, a sweep comparison by (pipeline, benchmark, run) and a
pipeline run's status by (pipeline, run), where ``run`` is the pipeline run's name. A training push from
a pipeline task (a ``train`` task, or rank 0 of a TrainJob) adds ``pipeline_run`` -- the pipeline run's name
-- to its grouping key only: the gateway adds it to every series of the group, and the pipeline's exit
handler deletes exactly the training groups carrying its own run's name. The Pushgateway keeps a group
until it is deleted (see docs/guides/observability.md for the clean-up).
"""

from __future__ import annotations

from dataclasses import dataclass

#: labels identifying one training run (also its Pushgateway grouping key)
TRAIN_IDENTITY = ("pipeline", "benchmark", "method", "seed", "tasks", "run")
#: the grouping-key label naming the pipeline run a training push belongs to (absent from the command line)
PIPELINE_RUN_LABEL = "pipeline_run"
#: the Pushgateway grouping key of a sweep comparison (and the labels of its timestamp)
AGGREGATE_GROUP = ("pipeline", "benchmark", "run")
#: labels of the aggregate (sweep comparison) metrics
AGGREGATE_IDENTITY = AGGREGATE_GROUP + ("method",)
#: labels of the pipeline-run status metrics, also their grouping key
PIPELINE_IDENTITY = ("pipeline", "run")
#: the Pushgateway grouping key of a retrain gate decision (pipeline, dataset, the pipeline run's name)
GATE_GROUP = ("pipeline", "benchmark", "run")

#: Pushgateway ``job`` label of each exporter
TRAIN_JOB = "mtlflow_train"
AGGREGATE_JOB = "mtlflow_aggregate"
PIPELINE_JOB = "mtlflow_pipeline"
GATE_JOB = "mtlflow_retrain_gate"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "gauge" or "counter" (a counter's name carries the _total suffix)
    labels: tuple[str, ...]
    help: str

    @property
    def base_name(self) -> str:
        """The name prometheus_client is given (it appends ``_total`` to counters itself)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def _train(name: str, kind: str, extra: tuple[str, ...], help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, TRAIN_IDENTITY + extra, help_text)


TRAIN_METRICS: tuple[MetricSpec, ...] = (
    _train("mtlflow_train_epoch", "gauge", (), "Last completed epoch."),
    _train("mtlflow_train_planned_epochs", "gauge", (), "Epochs the run is configured to train."),
    _train("mtlflow_train_steps_total", "counter", (), "Optimisation steps completed by the run."),
    _train("mtlflow_train_loss", "gauge", ("task",), "Mean training loss of the task over the last epoch."),
    _train("mtlflow_eval_loss", "gauge", ("task", "split"), "Loss of the task on a split after the last epoch."),
    _train("mtlflow_eval_metric", "gauge", ("task", "split", "metric"),
           "Metric of the task on a split after the last epoch (accuracy, F1, MAE, ...)."),
    _train("mtlflow_final_metric", "gauge", ("task", "split", "metric"),
           "Selected final metric of the finished run (the run's selection rule: last epoch or last-k mean)."),
    _train("mtlflow_gradient_conflict_ratio", "gauge", (),
           "Fraction of the last epoch's steps where some task gradient has a negative cosine to the mean gradient."),
    _train("mtlflow_gradient_cosine_to_mean", "gauge", ("task",),
           "Mean cosine of the task gradient to the mean task gradient over the last epoch."),
    _train("mtlflow_method_weight", "gauge", ("task",), "Mean weight the method gave the task over the last epoch."),
    _train("mtlflow_teleports_total", "counter", (),
           "Teleports performed by COST (sum of the epoch records' cost.teleports)."),
    _train("mtlflow_train_step_median_seconds", "gauge", (),
           "Median wall time of one training step in the last epoch."),
    _train("mtlflow_solver_median_seconds", "gauge", (),
           "Median time of the method's solver per solving step in the last epoch."),
    _train("mtlflow_train_epoch_seconds", "gauge", (), "Wall time of the last epoch including evaluation."),
    _train("mtlflow_train_samples_per_second", "gauge", (), "Training throughput of the last epoch."),
    _train("mtlflow_train_peak_memory_bytes", "gauge", ("device",),
           "Peak memory of the last epoch: CUDA allocator peak, or peak resident set size on the CPU."),
    _train("mtlflow_train_running", "gauge", (), "1 while the run trains, 0 once it completed or failed."),
    _train("mtlflow_train_failed", "gauge", (), "1 when the run stopped with an error."),
    _train("mtlflow_train_nonfinite_loss", "gauge", (), "1 when the run stopped on a NaN or infinite loss."),
    _train("mtlflow_train_start_timestamp_seconds", "gauge", (), "Unix time the run (or its resumption) started."),
    _train("mtlflow_train_last_progress_timestamp_seconds", "gauge", (),
           "Unix time of the last completed step or epoch."),
    _train("mtlflow_train_last_epoch_timestamp_seconds", "gauge", (), "Unix time the last epoch completed."),
    _train("mtlflow_train_last_success_timestamp_seconds", "gauge", (),
           "Unix time the run last completed successfully (not overwritten by a failed run)."),
)

AGGREGATE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("mtlflow_delta_m_percent", "gauge", AGGREGATE_IDENTITY + ("reference",),
               "Δm% of the method against single-task references (reference=own: the sweep's own single-task "
               "runs; paper: published values), mean over seeds; lower is better."),
    MetricSpec("mtlflow_mean_rank", "gauge", AGGREGATE_IDENTITY,
               "Mean rank of the method over the declared method set."),
    MetricSpec("mtlflow_hypervolume", "gauge", AGGREGATE_IDENTITY,
               "Hypervolume of the method's per-task errors, each divided by the benchmark's reference error "
               "(reference point 1 per task: a share of the box, 0-1), mean over seeds."),
    MetricSpec("mtlflow_pareto_optimal", "gauge", AGGREGATE_IDENTITY, "1 when the method is in the Pareto set."),
    MetricSpec("mtlflow_aggregate_last_success_timestamp_seconds", "gauge", AGGREGATE_GROUP,
               "Unix time the comparison was computed."),
)

PIPELINE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("mtlflow_pipeline_last_run_succeeded", "gauge", PIPELINE_IDENTITY,
               "1 when the pipeline run ended SUCCEEDED, 0 when it failed or was cancelled."),
    MetricSpec("mtlflow_pipeline_last_run_timestamp_seconds", "gauge", PIPELINE_IDENTITY,
               "Unix time the pipeline run ended."),
    MetricSpec("mtlflow_pipeline_last_success_timestamp_seconds", "gauge", PIPELINE_IDENTITY,
               "Unix time the pipeline run ended SUCCEEDED (kept when a retry of the same run fails)."),
    MetricSpec("mtlflow_pipeline_last_run_info", "gauge", PIPELINE_IDENTITY + ("state",),
               "Always 1; the labels name the run and its final state."),
)

GATE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("mtlflow_retrain_promoted", "gauge", GATE_GROUP,
               "1 when the retrain gate promoted the candidate, 0 when it kept the champion."),
    MetricSpec("mtlflow_retrain_error_difference", "gauge", GATE_GROUP + ("task", "bound"),
               "Candidate minus champion mean per-example error on the same test split (negative: the candidate "
               "is better); task=all is the change of the store's score; bound is estimate, low or high of the "
               "paired-bootstrap interval (Bonferroni-corrected per task)."),
    MetricSpec("mtlflow_retrain_test_examples", "gauge", GATE_GROUP, "Test examples the two models were paired on."),
    MetricSpec("mtlflow_retrain_model_error", "gauge", GATE_GROUP + ("model",),
               "Score (mean over tasks of the primary metric's error) of the candidate or the champion, both "
               "evaluated on the candidate's test split."),
    MetricSpec("mtlflow_retrain_decision_timestamp_seconds", "gauge", GATE_GROUP, "Unix time of the gate decision."),
)

ALL_METRICS: tuple[MetricSpec, ...] = TRAIN_METRICS + AGGREGATE_METRICS + PIPELINE_METRICS + GATE_METRICS


def spec(name: str) -> MetricSpec:
    """The catalogue entry of metric ``name``."""
    for entry in ALL_METRICS:
        if entry.name == name:
            return entry
    raise KeyError(name)
