"""compare_to_champion / promote: gate and store a retrained model in the model store.

``compare_to_champion`` evaluates the candidate ``run`` **and** the model store's champion (its ``model.pt``) on
the same test split: the one of ``data``, the new data version. The champion's stored metrics, measured on the
data version it was trained on, are never compared. The rule (``mtlflow.metrics.paired``): per test example and
task, the difference of the two models' errors (0/1 error for accuracy, absolute error for MAE, the loss where
the primary metric has no per-example value); a paired bootstrap over the examples gives the mean over tasks of
these differences (the change of the store's score) a 95 % interval, which must lie below 0, and each task a
Bonferroni-corrected interval whose upper bound must not exceed the task's ``non_inferiority_margin`` (default:
10 % of the champion's mean error on it). Test rows the champion trained on (by content digest) are left out.
The decision record (both models' metrics on the split, the intervals, ``n``, the rule, which conditions
failed, the smallest detectable differences, the overlap) goes to ``decision``, to
``<model_store>/<benchmark>/decisions/``, to the Kubeflow UI (``metrics``) and to Prometheus (``pushgateway``).
``promote`` checks under the store's lock that the decision was made against the champion still in place, so
two concurrent retraining runs cannot both win, and reports the outcome decided there (promoted, or "kept:
another retrain promoted X first") in the decision record, its UI metrics and Prometheus.

The tests (``test_component.py``) promote a first model, keep the same model and other seeds of it, promote a
clearly better model over a damaged champion, re-evaluate a champion of an older data version on the new split
and refuse a decision made against a replaced champion, reporting it kept (the race with the real lock:
``tests/unit/ops/test_model_store_race.py``); ``tests/integration/test_retrain_local.py`` runs the
retrain pipeline under kfp.local.
"""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_retrain_local.py) and in the image (tests/e2e)
STABILITY = "stable"
SERVICES = ("Prometheus Pushgateway (optional: the decision)",)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def compare_to_champion(run: dsl.Input[dsl.Artifact], data: dsl.Input[dsl.Dataset], model_store: str,
                        min_improvement: float, decision: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics],
                        pushgateway: str = "", pipeline_name: str = "", run_name: str = "",
                        non_inferiority_margin: dict = {}) -> bool:  # noqa: B006 (a KFP default, never mutated)
    """Evaluate the candidate ``run`` and the model store's champion on the same test split, ``data``'s
    (the new data version), less the rows the champion has seen, and return True when the candidate is better
    with confidence (paired bootstrap over test examples) by at least ``min_improvement`` and non-inferior on
    every task (Bonferroni over tasks, within ``non_inferiority_margin``), or when there is no champion yet.
    The decision record goes to ``decision`` (for ``promote``), the model store's ``decisions/`` (kept, or
    pending ``promote``), the UI (``metrics``: both models' metrics on the split, the intervals, n, the
    smallest detectable differences; ``promoted`` only when the champion is kept, else ``promote`` logs it)
    and Prometheus (``pushgateway``; ``promoted`` 0 until ``promote`` decides).

    Args:
        run: the candidate's run directory (run.json, metrics.json, model.pt, report)
        data: the prepared dataset the candidate was trained on (from ``prepare_data``): both models are
            evaluated on its test split
        model_store: model store path (champion per benchmark)
        min_improvement: how much the candidate must lower the store's score (mean over tasks of the primary
            metric's error)
        decision: the decision record (JSON), passed to ``promote``
        metrics: ``promoted`` (when kept), both models' score and primary metrics on the split, ``n``,
            ``difference.<task or all>.{estimate,low,high}``, ``resolution.<task or all>``, ``overlap_rows``
        pushgateway: Prometheus Pushgateway for the decision (``""``: ``$MTLFLOW_PUSHGATEWAY``, else off)
        pipeline_name: ``pipeline`` label of the pushed decision
        run_name: ``run`` label of the pushed decision (the pipeline run's name)
        non_inferiority_margin: per task, the largest tolerated worsening of its per-example error (default
            for a task not named: 10 % of the champion's mean error on it)

    Returns:
        whether the gate lets the candidate be promoted (``promote`` decides under the store's lock)
    """
    from mtlflow.jobs import pipeline_steps
    from mtlflow.jobs.step_outputs import decision_metadata

    outcome = pipeline_steps.compare_to_champion(run.path, data.path, model_store, min_improvement, decision.path,
                                                 pushgateway, pipeline_name, run_name, non_inferiority_margin)
    decision.metadata.update(decision_metadata(outcome))
    for name, value in outcome["metrics"].items():
        metrics.log_metric(name, value)
    return outcome["promote"]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote(run: dsl.Input[dsl.Artifact], evaluation: dsl.Input[dsl.Artifact], decision: dsl.Input[dsl.Artifact],
            data: dsl.Input[dsl.Dataset], model_store: str, metrics: dsl.Output[dsl.Metrics],
            pushgateway: str = "", pipeline_name: str = "", run_name: str = "") -> str:
    """Write the model, its metadata (metrics, data version, lineage, the digests of the rows it has seen)
    and the gate's ``decision`` to the model store atomically and make it the champion, if the decision was
    made against the champion still in place (checked under the store's lock). The outcome decided under
    the lock (promoted, or "kept: another retrain promoted X first") settles the decision record and goes to
    the UI (``metrics``) and Prometheus. Returns the version path (empty when another run was promoted
    meanwhile).

    Args:
        run: the run directory (run.json, metrics.json, model.pt, report)
        evaluation: the candidate's evaluation JSON (metrics, confusion matrices), stored with the version
        decision: the decision record of ``compare_to_champion``
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        model_store: model store path (champion per benchmark)
        metrics: ``promoted`` (the outcome) and the gate's numbers
        pushgateway: Prometheus Pushgateway for the outcome (``""``: ``$MTLFLOW_PUSHGATEWAY``, else off)
        pipeline_name: ``pipeline`` label of the pushed outcome
        run_name: ``run`` label of the pushed outcome (the pipeline run's name)

    Returns:
        the version path (empty when another run was promoted meanwhile)
    """
    from mtlflow.jobs import pipeline_steps

    outcome = pipeline_steps.promote(run.path, evaluation.path, decision.path, dict(data.metadata), model_store,
                                     data.path, pushgateway, pipeline_name, run_name)
    for name, value in outcome["metrics"].items():
        metrics.log_metric(name, value)
    return outcome["path"]
