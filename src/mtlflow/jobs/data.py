"""Prepared data: build a benchmark's data into a directory with a content hash, and load it back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtlflow import benchmarks
from mtlflow.benchmarks.base import Benchmark, read_manifest
from mtlflow.config.run import RunConfig
from mtlflow.core.errors import DataError, UnknownNameError
from mtlflow.core.hashing import MANIFEST_NAME
from mtlflow.core.outputs import check_output_dir, dataset_dir_guard


def prepare(benchmark: str, out_dir: str | Path, overwrite: bool = False, **config: Any) -> dict[str, Any]:
    """Build ``benchmark``'s data into ``out_dir``; returns the manifest (with ``content_hash``).

    An existing prepared dataset in ``out_dir`` is replaced only with ``overwrite``; any other
    non-empty directory is refused (see :func:`mtlflow.core.outputs.dataset_dir_guard`).
    """
    check_output_dir(out_dir, "--out")
    return prepare_benchmark(benchmarks.build(benchmark, **config), out_dir, overwrite, config)


def prepare_benchmark(bench: Benchmark, out_dir: str | Path, overwrite: bool = False,
                      config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`prepare` of a built benchmark (``config``: the options it was built from, naming its input files):
    a spec benchmark keeps the spec file's name and lines for its errors, which a rebuild from
    ``bench.config`` (the spec as a mapping) would lose."""
    check_output_dir(out_dir, "--out", inputs=source_paths(bench, config if config is not None else bench.config))
    RunConfig.for_benchmark(bench.train_defaults)  # a spec's train: section, refused here rather than at train
    with dataset_dir_guard(out_dir, overwrite=overwrite):
        return bench.prepare(out_dir)


def source_paths(bench: Benchmark, config: Mapping[str, Any]) -> list[tuple]:
    """The local files and folders ``bench``'s data is prepared from, named as the user gave them (the spec
    file, its table and image folder, ``--data-dir``, ``--mnist-dir``): outputs must keep clear of them."""
    # jobs.data is on the import path of `mtlflow --help`: the spec benchmark (its pydantic schema) loads on use
    from mtlflow.benchmarks.spec import SpecBenchmark  # noqa: PLC0415

    paths: list[tuple] = [(f"--{key.replace('_', '-')}", config.get(key))
                                    for key in ("spec", "data_dir", "mnist_dir") if isinstance(config.get(key), str)]
    if isinstance(bench, SpecBenchmark):
        source = bench.spec.source
        if source.repo is None and "://" not in source.table:
            paths.append(("the spec's table", source.table))
        if source.images is not None and "://" not in source.images:
            # its images are read by name: outputs may go inside it (it is often the spec's own folder)
            paths.append(("the spec's image folder", source.images, True))
    # a URI or an inline {repo: ...} location is not a local path
    return [entry for entry in paths if entry[1] and "://" not in str(entry[1]) and not str(entry[1]).startswith("{")]


def check_expected_hash(data_dir: str | Path, manifest: Mapping[str, Any], expected_hash: str | None) -> None:
    """Refuse data whose manifest hash is not the one a run was configured with (None: any)."""
    if expected_hash is not None and manifest["content_hash"] != expected_hash:
        raise DataError(f"data in {data_dir} has hash {manifest['content_hash'][:12]}, expected "
                        f"{expected_hash[:12]}; use the data version the run was configured with")


def manifest_benchmark(data_dir: str | Path, manifest: Mapping[str, Any]) -> Benchmark:
    """The benchmark a prepared data directory's manifest names; a name no installed benchmark has is a
    DataError naming the manifest (the data was prepared by a plug-in that is not installed here, or edited)."""
    try:
        return benchmarks.build(manifest["benchmark"], **manifest.get("config", {}))
    except UnknownNameError as exc:
        raise DataError(f"{Path(data_dir) / MANIFEST_NAME} names benchmark {manifest['benchmark']!r}, which is not "
                        f"installed here ({exc}); install its plug-in or prepare the data again") from None


def load_prepared(data_dir: str | Path, verify: bool = True, expected_hash: str | None = None):
    """Benchmark object and loaded splits of a prepared data directory."""
    manifest = read_manifest(data_dir)
    check_expected_hash(data_dir, manifest, expected_hash)
    bench = manifest_benchmark(data_dir, manifest)
    return bench, bench.load(data_dir, verify=verify)
