"""plan_baselines / baseline: the sweep's per-task baselines (the trivial predictor, and for a table a boosted and a
linear model), fitted on the training rows and written as run-like directories that ``aggregate`` shows beside the
methods (``mtlflow baseline``, :mod:`mtlflow.jobs.baselines`).

The kinds are planned from the prepared data (:func:`mtlflow.jobs.baselines.applicable_kinds`), so a sweep on
images fits the trivial baseline only and no step is refused.
"""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE

#: compiled in every sweep and run under kfp.local by its tests; not yet run on a cluster
STABILITY = "beta"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_baselines(data: dsl.Input[dsl.Dataset]) -> List[str]:
    """The baseline kinds that fit the prepared data: ``trivial`` for binary, multi-label, multiclass and
    regression tasks, ``hgb`` and ``linear`` too for a table of features, none for other tasks.

    Args:
        data: the prepared dataset

    Returns:
        the baseline kinds to fit
    """
    from mtlflow.jobs.baselines import applicable_kinds

    return applicable_kinds(data.path)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def baseline(data: dsl.Input[dsl.Dataset], kind: str, run: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics],
             cache_root: str = ""):
    """Fit the ``kind`` baseline of every task on the training rows of ``data`` and score it on every split;
    reused from the cache when the same data (by content hash) had it fitted before.

    Args:
        data: the prepared dataset
        kind: ``trivial``, ``hgb`` or ``linear`` (``plan_baselines``)
        run: the baseline's run-like directory (run.json, metrics.json, the per-example test evaluation)
        metrics: each task's test metrics, shown in the Kubeflow UI
        cache_root: where baselines are cached by data hash across pipeline runs (empty: ``$MTLFLOW_CACHE``)
    """
    import os

    from mtlflow.jobs.baselines import baseline as fit

    if cache_root:
        os.environ["MTLFLOW_CACHE"] = cache_root
    outcome = fit(data.path, kind, run.path)
    run.metadata.update({key: outcome[key] for key in ("kind", "method", "key", "source")})
    for task, values in outcome["metrics"]["test"].items():
        for name, value in values.items():
            metrics.log_metric(f"{task}.{name}", value)
