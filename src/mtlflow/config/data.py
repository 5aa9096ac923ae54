"""The configuration of a data set: the benchmark and its preparation options, under one name everywhere.

``mtlflow prepare --benchmark B --data-option KEY=VALUE``, ``params.yaml``'s ``benchmark`` and
``data_options``, the pipelines' parameters of the same names and ``jobs.prepare(benchmark, out,
**data_options)`` are all :class:`DataConfig`. The options themselves are declared by each benchmark
(:class:`mtlflow.core.hparams.ConfigField`; ``mtlflow benchmarks`` lists them) and checked by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mtlflow import benchmarks
from mtlflow.config.model import ConfigModel, option
from mtlflow.core.errors import InvalidParameterError

_DIR_HASH = re.compile(r"^[0-9a-f]{32}\.dir$")


def check_dir_hash(dvc_hash: str) -> str:
    """A DVC directory hash (``<32 hex digits>.dir``), the version of a data set."""
    if not isinstance(dvc_hash, str) or not _DIR_HASH.match(dvc_hash):
        raise InvalidParameterError(f"data version {dvc_hash!r} is not a DVC directory hash; give the "
                                    "'<32 hex digits>.dir' value recorded as dvc_hash in the dataset metadata")
    return dvc_hash


@dataclass
class DataConfig(ConfigModel):
    """The data set of a run: a benchmark and its preparation options, or a task spec of the user's data."""

    subject = "data options"

    benchmark: str = option("multimnist", "the benchmark (see `mtlflow benchmarks`); 'spec' with a task spec")
    data_options: dict[str, Any] = option(help="the benchmark's preparation options, e.g. n_train=2000 (see "
                                               "`mtlflow benchmarks`)", factory=dict, flag="--data-option")
    spec: str = option("", "a task spec of your own data: the path or URI of its YAML file, or a file of a git/DVC "
                           "repository as '{repo: URL, path: FILE, rev: REV}' ('' = the benchmark)")
    spec_rev: str = option("", "the git revision to read: of the spec's DVC-tracked table (overrides source.rev) "
                               "and of a spec file read from a repository ('' = the spec's)")

    def validate(self) -> None:
        self.check_types()
        if self.spec_rev and not self.spec:
            raise InvalidParameterError("spec_rev needs spec: give the task spec whose table revision it selects")
        self.build_benchmark()  # unknown benchmarks and options are refused by the benchmark

    #: the values of ``benchmark`` that go with a spec: the rule, stated once (docs/guides/your-data.md, dvc.md)
    SPEC_BENCHMARKS = ("spec", "")

    def preparation(self) -> tuple[str, dict[str, Any]]:
        """The benchmark to prepare and its options: ``("spec", {"spec": ..., "rev": ...})`` for a task spec.

        With a spec, the spec describes the data: ``data_options`` must be empty and ``benchmark`` must be
        ``spec``, ``""`` or left at its default (``multimnist``, which the pipelines' and params.yaml's
        defaults carry); anything else would be silently ignored, so it is refused naming what to set."""
        if not self.spec:
            return self.benchmark, dict(self.data_options)
        fixes = []
        if self.benchmark not in (*self.SPEC_BENCHMARKS, DataConfig.benchmark):
            fixes.append((f"benchmark={self.benchmark}", "benchmark: spec"))
        if self.data_options:
            fixes.append((f"data_options ({', '.join(map(str, self.data_options))})", "data_options: {}"))
        if fixes:
            raise InvalidParameterError(f"spec {self.spec} describes the data, so {' and '.join(g for g, _ in fixes)} "
                                        f"do not apply; set {' and '.join(f for _, f in fixes)} (or spec: '' to "
                                        "prepare the benchmark instead)")
        return "spec", {"spec": self.spec, **({"rev": self.spec_rev} if self.spec_rev else {})}

    def build_benchmark(self) -> benchmarks.Benchmark:
        name, options = self.preparation()
        return benchmarks.build(name, **options)


@dataclass
class VersionedDataConfig(DataConfig):
    """A data set as the pipelines take it: prepared and versioned with DVC, or a version already stored."""

    data_version: str = option("", "DVC directory hash of a stored data version to train on ('' = prepare the data "
                                   "now and version it)")
    dvc_remote: str = option("", "DVC remote URL ('' = the remote of the storage layout)")

    def validate(self) -> None:
        super().validate()
        if self.data_version:
            check_dir_hash(self.data_version)
