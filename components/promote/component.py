"""compare_to_champion / promote: gate and store a retrained model in the model store."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def compare_to_champion(run: dsl.Input[dsl.Artifact], data: dsl.Input[dsl.Dataset], model_store: str,
                        min_improvement: float, decision: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics],
                        pushgateway: str = "", pipeline_name: str = "", run_name: str = "") -> bool:
    """Evaluate the candidate ``run`` and the model store's champion on the same test split, ``data``'s
    (the new data version), and return True when the candidate is better with confidence (paired
    bootstrap over test examples, Bonferroni over tasks) by at least ``min_improvement``, or when there is
    no champion yet. The decision record goes to ``decision`` (for ``promote``), the model store's
    ``decisions/``, the UI (``metrics``: both models' metrics on the split, the intervals, n) and
    Prometheus (``pushgateway``)."""
    from mtlflow.jobs import pipeline_steps

    outcome = pipeline_steps.compare_to_champion(run.path, data.path, model_store, min_improvement, decision.path,
                                                 pushgateway, pipeline_name, run_name)
    record = outcome["decision"]
    decision.metadata.update({"promote": outcome["promote"], "reason": record["reason"], "split": record["split"],
                              "data_hash": record["data_hash"],
                              "champion": record["champion"]["version"] if record["champion"] else None,
                              "rule": record["gate"]["rule"] if record["gate"] else "no champion: promote"})
    for name, value in outcome["metrics"].items():
        metrics.log_metric(name, value)
    return outcome["promote"]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote(run: dsl.Input[dsl.Artifact], evaluation: dsl.Input[dsl.Artifact], decision: dsl.Input[dsl.Artifact],
            data: dsl.Input[dsl.Dataset], model_store: str) -> str:
    """Write the model, its metadata (metrics, data version, lineage) and the gate's ``decision`` to the
    model store atomically and make it the champion, if the decision was made against the champion still
    in place (checked under the store's lock). Returns the version path (empty when another run was
    promoted meanwhile)."""
    from mtlflow.jobs import pipeline_steps

    return pipeline_steps.promote(run.path, evaluation.path, decision.path, dict(data.metadata), model_store)
