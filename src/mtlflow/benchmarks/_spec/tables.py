"""Reading a spec's table and encoding it: labels per task kind, features, the split.

The table is read whole with pyarrow (CSV with its one-thread reader, or Parquet) from a local
path, a DVC repository at a revision, or an fsspec URI. Everything after that is column-wise NumPy: no
per-row Python work, so a million rows take seconds. Every problem is a :class:`SpecError` that names
the spec's key path (and line) and the fix.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.benchmarks._spec.schema import DataSpec, KeyPath, SpecLocation, TaskEntry, location_of

SPLITS = ("train", "val", "test")


@dataclass
class SourceTable:
    """The table of a spec with the SHA-256 of the bytes it was parsed from."""

    table: Any  # pyarrow.Table
    sha256: str
    origin: str


def read_source(spec: DataSpec) -> SourceTable:
    """Read the spec's table; a missing file, an unreadable revision or a parse error is a SpecError."""
    source, where = spec.source, location_of(spec)
    fmt = source.format or _format_of(source.table, where)
    data, origin = _read_bytes(spec, where)
    digest = hashlib.sha256(data).hexdigest()
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            table = missing_as_in_csv(pq.read_table(io.BytesIO(data)))
        else:
            import pyarrow as pa
            from pyarrow import csv

            compression = "gzip" if source.table.endswith(".gz") else None
            stream = pa.input_stream(pa.BufferReader(data), compression=compression)
            # one thread: the reader's thread pool, still winding down when a refused spec ends the process
            # a moment later, aborted it at exit ("terminate called without an active exception", exit 134, in
            # 4 of 10 runs); one thread also read a 1M-row table faster (0.26 s against 0.79 s on 2 busy cores)
            table = csv.read_csv(stream, read_options=csv.ReadOptions(use_threads=False),
                                 convert_options=csv.ConvertOptions(strings_can_be_null=True))
    except Exception as exc:  # pyarrow raises ArrowInvalid/ArrowTypeError/OSError with the parser's reason
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise where.error(("source", "table"), f"{origin} is not a readable {fmt} table ({first}); fix the file or "
                                               "set source.format") from None
    if table.num_rows == 0:
        raise where.error(("source", "table"), f"{origin} has no rows; give a table with data")
    return SourceTable(table, digest, origin)


def missing_as_in_csv(table: Any) -> Any:
    """A Parquet table with its missing values read as the CSV reader reads them: text cells spelled as
    pyarrow's CSV null values ("", "NA", "NaN", "null", ...) are missing, and a text column that then holds only
    numbers is numeric. (pandas' ``to_parquet`` of a column with "NA" strings keeps them as text, so the same
    data as CSV and as Parquet would otherwise give a class "NA" or a feature that is "not numeric".)"""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pat
    from pyarrow import csv

    spellings = pa.array(csv.ConvertOptions().null_values)
    for index, name in enumerate(table.column_names):
        values = table.column(index)
        if not (pat.is_string(values.type) or pat.is_large_string(values.type)):
            continue
        spelled_missing = pc.is_in(values, value_set=spellings.cast(values.type))
        if not pc.any(spelled_missing).as_py():
            continue
        values = pc.if_else(spelled_missing, pa.scalar(None, values.type), values)
        if first_non_number(values) is None:
            try:
                values = pc.cast(values, pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                values = pc.cast(values, pa.float64())
        table = table.set_column(index, name, values)
    return table


def _format_of(table: str, where: SpecLocation) -> str:
    name = table.lower().removesuffix(".gz")
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    raise where.error(("source", "table"), f"cannot tell the format of {table!r} from its suffix; set source.format "
                                           "to csv or parquet")


def _read_bytes(spec: DataSpec, where: SpecLocation) -> tuple[bytes, str]:
    source = spec.source
    if source.repo is not None:
        import dvc.api

        origin = f"{source.table} of {source.repo}@{source.rev or 'HEAD'}"
        try:
            with dvc.api.open(source.table, repo=source.repo, rev=source.rev, mode="rb") as fh:
                return fh.read(), origin
        except Exception as exc:  # dvc raises many types (PathMissingError, RevError, SCMError, ...)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise where.error(("source", "repo"), f"cannot read {origin} ({reason}); check repo, rev and table") \
                from None
    if "://" in source.table:
        import fsspec

        try:
            with fsspec.open(source.table, "rb") as fh:
                return fh.read(), source.table
        except Exception as exc:  # fsspec backends raise their own types
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise where.error(("source", "table"), f"cannot read {source.table} ({reason}); check the URI and its "
                                                   "credentials") from None
    path = Path(source.table)
    if not path.is_file():
        raise where.error(("source", "table"), f"file not found: {path}; fix the path (a relative path is relative "
                                               "to the spec file)")
    return path.read_bytes(), str(path)


# -- columns -----------------------------------------------------------------------------------------
def column(table: Any, name: str, where: SpecLocation, path: KeyPath) -> Any:
    """A column of the table by name, or a SpecError listing the columns there are."""
    if name not in table.column_names:
        shown = ", ".join(table.column_names[:20]) + (", ..." if table.num_columns > 20 else "")
        raise where.error(path, f"column {name!r} is not in the table (columns: {shown}); fix the name")
    return table.column(name)


def is_numeric(arrow_column: Any) -> bool:
    import pyarrow.types as pat

    kind = arrow_column.type
    return pat.is_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind) or pat.is_null(kind)


def number_share(arrow_column: Any) -> float:
    """The share of a text column's present cells that read as numbers (1.0 for a numeric column)."""
    if is_numeric(arrow_column):
        return 1.0
    strings = as_strings(arrow_column)
    present = strings[strings != None]  # noqa: E711 (element-wise)
    if not len(present):
        return 1.0
    distinct, counts = np.unique(present.astype(str), return_counts=True)
    numbers = np.array([_is_number(v) for v in distinct], dtype=bool)
    return float(counts[numbers].sum() / counts.sum())


def first_non_number(arrow_column: Any) -> tuple[int, str] | None:
    """(row, cell) of the first present cell that does not read as a number, None if every one does."""
    for row, value in enumerate(as_strings(arrow_column)):
        if value is not None and not _is_number(value):
            return row, value
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def as_float(arrow_column: Any) -> np.ndarray:
    """A numeric column as float64 with NaN for missing values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(arrow_column, pa.float64()).to_numpy(zero_copy_only=False)


def as_strings(arrow_column: Any) -> np.ndarray:
    """Any column as an object array of strings, None where missing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return np.asarray(pc.cast(arrow_column, pa.string()).to_numpy(zero_copy_only=False), dtype=object)


# -- labels ------------------------------------------------------------------------------------------
@dataclass
class EncodedTask:
    """A task's labels as the loss wants them, with what is needed to read predictions back."""

    values: np.ndarray  # binary/multilabel/regression float64 (NaN missing); multiclass int64 (-1 missing)
    info: dict[str, Any]


def encode_task(table: Any, task: TaskEntry, index: int, where: SpecLocation) -> EncodedTask:
    base: KeyPath = ("tasks", index)
    if task.type == "multilabel":
        paths = [base + ("columns", i) for i in range(len(task.label_columns))]
        values = np.stack([_binary(column(table, name, where, path), None, where, path, name)[0]
                           for name, path in zip(task.label_columns, paths, strict=True)], axis=1)
        return EncodedTask(values, {"labels": task.label_columns})
    name = task.label_columns[0]
    path = base + (("column",) if task.column else ("name",))
    raw = column(table, name, where, path)
    if task.type == "binary":
        values, positive = _binary(raw, task.positive, where, path, name)
        return EncodedTask(values, {"positive": positive})
    if task.type == "multiclass":
        return _multiclass(raw, where, path, name)
    if not is_numeric(raw):
        example = next((v for v in as_strings(raw) if v is not None), None)
        raise where.error(path, f"regression target {name!r} is not numeric (e.g. {example!r}); clean the column or "
                                "make the task multiclass")
    values = as_float(raw)
    check_representable(values, f"regression target {name!r}", where, path)
    return EncodedTask(values, {})


#: The largest magnitude a feature or regression target may have: inputs and predictions are float32, so a
#: larger value becomes infinite on the way into the model (and 1e308 overflows the training mean and variance).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_representable(values: np.ndarray, what: str, where: SpecLocation, path: KeyPath) -> None:
    """Refuse infinite values and values beyond float32's range (NaN is a missing cell and allowed): one would
    turn a feature's standardisation into NaN or a constant, or drop a target from the error metrics."""
    present = values[~np.isnan(values)]
    bad = ~np.isfinite(present) | (np.abs(present) > FLOAT32_MAX)
    if bad.any():
        raise where.error(path, f"{what} holds {int(bad.sum())} infinite or out-of-range value(s) (|x| > "
                                f"{FLOAT32_MAX:.3g}, e.g. {float(present[bad][0])!r}); fix them or leave the cells empty (missing)")


def _binary(raw: Any, positive: Any, where: SpecLocation, path: KeyPath, name: str) -> tuple[np.ndarray, Any]:
    strings = as_strings(raw)
    present = np.array([v is not None for v in strings])
    distinct = sorted(set(strings[present].tolist()))
    if len(distinct) > 2:
        shown = ", ".join(repr(v) for v in distinct[:5])
        raise where.error(path, f"binary column {name!r} has {len(distinct)} values ({shown}, ...); make the task "
                                "multiclass or clean the column")
    if not distinct:
        raise where.error(path, f"class column {name!r} has no labels: every cell is empty; fill the column or "
                                "name another")
    if len(distinct) < 2:
        raise where.error(path, f"class column {name!r} holds a single class ({distinct[0]}); a classification "
                                "task needs two")
    if positive is None:
        numeric = is_numeric(raw)
        positive_text = distinct[-1] if not numeric else max(distinct, key=float)
    else:
        positive_text = str(positive).lower() if isinstance(positive, bool) else str(positive)
        if positive_text not in distinct:
            raise where.error(path[:-1] + ("positive",), f"positive value {positive!r} does not occur in {name!r} "
                                                          f"(values: {distinct}); fix it")
    values = np.full(len(strings), np.nan)
    values[present] = (strings[present] == positive_text).astype(np.float64)
    return values, positive_text


def _multiclass(raw: Any, where: SpecLocation, path: KeyPath, name: str) -> EncodedTask:
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(raw).combine_chunks()
    classes = [str(v) for v in encoded.dictionary.to_pylist()]
    if raw.null_count == len(raw):  # (a column of nulls only encodes to one null class)
        raise where.error(path, f"class column {name!r} has no labels: every cell is empty; fill the column or "
                                "name another")
    if len(classes) < 2:
        raise where.error(path, f"class column {name!r} holds a single class ({classes[0]}); a classification task "
                                "needs two")
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    order = sorted(range(len(classes)), key=lambda i: _class_key(classes[i]))
    remap = np.empty(len(classes), dtype=np.int64)
    remap[order] = np.arange(len(classes))
    values = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1)
    return EncodedTask(values, {"classes": [classes[i] for i in order]})


def _class_key(text: str) -> tuple[int, float, str]:
    """Numbers in numeric order before other names in text order."""
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


# -- features ----------------------------------------------------------------------------------------
def feature_columns(spec: DataSpec, table: Any) -> tuple[list[str], list[str]]:
    """The numeric and categorical input columns (numeric by default: every other numeric column)."""
    where, features = location_of(spec), spec.features
    used = ({c for t in spec.tasks for c in t.label_columns}
            | {spec.split.column, spec.split.group, spec.split.key, spec.source.smiles})
    for i, name in enumerate(features.categorical):
        column(table, name, where, ("features", "categorical", i))
    if features.numeric is None:
        numeric = [c for c in table.column_names if c not in used and c not in features.categorical
                   and is_numeric(table.column(c))]
    else:
        numeric = list(features.numeric)
        for i, name in enumerate(numeric):
            values = column(table, name, where, ("features", "numeric", i))
            if not is_numeric(values):
                row, cell = first_non_number(values) or (0, None)
                raise where.error(("features", "numeric", i), f"feature {name!r} is not numeric: data row {row + 1} "
                                                             f"holds {cell!r}; clean the cell or list the column under "
                                                             "features.categorical")
    clash = sorted(used & (set(numeric) | set(features.categorical)))
    if clash:
        raise where.error(("features",), f"column(s) {clash} are labels, split, group or key columns and cannot be "
                                         "features too; remove them from features")
    if spec.modality == "table" and not numeric and not features.categorical:
        raise where.error(("features",), "the table has no feature column; list features.numeric or "
                                         "features.categorical")
    return numeric, list(features.categorical)


def embedding_width(spec: DataSpec, categories: int) -> int:
    """The embedding width of a categorical column with ``categories`` training categories."""
    return spec.features.embedding_dim or min(50, max(1, (categories + 1) // 2))


def encode_features(spec: DataSpec, table: Any, train: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """float32 ``[N, F]``: numeric columns standardised with training statistics (missing -> 0, the training
    mean), then the categorical columns with the categories of the training rows: one-hot blocks (other
    values -> all 0), or with ``features.encoding: embedding`` one code column each (1..n the training
    categories, 0 for any other value or a missing one), which the trunk's embeddings look up."""
    import pyarrow as pa
    import pyarrow.compute as pc

    where = location_of(spec)
    numeric, categorical = feature_columns(spec, table)
    blocks, info = [], {"numeric": [], "categorical": []}
    for index, name in enumerate(numeric):
        values = as_float(table.column(name))
        check_representable(values, f"feature {name!r}", where, ("features", "numeric", index)
                            if spec.features.numeric is not None else ("features",))
        train_values = values[train & ~np.isnan(values)]
        mean = float(train_values.mean()) if len(train_values) else 0.0
        std = float(train_values.std()) if len(train_values) > 1 else 0.0
        scale = std if std > 0 and spec.features.standardise else 1.0
        shift = mean if spec.features.standardise else 0.0
        blocks.append(np.nan_to_num((values - shift) / scale, nan=0.0 if spec.features.standardise else mean)
                      .astype(np.float32)[:, None])
        # missing cells are imputed with the training mean: counted per column so the manifest says how many
        info["numeric"].append({"name": name, "mean": mean, "std": std, "missing": int(np.isnan(values).sum())})
    for name in categorical:
        values = pc.cast(table.column(name), pa.string())
        categories = sorted(c for c in pc.unique(values.filter(pa.array(train))).to_pylist() if c is not None)
        codes = pc.index_in(values, value_set=pa.array(categories, pa.string())).fill_null(-1) \
            .to_numpy(zero_copy_only=False).astype(np.int64)
        if spec.features.encoding == "embedding":
            blocks.append((codes + 1).astype(np.float32)[:, None])
            info["categorical"].append({"name": name, "categories": categories,
                                        "embedding_dim": embedding_width(spec, len(categories))})
            continue
        block = np.zeros((len(values), len(categories)), dtype=np.float32)
        present = codes >= 0
        block[np.flatnonzero(present), codes[present]] = 1.0
        blocks.append(block)
        info["categorical"].append({"name": name, "categories": categories})
    matrix = np.concatenate(blocks, axis=1) if blocks else np.zeros((table.num_rows, 0), dtype=np.float32)
    info["width"] = int(matrix.shape[1])
    info["encoding"] = spec.features.encoding
    return matrix, info
