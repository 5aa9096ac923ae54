"""mtlflow: multi-task learning optimisation methods, benchmarks and pipelines.

The public entry points are:

* :mod:`mtlflow.methods` -- the method registry (``available()``, ``build(name, n_tasks, **hparams)``);
* :mod:`mtlflow.benchmarks` -- the benchmark registry (``available()``, ``get(name)``);
* :class:`mtlflow.engine.trainer.Trainer` -- the training engine shared by every method;
* :mod:`mtlflow.jobs` -- the functions behind the CLI, the DVC stages and the Kubeflow components;
* :mod:`mtlflow.metrics.scoring` -- Δm%, mean rank, hypervolume and Pareto-set extraction.

Heavy optional dependencies (kfp, dvc, peft, torch_geometric) are imported lazily.
"""

__version__ = "0.1.0"
