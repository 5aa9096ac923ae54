from pathlib import Path

from kfp import dsl

from mtlflow.components.prepare_data.component import prepare_data
from mtlflow.core.hashing import directory_hash


def test_prepare_data_writes_dataset_with_hash(tiny_dataset):
    data, tasks = tiny_dataset
    assert tasks == ["left", "right"]
    root = Path(data.path)
    assert {p.name for p in root.iterdir()} == {"manifest.json", "train.pt", "val.pt", "test.pt", "row_hashes.npz"}
    assert data.metadata["content_hash"] == directory_hash(root)
    assert data.metadata["benchmark"] == "multimnist"
    assert data.metadata["tasks"] == ["left", "right"]


def test_prepare_data_accepts_struct_floats(tmp_path):
    """Dict parameters arrive as protobuf structs, whose integers are floats."""

    data = dsl.Dataset(uri=str(tmp_path / "data"))
    prepare_data.python_func(benchmark="toy", data_options={"start": 1.0, "steps_per_epoch": 10.0}, data=data)
    assert data.metadata["data_options"] == {"start": 1, "steps_per_epoch": 10}
