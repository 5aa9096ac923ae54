"""``main`` -- the pipeline of ``make demo`` -- is ``benchmark_sweep``: the same definition, with its
cluster settings (GPUs, PVCs, retries, Secrets) ignored by kfp.local. Kept as a name for the CLI
(``--pipeline main``) and for code written against issue 2."""

from mtlflow.pipelines.benchmark_sweep import PARALLELISM, build_benchmark_sweep

build_main_pipeline = build_benchmark_sweep
main_pipeline = build_benchmark_sweep()

__all__ = ["PARALLELISM", "build_main_pipeline", "main_pipeline"]
