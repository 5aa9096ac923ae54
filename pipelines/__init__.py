"""Kubeflow pipeline definitions (``benchmark_sweep`` alias ``main``, ``retrain``, ``distributed_train``),
their cluster settings (``cluster.py``), compilation and local execution (``runner.py``)."""
