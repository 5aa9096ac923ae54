"""plan_runs / plan_references: expand the sweep into JSON run specifications.

Loop items are JSON strings rather than structs: struct numbers arrive as floats on some backends,
and a string spec keeps every field exact.
"""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_runs(methods: List[str], seeds: List[int], method_hparams: dict) -> List[str]:
    """One spec per (method, seed): ``{"method", "seed", "hparams"}``; methods are validated here.

    Args:
        methods: method names (``mtlflow methods``)
        seeds: seeds
        method_hparams: ``{method: {name: value}}``

    Returns:
        the run specs (JSON strings), one per (method, seed)
    """
    from mtlflow.config.pipeline import plan_runs as plan

    return plan(methods, seeds, method_hparams)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_references(tasks: List[str], seeds: List[int]) -> List[str]:
    """One single-task reference spec per (task, seed):
    ``{"method": "ls", "tasks": [task], "seed", "reference": true}``.

    Args:
        tasks: the benchmark's task names
        seeds: seeds

    Returns:
        the reference specs (JSON strings), one per (task, seed)
    """
    from mtlflow.config.pipeline import plan_references as plan

    return plan(tasks, seeds)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_run(method: str, seed: int, hparams: dict) -> str:
    """The spec of a single run (``retrain``): ``{"method", "seed", "hparams"}``; validated here.

    Args:
        method: method name
        seed: seed
        hparams: the method's hyper-parameters

    Returns:
        the run spec (a JSON string)
    """
    from mtlflow.config.pipeline import plan_run as plan

    return plan(method, seed, hparams)
