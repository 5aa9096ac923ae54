"""Stable row identities: what keeps a row in its split across data versions, and what the retrain gate
compares to find test rows a champion trained on.

A split drawn as a permutation of the row count (``rng.permutation(n)``) moves every row when rows are
appended -- the normal new data version -- so the new test split would hold rows the previous model
trained on. Here each row's split is decided by the row alone: a 64-bit BLAKE2b digest of its identity (a
key column's value, or its cells), salted with the split's seed, read as a number ``u`` in ``[0, 1)`` and
cut at the split shares (``u < test``: test, ``u < test + val``: val, else train). Appending or
removing other rows changes no row's ``u``.

Each prepared dataset also keeps, per split, an unsalted digest of each row's content (``row_hashes.npz``,
in the split's row order): a model's training rows and another data version's test rows are compared by
these digests (:func:`overlap`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from mtlflow.core.errors import DataError

#: the file of a prepared dataset with the content digest of each row, one array per split
ROW_HASHES = "row_hashes.npz"
SPLIT_NAMES = ("train", "val", "test")
_SCALE = float(2 ** 64)


def digest(identity: bytes, salt: int | None = None) -> int:
    """The 64-bit BLAKE2b digest of ``identity`` (keyed with ``salt`` when given) as an unsigned integer."""
    key = b"" if salt is None else f"mtlflow-split-{salt}".encode()
    return int.from_bytes(hashlib.blake2b(identity, digest_size=8, key=key).digest(), "little")


def digests(identities: Iterable[bytes], salt: int | None = None) -> np.ndarray:
    """:func:`digest` of each identity, as ``uint64``."""
    return np.fromiter((digest(i, salt) for i in identities), dtype=np.uint64)


def unit_interval(identities: Iterable[bytes], salt: int) -> np.ndarray:
    """Each identity's salted digest mapped to ``[0, 1)`` (float64; uniform for distinct identities)."""
    return digests(identities, salt).astype(np.float64) / _SCALE


def cut(u: np.ndarray, val: float, test: float) -> np.ndarray:
    """Split codes 0 / 1 / 2 (train / val / test) from each row's ``u`` in ``[0, 1)``."""
    codes = np.zeros(len(u), dtype=np.int8)
    codes[u < test + val] = 1
    codes[u < test] = 2
    return codes


def write(out_dir: str | Path, per_split: Mapping[str, np.ndarray]) -> None:
    """Write the rows' content digests (one ``uint64`` array per split, in the split's row order)."""
    np.savez(Path(out_dir) / ROW_HASHES, **{s: np.asarray(per_split[s], dtype=np.uint64) for s in SPLIT_NAMES})


def read(data_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The rows' content digests of a prepared dataset per split, None when it was prepared without them."""
    path = Path(data_dir) / ROW_HASHES
    if not path.is_file():
        return None
    try:
        with np.load(path) as stored:
            return {s: np.asarray(stored[s], dtype=np.uint64) for s in SPLIT_NAMES}
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"{path} is unreadable ({exc}); prepare the data again") from None


def overlap(seen: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A mask over ``rows`` (content digests): True where the row's digest is among ``seen``."""
    return np.isin(np.asarray(rows, dtype=np.uint64), np.asarray(seen, dtype=np.uint64))
