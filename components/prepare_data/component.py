"""prepare_data: build (or fetch) a benchmark's data as a versioned Dataset artifact."""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_pipeline_local.py) and in the image (tests/e2e)
STABILITY = "stable"
SERVICES = ("a DVC remote (optional: dvc_remote, $MTLFLOW_DVC_REMOTE or default_remote)",)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare_data(benchmark: str, data_options: dict, data: dsl.Output[dsl.Dataset], data_version: str = "",
                 dvc_remote: str = "", default_remote: str = "", dvc_cache: str = "", spec: str = "",
                 spec_rev: str = "") -> List[str]:
    """Prepare ``benchmark`` with ``data_options`` -- or the user's data described by the task spec ``spec``
    (a path on the data volume or a URI; ``spec_rev``: the revision of its DVC-tracked table) -- and push it
    to the DVC remote, or, when ``data_version`` (a DVC ``<md5>.dir`` hash) is given, pull that version from
    the remote instead. Returns the task names.

    The remote is ``dvc_remote``, else ``$MTLFLOW_DVC_REMOTE`` (from the ``mtlflow-dvc-remote`` Secret on
    the cluster), else ``default_remote`` (a local directory); with none of them the data is hashed
    but not pushed. The artifact metadata records the benchmark, its data options, the task names, the
    SHA-256 content hash and the data version ``{git_revision, dvc_hash, dvc_remote}``; training
    refuses data that does not match them.

    The pipelines run it uncached: the Secret's remote is not part of a KFP cache key, and a cache
    hit would skip the push to a newly configured remote (docs/guides/kubeflow.md, Caching).

    Args:
        benchmark: benchmark name (``mtlflow benchmarks``)
        data_options: the benchmark's preparation options (``DataConfig.data_options``)
        data: the prepared dataset, with its content and DVC hashes in the metadata
        data_version: a DVC hash to pull instead of preparing
        dvc_remote: DVC remote URL
        default_remote: the remote used when ``dvc_remote`` is empty
        dvc_cache: DVC cache directory
        spec: a task spec of your own data (path on the data volume or URI; ``''`` = the benchmark)
        spec_rev: git revision of the spec's DVC-tracked table (overrides ``source.rev``)

    Returns:
        the task names
    """
    from mtlflow.jobs import pipeline_steps

    metadata = pipeline_steps.prepare_data(benchmark, data_options, data.path, data_version, dvc_remote,
                                           default_remote, dvc_cache, spec, spec_rev)
    data.metadata.update(metadata)
    return list(metadata["tasks"])
