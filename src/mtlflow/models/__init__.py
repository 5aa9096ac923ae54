"""Network architectures used by the benchmarks."""
