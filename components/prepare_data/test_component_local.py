"""prepare_data under kfp.local's SubprocessRunner: the Dataset artifact and its metadata cross kfp's
executor, and the content hash is the prepared folder's."""

import pytest

from mtlflow.components.conftest import TINY
from mtlflow.components.prepare_data.component import prepare_data
from mtlflow.core.hashing import directory_hash

pytestmark = pytest.mark.integration


def test_prepare_data_runs_under_the_local_runner(local_runner):
    task = prepare_data(benchmark="multimnist", data_options=dict(TINY))
    data = task.outputs["data"]
    assert task.outputs["Output"] == ["left", "right"]
    assert data.metadata["content_hash"] == directory_hash(data.path)
    assert data.metadata["benchmark"] == "multimnist" and data.metadata["tasks"] == ["left", "right"]
