"""launch_trainjob under kfp.local's SubprocessRunner, as far as a machine without a Kubernetes API server
lets it run: the component's subprocess stages the dataset on the "PVC" and refuses an unknown job kind in one
line before any request to the API (test_component.py drives the rest in-process, against a stand-in for the
API that a subprocess could not see)."""

import json

import pytest
from kfp import dsl

from mtlflow.components.launch_trainjob.component import launch_trainjob

pytestmark = pytest.mark.integration


def test_launcher_refuses_an_unknown_kind_under_the_local_runner(local_runner, tiny_dataset, tmp_path, capfd):
    data, _ = tiny_dataset

    @dsl.pipeline(name="launch-locally")
    def launch_locally(storage_root: str):
        dataset = dsl.importer(artifact_uri=data.uri, artifact_class=dsl.Dataset, metadata=dict(data.metadata))
        launch_trainjob(data=dataset.output, run_spec=json.dumps({"method": "ls", "seed": 0, "hparams": {}}),
                        epochs=1, train_options={}, storage_root=storage_root, kind="MPIJob",
                        image="registry.example/mtlflow:1", namespace="ml")

    with pytest.raises(RuntimeError):
        launch_locally(storage_root=str(tmp_path / "mnt"))
    printed = capfd.readouterr()
    assert "unknown job kind" in printed.out + printed.err
    assert "submitting" not in printed.out  # refused before the first request
    assert (tmp_path / "mnt" / "data" / "datasets" / data.metadata["content_hash"] / "manifest.json").is_file()
