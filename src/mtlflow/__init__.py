"""mtlflow: multi-task learning optimisation methods, benchmarks and pipelines.

The public entry points are:

* :mod:`mtlflow.methods` -- the method registry (``available()``, ``build(name, n_tasks, **hparams)``);
* :mod:`mtlflow.benchmarks` -- the benchmark registry (``available()``, ``get(name)``);
* :class:`mtlflow.engine.trainer.Trainer` -- the training engine shared by every method;
* :class:`mtlflow.MTLBackward` and :func:`mtlflow.mtl_backward` -- library mode: a method inside the user's own
  training loop (:mod:`mtlflow.engine.library`);
* :mod:`mtlflow.jobs` -- the functions behind the CLI, the DVC stages and the Kubeflow components;
* :mod:`mtlflow.metrics.scoring` -- Δm%, mean rank, hypervolume and Pareto-set extraction.

Heavy optional dependencies (kfp, dvc, peft, torch_geometric) are imported lazily.
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # library mode is imported on first use, so that `import mtlflow` stays free of torch
    if name in ("MTLBackward", "mtl_backward"):
        from mtlflow.engine import library  # noqa: PLC0415 -- `import mtlflow` stays free of torch

        return getattr(library, name)
    raise AttributeError(f"module 'mtlflow' has no attribute {name!r}")
