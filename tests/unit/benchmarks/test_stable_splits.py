"""With ``split.key``, a spec table's split is decided row by row (a salted hash of the key), so a new data version
that appends rows leaves every old row in its split; whatever the split rule, the prepared data keeps each row's
content digest (the retrain gate's overlap check)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.unit.benchmarks.test_spec import TASKS, frame, prepared, write

from mtlflow.benchmarks import row_hashes
from mtlflow.benchmarks._spec.schema import SpecError, read_spec

SPEC = {"tasks": TASKS, "features": {"numeric": ["age"]}}


def _split(tmp_path: Path, spec: dict, data: pd.DataFrame) -> np.ndarray:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prepared(tmp_path, spec, data)
    return np.load(tmp_path / "data" / "split.npy")


@pytest.mark.parametrize("split", [{"key": "id"}, {"key": "id", "seed": 7}])
def test_appending_rows_keeps_every_old_row_in_its_split(tmp_path: Path, split: dict) -> None:
    old = frame(300).assign(id=[f"r{i}" for i in range(300)])
    new = pd.concat([old, frame(200, seed=1).assign(id=[f"r{300 + i}" for i in range(200)])], ignore_index=True)
    spec = {**SPEC, "split": split}
    before, after = _split(tmp_path / "v1", spec, old), _split(tmp_path / "v2", spec, new)
    np.testing.assert_array_equal(after[:300], before)
    # the shares are the split's, up to sampling noise (4 standard deviations of a binomial share)
    for code, share in ((1, 0.1), (2, 0.2)):
        assert abs(np.mean(after == code) - share) < 4 * np.sqrt(share * (1 - share) / len(new))


def test_a_key_column_keeps_a_row_in_its_split_when_its_other_cells_change(tmp_path: Path) -> None:
    old = frame(300).assign(id=[f"r{i}" for i in range(300)])
    corrected = old.assign(spend=old["spend"] + 1.0).iloc[::-1]  # every row's cells changed, and the row order
    spec = {**SPEC, "split": {"key": "id"}}
    before, after = _split(tmp_path / "v1", spec, old), _split(tmp_path / "v2", spec, corrected)
    np.testing.assert_array_equal(after[::-1], before)
    unkeyed = _split(tmp_path / "v3", SPEC, corrected)
    assert (unkeyed[::-1] != before).any()  # without the key, corrected rows are new rows


def test_the_row_content_ignores_column_order_and_integer_versus_float_cells() -> None:
    import pyarrow as pa

    from mtlflow.benchmarks._spec.splits import content_digests

    old = frame(200).assign(age=np.arange(200) % 60)  # an integer column
    later = pd.concat([old, pd.DataFrame({**frame(1, seed=2).to_dict("list"), "age": [1.5]})], ignore_index=True)
    later = later[list(reversed(later.columns))]  # a float column now, and its columns reordered
    before = content_digests(pa.Table.from_pandas(old, preserve_index=False))
    after = content_digests(pa.Table.from_pandas(later, preserve_index=False))
    np.testing.assert_array_equal(after[:200], before)


def test_a_row_split_is_the_cut_of_its_salted_blake2b_digest(tmp_path: Path) -> None:
    """An independent computation of one row's split from its canonical encoding."""
    data = pd.DataFrame({"spend": [1.0, 2.0, 3.0, 4.0] * 10, "churned": ["yes", "no"] * 20,
                         "species": [1, 2] * 20, "age": list(range(40)), "id": [f"r{i}" for i in range(40)]})
    codes = _split(tmp_path, {**SPEC, "split": {"seed": 3, "val": 0.25, "test": 0.25, "key": "id"}}, data)
    for row in (0, 17, 39):
        identity = f"r{row}".encode()
        digest = hashlib.blake2b(identity, digest_size=8, key=b"mtlflow-split-3").digest()
        u = int.from_bytes(digest, "little") / 2 ** 64
        assert codes[row] == (2 if u < 0.25 else 1 if u < 0.5 else 0)


def test_prepared_data_keeps_each_rows_content_digest_per_split(tmp_path: Path) -> None:
    old = frame(300).assign(id=[f"r{i}" for i in range(300)])
    new = pd.concat([old, frame(200, seed=1).assign(id=[f"r{300 + i}" for i in range(200)])], ignore_index=True)
    keyed = {**SPEC, "split": {"key": "id"}}
    _split(tmp_path / "v1", keyed, old)
    codes = _split(tmp_path / "v2", keyed, new)
    first, second = row_hashes.read(tmp_path / "v1" / "data"), row_hashes.read(tmp_path / "v2" / "data")
    assert {s: len(v) for s, v in second.items()} == {s: int((codes == c).sum()) for c, s in
                                                      enumerate(row_hashes.SPLIT_NAMES)}
    # the old version's training rows are none of the new test rows, and its test rows are all still test rows
    assert not row_hashes.overlap(first["train"], second["test"]).any()
    assert row_hashes.overlap(second["test"], first["test"]).all()
    # a digest is the row's content alone: the same row prepared in two versions has the same digest
    np.testing.assert_array_equal(second["train"][: len(first["train"])], first["train"])


def test_key_conflicts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="key and group both name what decides a row's split; choose one"):
        read_spec(write(tmp_path, {"tasks": TASKS, "split": {"key": "id", "group": "customer"}}))
    with pytest.raises(SpecError, match="a split column fixes the split"):
        read_spec(write(tmp_path, {"tasks": TASKS, "split": {"key": "id", "column": "fold"}}))
