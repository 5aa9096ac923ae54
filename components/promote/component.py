"""compare_to_champion / promote: gate and store a retrained model in the model store."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def compare_to_champion(run: dsl.Input[dsl.Artifact], evaluation: dsl.Input[dsl.Artifact], model_store: str,
                        min_improvement: float) -> bool:
    """True when the evaluated run beats the champion's stored test metrics by more than
    ``min_improvement`` (mean primary-metric error over tasks), or when there is no champion yet."""
    from mtlflow.jobs import pipeline_steps

    return pipeline_steps.compare_to_champion(run.path, evaluation.path, model_store, min_improvement)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote(run: dsl.Input[dsl.Artifact], evaluation: dsl.Input[dsl.Artifact], data: dsl.Input[dsl.Dataset],
            model_store: str, min_improvement: float) -> str:
    """Write the model and its metadata (metrics, data version, lineage) to the model store atomically
    and make it the champion; re-checks the comparison under the store's lock. Returns the version path
    (empty when a better champion was promoted meanwhile)."""
    import json

    from mtlflow.ops import model_store as store

    with open(evaluation.path) as fh:
        result = json.load(fh)
    data_version = {k: data.metadata.get(k) for k in ("content_hash", "dvc_hash", "dvc_remote", "git_revision",
                                                      "benchmark", "options")}
    record = store.promote(model_store, run.path, result, data=data_version, min_improvement=min_improvement)
    if record is None:
        print("not promoted: the champion changed meanwhile and is at least as good")
        return ""
    print(f"promoted {record['label']} as {record['version']} ({record['reason']})")
    return record["path"]
