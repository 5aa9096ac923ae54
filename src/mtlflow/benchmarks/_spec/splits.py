"""A spec table's split, stable across data versions (:mod:`mtlflow.benchmarks.row_hashes`).

Each row's split follows from the row alone: the salted digest of its identity cut at the split shares.
The identity is the ``split.key`` column's value when there is one (a row keeps its split even when its
other cells are corrected), the ``split.group`` column's value for grouped splits (a group's rows share one
digest, so they stay together), and otherwise the row's cells (:func:`row_contents`). With
``split.stratify`` the rows of each class are ranked by their digest and cut at the shares of the class's
row count, so every class has its exact share in every split; appending rows can then move the few rows
whose rank crosses a cut point (about the square root of the rows appended to a class), which the retrain
gate's overlap check finds (:func:`mtlflow.jobs.champion.decide`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mtlflow.benchmarks import row_hashes
from mtlflow.benchmarks._spec.schema import DataSpec, location_of
from mtlflow.benchmarks._spec.tables import SPLITS, EncodedTask, as_float, as_strings, column, is_numeric

#: separates cells and marks a missing one in a row's canonical encoding (neither occurs in text cells' UTF-8)
_SEPARATOR, _MISSING = b"\x1f", b"\x00"


def _cells(arrow_column: Any) -> Any:
    """A column's cells as canonical text (a pyarrow string array, null where missing): numbers as Python's
    float64 ``repr`` (``1`` and ``1.0`` alike, so a column that becomes float in a new data version hashes its
    old rows the same; ``repr`` is the language's shortest round-trip form, stable across versions), other
    cells as their text."""
    import pyarrow as pa

    if is_numeric(arrow_column):
        values = as_float(arrow_column)
        return pa.array([None if v != v else repr(v) for v in values.tolist()], pa.string())
    return pa.array(as_strings(arrow_column), pa.string())


def row_contents(table: Any) -> list[bytes]:
    """Each row's canonical encoding: ``name=cell`` for its columns sorted by name (column order does not
    matter), joined by the unit separator, a missing cell as NUL (the joins run in pyarrow, column-wise)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_columns == 0:
        return [b""] * table.num_rows
    named = [pc.binary_join_element_wise(pa.scalar(f"{name}="), pc.fill_null(_cells(table.column(name)),
                                                                            _MISSING.decode()), "")
             for name in sorted(table.column_names)]
    joined = pc.binary_join_element_wise(*named, _SEPARATOR.decode())
    return pc.cast(joined, pa.binary()).to_pylist()


def content_digests(table: Any) -> np.ndarray:
    """The unsalted content digest of each row (what ``row_hashes.npz`` keeps)."""
    return row_hashes.digests(row_contents(table))


def _identities(spec: DataSpec, table: Any) -> list[bytes]:
    where, split = location_of(spec), spec.split
    chosen = split.key if split.key is not None else split.group
    if chosen is None:
        return row_contents(table)
    path = ("split", "key") if split.key is not None else ("split", "group")
    return [_MISSING if v is None else str(v).encode() for v in as_strings(column(table, chosen, where, path))]


def _ranked(u: np.ndarray, val: float, test: float) -> np.ndarray:
    """Split codes giving the rows of lowest ``u`` the test share and the next the val share, exactly
    (rounded), so that a small class still gets every split when it can."""
    order = np.argsort(u, kind="stable")
    n_test, n_val = int(round(test * len(u))), int(round(val * len(u)))
    codes = np.zeros(len(u), dtype=np.int8)
    codes[order[:n_test]] = 2
    codes[order[n_test:n_test + n_val]] = 1
    return codes


def split_codes(spec: DataSpec, table: Any, labels: dict[str, EncodedTask]) -> np.ndarray:
    """0 / 1 / 2 (train / val / test) per row."""
    where, split, n = location_of(spec), spec.split, table.num_rows
    if split.column is not None:
        names = as_strings(column(table, split.column, where, ("split", "column")))
        codes = np.full(n, -1, dtype=np.int8)
        for code, value in enumerate(SPLITS):
            codes[names == value] = code
        if (codes < 0).any():
            found = sorted({str(v) for v in names[codes < 0]})[:5]
            raise where.error(("split", "column"), f"split column {split.column!r} holds {found}, not only train / val "
                                                   "/ test; fix the values")
    elif split.key is None:
        # without a key column the rows are dealt by a seeded permutation, as before stable splits existed: a
        # content hash moved the split of the first page's table and a FairGrad solve on it failed (issue 38 note);
        # give split.key for splits that survive appended rows
        codes = _permuted(spec, table, labels, n)
    else:
        u = row_hashes.unit_interval(_identities(spec, table), split.seed)
        if split.stratify is not None:
            strata = np.nan_to_num(labels[split.stratify].values.astype(np.float64), nan=-1.0)
            codes = np.empty(n, dtype=np.int8)
            for stratum in np.unique(strata):
                rows = np.flatnonzero(strata == stratum)
                codes[rows] = _ranked(u[rows], split.val, split.test)
        else:
            codes = row_hashes.cut(u, split.val, split.test)
    for code, name in enumerate(SPLITS):
        if not (codes == code).any():
            raise where.error(("split",), f"the {name} split has no rows ({n} rows in all); change the split so that "
                                          "every split gets rows")
    return codes


def _permuted(spec: DataSpec, table: Any, labels: dict[str, EncodedTask], n: int) -> np.ndarray:
    """Split codes from a seeded permutation of the rows (of the groups with ``split.group``; within each
    class with ``split.stratify``): the first share of positions test, then val, the rest train."""
    where, split = location_of(spec), spec.split
    rng = np.random.default_rng(split.seed)
    if split.group is not None:
        groups = as_strings(column(table, split.group, where, ("split", "group")))
        _, group_of_row = np.unique(np.where(groups == None, "", groups).astype(str), return_inverse=True)  # noqa: E711
        return _allocate(rng.permutation(group_of_row.max() + 1), split.val, split.test)[group_of_row]
    if split.stratify is not None:
        strata = np.nan_to_num(labels[split.stratify].values.astype(np.float64), nan=-1.0)
        codes = np.empty(n, dtype=np.int8)
        for stratum in np.unique(strata):
            rows = np.flatnonzero(strata == stratum)
            codes[rows] = _allocate(rng.permutation(len(rows)), split.val, split.test)
        return codes
    return _allocate(rng.permutation(n), split.val, split.test)


def _allocate(order: np.ndarray, val: float, test: float) -> np.ndarray:
    """Codes for items in ``order``: the first share of positions test, then val, the rest train."""
    n = len(order)
    n_test, n_val = int(round(test * n)), int(round(val * n))
    codes = np.zeros(n, dtype=np.int8)
    codes[order[:n_test]] = 2
    codes[order[n_test:n_test + n_val]] = 1
    return codes
