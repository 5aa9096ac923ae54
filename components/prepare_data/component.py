"""prepare_data: build a benchmark's data into a Dataset artifact with its content hash."""

from typing import List

from kfp import dsl

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare_data(benchmark: str, options: dict, data: dsl.Output[dsl.Dataset]) -> List[str]:
    """Prepare ``benchmark`` with ``options``; returns the task names.

    The artifact metadata records the benchmark, its options, the task names and the SHA-256
    content hash that training checks before it starts.
    """
    from mtlflow import jobs
    from mtlflow.pipeline_specs import from_struct

    options = from_struct(options)
    manifest = jobs.prepare(benchmark, data.path, **options)
    data.metadata.update({"benchmark": benchmark, "options": options, "tasks": manifest["tasks"],
                          "content_hash": manifest["content_hash"]})
    return list(manifest["tasks"])
