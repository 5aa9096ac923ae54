r"""The main job: prepare -> train every (method, seed) and every single-task reference -> aggregate.

    prepare_data --> plan_runs --> ParallelFor(train -> evaluate) --+
                 \-> plan_references --> ParallelFor(train) -------+--> aggregate (Δm%, MR, HV, Pareto HTML)

``train`` requests one NVIDIA GPU (ignored by the local runner) and uses it when present
(``device="auto"``).
"""


from typing import List

from kfp import dsl

from components.aggregate.component import aggregate
from components.evaluate.component import evaluate
from components.plan_runs.component import plan_references, plan_runs
from components.prepare_data.component import prepare_data
from components.train.component import train

DEFAULT_METHODS = ["ls", "mgda", "famo", "fairgrad"]
#: concurrent training tasks per loop (a compile-time constant in KFP)
PARALLELISM = 4


def request_gpu(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)


def build_main_pipeline(parallelism: int = PARALLELISM):
    """The main pipeline with ``parallelism`` concurrent training tasks per loop (a compile-time
    constant in KFP; local runs set it to the number of CPU cores)."""

    @dsl.pipeline(name="mtlflow-main", description="Train MTL methods and single-task references on one "
                  "prepared benchmark; compare them by Δm%, mean rank, hypervolume and Pareto set.")
    def main_pipeline(
        benchmark: str = "multimnist",
        data_options: dict = {},
        methods: List[str] = DEFAULT_METHODS,
        seeds: List[int] = [0],
        method_hparams: dict = {},
        epochs: int = 10,
        train_options: dict = {"device": "auto"},
        reference_seeds: List[int] = [0],
    ) -> dsl.HTML:
        prep = prepare_data(benchmark=benchmark, options=data_options)
        prep.set_display_name("prepare data")
        runs = plan_runs(methods=methods, seeds=seeds, method_hparams=method_hparams)
        refs = plan_references(tasks=prep.outputs["Output"], seeds=reference_seeds)
        with dsl.ParallelFor(runs.output, parallelism=parallelism) as run_spec:
            trained = request_gpu(train(data=prep.outputs["data"], run_spec=run_spec, epochs=epochs,
                                        train_options=train_options))
            trained.set_display_name("train method")
            evaluate(data=prep.outputs["data"], run=trained.outputs["run"], split="test")
        with dsl.ParallelFor(refs.output, parallelism=parallelism) as ref_spec:
            reference = request_gpu(train(data=prep.outputs["data"], run_spec=ref_spec, epochs=epochs,
                                          train_options=train_options))
            reference.set_display_name("train single-task reference")
        summary = aggregate(runs=dsl.Collected(trained.outputs["run"]),
                            references=dsl.Collected(reference.outputs["run"]), method_set=methods)
        return summary.outputs["report"]

    return main_pipeline


main_pipeline = build_main_pipeline()
