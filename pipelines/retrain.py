r"""retrain: retrain the production method on a new data version and promote it only if it beats
the champion.

    ExitHandler(record_status) {
      prepare_data (pull data_version or prepare + DVC push) → tuned_run (the candidate: method and hparams,
        or a tune.json's winner, `tuned`) → train (GPU, resumable)
        → evaluate (test) → compare_to_champion (candidate AND champion on the new test split)
        ── If(better) → promote (model store, atomic)
    }

The champion lives in the model store (``<storage>/models/<benchmark>/champion.json``, on the models
PVC on the cluster). ``compare_to_champion`` takes the new prepared data and evaluates the candidate
and the champion's ``model.pt`` on its test split: the champion's stored metrics, measured on the data
version it was trained on, are never compared, nor the test rows the champion trained on. It promotes when
the candidate is better with confidence (paired bootstrap over the test examples;
:mod:`mtlflow.metrics.paired`) by at least ``min_improvement`` and non-inferior on every task (Bonferroni
over the tasks, within ``non_inferiority_margin``). ``promote`` stores the decision with the model and
checks, under the store's lock, that the decision was made against the champion still in place; the
outcome decided there (promoted, or kept because another retrain promoted first) is what the decision
record, ``retrain.json``, Prometheus and the UI report.
"""

from kfp import dsl

from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.promote.component import compare_to_champion, promote
from mtlflow.components.tune.component import tuned_run
from mtlflow.config.pipeline import RetrainConfig
from mtlflow.ops.storage import CLUSTER_ROOT, StorageLayout
from mtlflow.pipelines import cluster
from mtlflow.pipelines.benchmark_sweep import PARALLELISM, status_handler, training, versioned_data

#: the pipeline's parameters: RetrainConfig's fields, with its defaults
DEFAULTS = RetrainConfig.defaults()


def build_retrain(parallelism: int = PARALLELISM, storage_root: str = CLUSTER_ROOT):
    """``parallelism`` is unused (one run) and accepted for the common factory signature."""
    layout = StorageLayout(storage_root)

    @dsl.pipeline(name="mtlflow-retrain", description="Retrain one method on a new data version, evaluate it and "
                  "the champion on the new test split and promote it to the model store if better with confidence.")
    def retrain(
        benchmark: str = DEFAULTS["benchmark"],
        data_options: dict = DEFAULTS["data_options"],
        spec: str = DEFAULTS["spec"],
        spec_rev: str = DEFAULTS["spec_rev"],
        data_version: str = DEFAULTS["data_version"],
        dvc_remote: str = DEFAULTS["dvc_remote"],
        method: str = DEFAULTS["method"],
        seed: int = DEFAULTS["seed"],
        hparams: dict = DEFAULTS["hparams"],
        epochs: int = DEFAULTS["epochs"],
        train_options: dict = DEFAULTS["train_options"],
        min_improvement: float = DEFAULTS["min_improvement"],
        non_inferiority_margin: dict = DEFAULTS["non_inferiority_margin"],
        tuned: str = DEFAULTS["tuned"],
        pushgateway: str = DEFAULTS["pushgateway"],
    ):
        with dsl.ExitHandler(status_handler("retrain", layout, pushgateway), name="retrain"):
            prep = versioned_data(layout, benchmark, data_options, spec, spec_rev, data_version, dvc_remote)
            # the candidate: method and hparams, or the winner of a tuning result (on the checkpoints volume)
            spec = tuned_run(tuned=tuned, method=method, seed=seed, hparams=hparams, train_options=train_options)
            cluster.mount(cluster.light(spec), layout, "mtlflow-checkpoints")
            trained = training(layout, prep.outputs["data"], spec.outputs["run_spec"], epochs,
                               spec.outputs["options"], pushgateway, "retrain")
            trained.set_display_name("train candidate")
            scored = cluster.light(evaluate(data=prep.outputs["data"], run=trained.outputs["run"], split="test"))
            decision = compare_to_champion(run=trained.outputs["run"], data=prep.outputs["data"],
                                           model_store=layout.models, min_improvement=min_improvement,
                                           pushgateway=pushgateway, pipeline_name="retrain",
                                           run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                                           non_inferiority_margin=non_inferiority_margin)
            decision.set_display_name("compare with champion")
            cluster.mount(cluster.uncached(cluster.light(decision)), layout, "mtlflow-models")
            promote_it = decision.outputs["Output"] == True  # noqa: E712 (a KFP condition, not a Python comparison)
            with dsl.If(promote_it, name="better-than-champion"):
                promoted = promote(run=trained.outputs["run"], evaluation=scored.outputs["evaluation"],
                                   decision=decision.outputs["decision"], data=prep.outputs["data"],
                                   model_store=layout.models, pushgateway=pushgateway, pipeline_name="retrain",
                                   run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)
                promoted.set_display_name("promote to model store")
                cluster.mount(cluster.uncached(cluster.light(promoted)), layout, "mtlflow-models")

    return retrain
