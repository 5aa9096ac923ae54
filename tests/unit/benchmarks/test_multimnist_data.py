"""MultiMNIST preparation: overlay geometry, disjoint source digits, determinism, extra IDX digits,
and the IDX readers' handling of corrupt files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SMALL_SIZES, realdata
from mtlflow import jobs
from mtlflow.benchmarks.multimnist import CANVAS, DIGIT, load_source_digits, overlay, read_idx_images, read_idx_labels
from mtlflow.core.errors import DataError

SHIFT = CANVAS - DIGIT  # 8


def load_split(data_dir: Path, split: str) -> dict:
    return torch.load(data_dir / f"{split}.pt", weights_only=True)


# -- overlay geometry -----------------------------------------------------------------------------

def test_overlay_geometry_on_synthetic_digits() -> None:
    rng = np.random.default_rng(0)
    left = rng.integers(0, 256, size=(3, DIGIT, DIGIT), dtype=np.uint8)
    right = rng.integers(0, 256, size=(3, DIGIT, DIGIT), dtype=np.uint8)
    out = overlay(left, right)
    assert out.shape == (3, CANVAS, CANVAS) and out.dtype == np.uint8
    assert SHIFT == 8
    # only the left digit: top rows / left columns outside the shifted square
    np.testing.assert_array_equal(out[:, :SHIFT, :DIGIT], left[:, :SHIFT, :])
    np.testing.assert_array_equal(out[:, :DIGIT, :SHIFT], left[:, :, :SHIFT])
    # only the right digit: bottom rows / right columns beyond the left square
    np.testing.assert_array_equal(out[:, DIGIT:, SHIFT:], right[:, DIGIT - SHIFT:, :])
    np.testing.assert_array_equal(out[:, SHIFT:, DIGIT:], right[:, :, DIGIT - SHIFT:])
    # overlap: pixel-wise maximum
    np.testing.assert_array_equal(out[:, SHIFT:DIGIT, SHIFT:DIGIT],
                                  np.maximum(left[:, SHIFT:, SHIFT:], right[:, :DIGIT - SHIFT, :DIGIT - SHIFT]))
    # the two corners covered by neither digit stay black
    assert not out[:, DIGIT:, :SHIFT].any() and not out[:, :SHIFT, DIGIT:].any()


def test_overlay_single_pixels() -> None:
    left = np.zeros((1, DIGIT, DIGIT), dtype=np.uint8)
    right = np.zeros((1, DIGIT, DIGIT), dtype=np.uint8)
    left[0, 0, 0] = 200
    right[0, 0, 0] = 100      # lands at (8, 8)
    left[0, 8, 8] = 50        # same canvas pixel: max(50, 100) = 100
    right[0, 27, 27] = 255    # lands at (35, 35)
    out = overlay(left, right)[0]
    assert out[0, 0] == 200 and out[8, 8] == 100 and out[35, 35] == 255
    assert int(out.astype(int).sum()) == 200 + 100 + 255


def test_prepared_images_are_overlays_of_recorded_source_digits(multimnist_small: Path) -> None:
    images, labels, _ = load_source_digits(None)
    for split in ("train", "val", "test"):
        blob = load_split(multimnist_small, split)
        idx = blob["source_index"].numpy()
        assert blob["images"].shape == (SMALL_SIZES[f"n_{split}"], 1, CANVAS, CANVAS)
        expected = overlay(images[idx[:, 0]], images[idx[:, 1]])
        np.testing.assert_array_equal(blob["images"][:, 0].numpy(), expected)
        np.testing.assert_array_equal(blob["labels"].numpy(), labels[idx])


# -- splits and determinism -----------------------------------------------------------------------

def test_no_source_digit_is_shared_between_splits(multimnist_data: Path) -> None:
    used = {split: set(load_split(multimnist_data, split)["source_index"].flatten().tolist())
            for split in ("train", "val", "test")}
    assert not used["train"] & used["val"]
    assert not used["train"] & used["test"]
    assert not used["val"] & used["test"]
    pools = jobs.read_manifest(multimnist_data)["source_digits"]
    # 5,000 embedded digits, 70/10/20 by each digit's hash: the shares up to binomial noise (4 standard deviations)
    assert sum(pools.values()) == 5000
    for split, share in (("test", 0.2), ("val", 0.1), ("train", 0.7)):
        assert abs(pools[split] / 5000 - share) < 4 * np.sqrt(share * (1 - share) / 5000)
    for split, indices in used.items():
        assert len(indices) <= pools[split]


def test_every_source_digit_keeps_its_split_when_the_pool_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new data version with more source digits (e.g. ``mnist_dir`` added) moves no old digit to another
    split, so no new test image is made of a digit the older version's training images used."""
    from mtlflow.benchmarks import multimnist

    images, labels, sources = load_source_digits(None)
    cfg = {"val_fraction": 0.1, "test_fraction": 0.2, "mnist_dir": None, "seed": 0}

    def pool_of(n: int) -> dict[str, np.ndarray]:
        monkeypatch.setattr(multimnist, "load_source_digits", lambda _: (images[:n], labels[:n], sources))
        return multimnist.source_pools(cfg)[3]

    small, grown = pool_of(3000), pool_of(5000)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(grown[split][grown[split] < 3000], small[split])


def test_each_image_row_hash_is_the_digest_of_its_source_digits(multimnist_small: Path) -> None:
    import hashlib

    from mtlflow.benchmarks import row_hashes

    images, labels, _ = load_source_digits(None)
    stored = row_hashes.read(multimnist_small)

    def digest(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=8).digest()

    for split in ("train", "test"):
        index = load_split(multimnist_small, split)["source_index"].numpy()
        for row in (0, len(index) - 1):
            digits = b"".join(digest(images[i].tobytes() + bytes([int(labels[i])])) for i in index[row])
            assert int(stored[split][row]) == int.from_bytes(digest(digits), "little")


def test_prepare_is_deterministic_and_seeded(multimnist_small: Path, tmp_path: Path) -> None:
    first = jobs.read_manifest(multimnist_small)["content_hash"]
    again = jobs.prepare("multimnist", tmp_path / "again", **SMALL_SIZES)
    assert again["content_hash"] == first
    for split in ("train", "val", "test"):
        assert (tmp_path / "again" / f"{split}.pt").read_bytes() == (multimnist_small / f"{split}.pt").read_bytes()
    other = jobs.prepare("multimnist", tmp_path / "other", seed=1, **SMALL_SIZES)
    assert other["content_hash"] != first


def test_prepared_data_loads_with_expected_shapes(multimnist_small: Path) -> None:
    bench, data = jobs.load_prepared(multimnist_small)
    assert bench.task_names == ["left", "right"]
    x, (y_left, y_right) = data.splits["train"][0]
    assert x.shape == (1, CANVAS, CANVAS) and x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert 0 <= int(y_left) <= 9 and 0 <= int(y_right) <= 9
    assert len(data.splits["test"]) == SMALL_SIZES["n_test"]


def test_mnist_dir_adds_ten_thousand_digits(tmp_path: Path) -> None:
    mnist_dir = realdata("mnist", "t10k-images-idx3-ubyte.gz").parent
    manifest = jobs.prepare("multimnist", tmp_path / "mm", mnist_dir=str(mnist_dir), **SMALL_SIZES)
    counts = [s["count"] for s in manifest["sources"]]
    assert counts == [5000, 10000]
    assert sum(manifest["source_digits"].values()) == 15000
    assert set(manifest["sources"][1]["sha256"]) == {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}
    # some overlaid digits come from the IDX files (indices >= 5000 in the concatenated pool)
    idx = load_split(tmp_path / "mm", "train")["source_index"]
    assert int(idx.max()) >= 5000


# -- IDX readers ----------------------------------------------------------------------------------

def idx_images(n: int = 2, rows: int = 28, cols: int = 28, magic: int = 2051) -> tuple[bytes, np.ndarray]:
    pixels = (np.arange(n * rows * cols) % 256).astype(np.uint8)
    return struct.pack(">IIII", magic, n, rows, cols) + pixels.tobytes(), pixels.reshape(n, rows, cols)


def idx_labels(values: list[int], magic: int = 2049) -> bytes:
    return struct.pack(">II", magic, len(values)) + bytes(values)


def test_idx_readers_read_valid_files(tmp_path: Path) -> None:
    raw, pixels = idx_images()
    (tmp_path / "img").write_bytes(raw)
    (tmp_path / "img.gz").write_bytes(gzip.compress(raw, mtime=0))
    (tmp_path / "lab.gz").write_bytes(gzip.compress(idx_labels([3, 7]), mtime=0))
    np.testing.assert_array_equal(read_idx_images(tmp_path / "img"), pixels)
    np.testing.assert_array_equal(read_idx_images(tmp_path / "img.gz"), pixels)
    assert read_idx_labels(tmp_path / "lab.gz").tolist() == [3, 7]


@pytest.mark.parametrize("case", ["wrong-magic", "truncated-body", "truncated-header", "empty",
                                  "truncated-gzip", "labels-as-images"])
def test_idx_image_reader_rejects_corrupt_files(case: str, tmp_path: Path) -> None:
    raw, _ = idx_images()
    content = {
        "wrong-magic": idx_images(magic=1234)[0],
        "truncated-body": raw[:-10],
        "truncated-header": raw[:9],
        "empty": b"",
        "truncated-gzip": gzip.compress(raw, mtime=0)[:40],
        "labels-as-images": idx_labels([1, 2, 3]),
    }[case]
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(content)
    with pytest.raises(DataError) as exc:
        read_idx_images(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("case", ["wrong-magic", "count-mismatch", "truncated"])
def test_idx_label_reader_rejects_corrupt_files(case: str, tmp_path: Path) -> None:
    content = {
        "wrong-magic": idx_labels([1, 2], magic=2051),
        "count-mismatch": idx_labels([1, 2])[:-1],
        "truncated": b"\x00\x00\x08",
    }[case]
    path = tmp_path / "labels"
    path.write_bytes(content)
    with pytest.raises(DataError):
        read_idx_labels(path)


def test_idx_reader_rejects_corrupt_gzip_stream(tmp_path: Path) -> None:
    # a valid 10-byte gzip header followed by a deflate block of the reserved type 3 ("invalid block type")
    header = gzip.compress(b"", mtime=0)[:10]
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(header + b"\x07" + b"\x00" * 64)
    with pytest.raises(DataError):
        read_idx_images(path)


def test_mnist_dir_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz"):
        jobs.prepare("multimnist", tmp_path / "out", mnist_dir=str(empty), **SMALL_SIZES)
    with pytest.raises(DataError, match="not found"):
        jobs.prepare("multimnist", tmp_path / "out", mnist_dir=str(tmp_path / "missing"), **SMALL_SIZES)
    assert not (tmp_path / "out").exists()  # preparation is atomic: nothing half-written


def test_truncated_split_file_is_named(small_copy: Path) -> None:
    import json

    from mtlflow.core.hashing import directory_hash

    with open(small_copy / "train.pt", "r+b") as fh:
        fh.truncate(100)
    # with hash verification the directory is rejected as a whole ...
    with pytest.raises(DataError, match="train.pt does not match its manifest hash"):
        jobs.load_prepared(small_copy)
    # ... and with the manifest hash updated (or verify=False) the reader names the broken file
    manifest = json.loads((small_copy / "manifest.json").read_text())
    manifest["content_hash"] = directory_hash(small_copy)
    (small_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="train.pt"):
        jobs.load_prepared(small_copy)
    with pytest.raises(DataError, match="train.pt"):
        jobs.load_prepared(small_copy, verify=False)
