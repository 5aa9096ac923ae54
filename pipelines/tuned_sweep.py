r"""tuned_sweep: ``mtlflow tune`` as a pipeline -- every method (LS always, the baseline) and every single-task
reference tuned under the same budget in optimizer steps, the chosen configurations retrained with fresh seeds and
compared -- and always record how the run ended.

    ExitHandler(record_status) {
      prepare_data (DVC push) ─┬─ If(tuner == optuna):
                               │    plan_tuning ── ParallelFor(study: tune_study) ── compare_tuned
                               └─ If(tuner == katib):
                                    launch_katib ── plan_tuned_runs ─┬─ ParallelFor(train → evaluate) ─┐
                                                                     └─ ParallelFor(train) ─────────────┴─ aggregate
    }

``tuner`` decides where the studies run, as ``job_kind`` picks the training job of ``distributed_train``:
``optuna`` (the default, and kfp.local's only choice) runs one task per study, all of them sharing one Optuna
journal in a work directory on the checkpoints volume, then ``compare_tuned`` retrains and compares -- the same
``tune.json`` that ``mtlflow tune`` writes for the same request; ``katib`` (cluster only) creates one Katib
Experiment per method (``launch_katib``), its trials TrainJobs, then retrains each method's best trial with the
sweep's own train, evaluate and aggregate components. Katib tunes the methods only: its single-task references
train with tuned LS's settings.

Caching: as in ``benchmark_sweep``, ``prepare_data``'s output is new in every run, so nothing downstream is served
from KFP's cache; a retried study task resumes from the journal (the work directory's key holds the run's name).
"""

from typing import List

from kfp import dsl

from mtlflow.components.aggregate.component import aggregate
from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.image import IMAGE
from mtlflow.components.launch_katib.component import launch_katib
from mtlflow.components.tune.component import (
    compare_tuned,
    plan_tuned_runs,
    plan_tuning,
    trial_options,
    tune_study,
    tuning_arguments,
)
from mtlflow.config.pipeline import TUNE_FIELDS, TunedSweepConfig
from mtlflow.ops.storage import CLUSTER_ROOT, StorageLayout
from mtlflow.pipelines import cluster
from mtlflow.pipelines.benchmark_sweep import PARALLELISM, status_handler, training, versioned_data

#: the pipeline's parameters: TunedSweepConfig's fields, with its defaults (`mtlflow config schema --of tuned_sweep`)
DEFAULTS = TunedSweepConfig.defaults()


def local_studies(layout: StorageLayout, data, arguments, parallelism: int) -> None:
    """One task per study on a shared work directory, then the tune job's own retrain and comparison."""
    shared = {"data": data, "work_root": layout.checkpoints, "run_name": dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
              "arguments": arguments}
    plan = plan_tuning(**shared)
    cluster.mount(cluster.light(plan), layout, "mtlflow-checkpoints")
    with dsl.ParallelFor(plan.output, parallelism=parallelism) as item:  # an item carries its study's settings
        searched = tune_study(item=item, **{k: v for k, v in shared.items() if k != "arguments"})
        searched.set_display_name("tune study")
        cluster.uncached(cluster.gpu_training(searched, layout))
    compared = compare_tuned(studies=dsl.Collected(searched.output), **shared)
    compared.set_display_name("retrain and compare tuned")
    cluster.uncached(cluster.gpu_training(compared, layout))


def katib_studies(layout: StorageLayout, prep: dsl.PipelineTask, params: dict, parallelism: int) -> None:
    """One Katib Experiment per method, then each best trial retrained with the sweep's own components."""
    data = prep.outputs["data"]
    profile = cluster.active_profile()
    options = cluster.light(trial_options(train_options=params["train_options"], epochs=params["epochs"]))
    tuned = launch_katib(data=data, methods=params["methods"], storage_root=layout.root, image=IMAGE,
                         tasks=params["tasks"], budget_trials=params["budget_trials"],
                         budget_steps=params["budget_steps"], seed=params["seed"],
                         search_spaces=params["search_spaces"], hparams=params["method_hparams"],
                         train_options=options.output, parallel_trials=params["parallel_trials"],
                         startup_trials=params["startup_trials"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                         timeout_seconds=profile.trainjob.deadline_seconds,
                         profile=profile.model_dump(mode="json", exclude_none=True))
    tuned.set_display_name("tune with Katib")
    cluster.job_launcher(tuned, layout)
    plan = cluster.light(plan_tuned_runs(studies=tuned.outputs["Output"], seed=params["seed"],
                                         retrain_seeds=params["retrain_seeds"], task_names=prep.outputs["Output"],
                                         tasks=params["tasks"], train_options=params["train_options"]))
    per_loop = cluster.loop_parallelism(parallelism, loops=2)
    epochs, gateway = params["epochs"], params["pushgateway"]
    with dsl.ParallelFor(plan.outputs["runs"], parallelism=per_loop) as run:
        trained = training(layout, data, run.run_spec, epochs, run.train_options, gateway, "tuned_sweep")
        trained.set_display_name("retrain tuned method")
        cluster.light(evaluate(data=data, run=trained.outputs["run"], split="test"))
    with dsl.ParallelFor(plan.outputs["references"], parallelism=per_loop) as ref:
        reference = training(layout, data, ref.run_spec, epochs, ref.train_options, gateway, "tuned_sweep")
        reference.set_display_name("retrain single-task reference")
    cluster.uncached(cluster.light(aggregate(
        runs=dsl.Collected(trained.outputs["run"]), references=dsl.Collected(reference.outputs["run"]),
        method_set=params["methods"], pushgateway=gateway, pipeline_name="tuned_sweep",
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)))


def build_tuned_sweep(parallelism: int = PARALLELISM, storage_root: str = CLUSTER_ROOT):
    """The tuned sweep with at most ``parallelism`` concurrent study (or retraining) tasks per loop and its state
    under ``storage_root`` (compile-time settings, as for ``benchmark_sweep``)."""
    layout = StorageLayout(storage_root)

    @dsl.pipeline(name="mtlflow-tuned-sweep", description="Tune every MTL method and the single-task references "
                  "under the same budget (Optuna studies, or Katib on the cluster), retrain the chosen "
                  "configurations with fresh seeds and compare them against tuned LS; the run status is always "
                  "recorded.")
    def tuned_sweep(
        benchmark: str = DEFAULTS["benchmark"],
        data_options: dict = DEFAULTS["data_options"],
        spec: str = DEFAULTS["spec"],
        spec_rev: str = DEFAULTS["spec_rev"],
        data_version: str = DEFAULTS["data_version"],
        dvc_remote: str = DEFAULTS["dvc_remote"],
        methods: List[str] = DEFAULTS["methods"],
        tasks: List[str] = DEFAULTS["tasks"],
        method_hparams: dict = DEFAULTS["method_hparams"],
        search_spaces: dict = DEFAULTS["search_spaces"],
        budget_trials: int = DEFAULTS["budget_trials"],
        budget_steps: int = DEFAULTS["budget_steps"],
        seed: int = DEFAULTS["seed"],
        retrain_seeds: int = DEFAULTS["retrain_seeds"],
        pruner: str = DEFAULTS["pruner"],
        startup_trials: int = DEFAULTS["startup_trials"],
        selection: str = DEFAULTS["selection"],
        folds: int = DEFAULTS["folds"],
        tuner: str = DEFAULTS["tuner"],
        parallel_trials: int = DEFAULTS["parallel_trials"],
        epochs: int = DEFAULTS["epochs"],
        train_options: dict = DEFAULTS["train_options"],
        pushgateway: str = DEFAULTS["pushgateway"],
    ):
        params = dict(locals())
        with dsl.ExitHandler(status_handler("tuned_sweep", layout, pushgateway), name="tuned-sweep"):
            prep = versioned_data(layout, benchmark, data_options, spec, spec_rev, data_version, dvc_remote)
            with dsl.If(tuner == "optuna", name="optuna-studies"):
                arguments = cluster.light(tuning_arguments(**{k: params[k] for k in TUNE_FIELDS}))
                local_studies(layout, prep.outputs["data"], arguments.output, parallelism)
            with dsl.If(tuner == "katib", name="katib-experiments"):
                katib_studies(layout, prep, params, parallelism)

    return tuned_sweep
