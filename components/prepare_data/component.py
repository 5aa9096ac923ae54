"""prepare_data: build (or fetch) a benchmark's data as a versioned Dataset artifact."""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare_data(benchmark: str, options: dict, data: dsl.Output[dsl.Dataset], data_version: str = "",
                 dvc_remote: str = "", default_remote: str = "", dvc_cache: str = "") -> List[str]:
    """Prepare ``benchmark`` with ``options`` and push it to the DVC remote, or, when ``data_version``
    (a DVC ``<md5>.dir`` hash) is given, pull that version from the remote instead. Returns the task names.

    The remote is ``dvc_remote``, else ``$MTLFLOW_DVC_REMOTE`` (from the ``mtlflow-dvc-remote`` Secret on
    the cluster), else ``default_remote`` (a local directory); with none of them the data is hashed
    but not pushed. The artifact metadata records the benchmark, its options, the task names, the
    SHA-256 content hash and the data version ``{git_revision, dvc_hash, dvc_remote}``; training
    refuses data that does not match them.
    """
    from mtlflow import jobs
    from mtlflow.benchmarks.base import read_manifest
    from mtlflow.config.pipeline import from_struct
    from mtlflow.core.errors import InvalidParameterError
    from mtlflow.ops import dvc as dvc_io

    options = from_struct(options)
    remote = dvc_io.resolve_remote(dvc_remote, default_remote)
    if data_version:
        if not remote:
            raise InvalidParameterError("data_version needs a DVC remote: set dvc_remote or $MTLFLOW_DVC_REMOTE")
        dvc_io.pull_dataset(data_version, remote, data.path, cache_dir=dvc_cache or None)
        manifest = read_manifest(data.path)
        if manifest["benchmark"] != benchmark:
            raise InvalidParameterError(f"data version {data_version} holds {manifest['benchmark']} data, "
                                        f"not {benchmark}; set benchmark={manifest['benchmark']}")
        options = manifest.get("config", {})
        version = {"git_revision": dvc_io.git_revision(), "dvc_hash": data_version, "dvc_remote": remote}
    else:
        manifest = jobs.prepare(benchmark, data.path, **options)
        version = dvc_io.version_metadata(data.path, remote)
    data.metadata.update({"benchmark": benchmark, "options": options, "tasks": manifest["tasks"],
                          "content_hash": manifest["content_hash"], **version})
    return list(manifest["tasks"])
