"""A first task spec written from a table: ``mtlflow spec init TABLE --tasks a,b``.

The user names the label columns; everything else is read off the table: each task's kind from its
column (two values: binary; other text: multiclass; other numbers: regression), the numeric features,
the low-cardinality text columns as categorical features, and a ``split`` column of train/val/test
values when there is one. The spec is commented where a guess was made, so the user can check it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mtlflow.benchmarks._spec.schema import DataSpec, SpecError
from mtlflow.benchmarks._spec.tables import SPLITS, as_strings, is_numeric

#: text columns with more distinct values than this are left out (ids, free text), not one-hot encoded
MAX_CATEGORIES = 50


def infer_spec(table_path: str | Path, tasks: Sequence[str], spec_path: str | Path) -> str:
    """The YAML text of a spec, to be written at ``spec_path``, for ``table_path`` whose label columns are
    ``tasks`` (the table is named relative to the spec's folder)."""
    import os

    import yaml

    path, spec_path = Path(table_path), Path(spec_path)
    table = _read(path)
    missing = [t for t in tasks if t not in table.column_names]
    if not tasks or missing:
        shown = ", ".join(table.column_names[:20])
        raise SpecError(f"--tasks {', '.join(missing) or '(none)'}: not columns of {path} (columns: {shown}); name "
                        "the label columns, comma-separated")
    entries, notes = [], []
    for column_name in tasks:
        kind, why = _kind(table.column(column_name))
        entries.append({"name": column_name, "type": kind})
        notes.append(f"#   {column_name}: {kind} ({why})")
    split_column = "split" if "split" in table.column_names and _is_split(table.column("split")) else None
    smiles = next((c for c in table.column_names if c.lower() == "smiles" and c not in tasks), None)
    used = set(tasks) | {split_column}
    numeric, categorical, left_out = [], [], []
    for column_name in table.column_names:
        if column_name in used or smiles is not None:  # a molecule table's input is its SMILES column
            continue
        values = table.column(column_name)
        if is_numeric(values):
            numeric.append(column_name)
        elif len({v for v in as_strings(values) if v is not None}) <= MAX_CATEGORIES:
            categorical.append(column_name)
        else:
            left_out.append(column_name)
    source = {"table": os.path.relpath(path.resolve(), spec_path.resolve().parent)}
    spec: dict[str, Any] = {
        "name": _name_of(path),
        "source": {**source, "smiles": smiles} if smiles else source,
        "tasks": entries,
        "split": {"column": split_column} if split_column else {"val": 0.1, "test": 0.2, "seed": 0},
    }
    if not smiles:
        spec["features"] = {"numeric": numeric, "categorical": categorical}
    DataSpec.model_validate(spec)  # what is written must be valid
    header = ["# mtlflow task spec written by `mtlflow spec init`; check the guesses below, then run",
              f"#   mtlflow pipeline run --local --param spec={spec_path}  (docs: guides/your-data)",
              "# task kinds, read off the label columns:", *notes]
    if smiles:
        header.append(f"# molecules: every row's {smiles} becomes a graph, the model is the MPNN")
    if left_out:
        header.append(f"# left out (more than {MAX_CATEGORIES} distinct text values, e.g. ids): {', '.join(left_out)}")
    return "\n".join(header) + "\n" + yaml.safe_dump(spec, sort_keys=False)


def _read(path: Path) -> Any:
    from mtlflow.benchmarks._spec.schema import Source, parse_spec
    from mtlflow.benchmarks._spec.tables import read_source

    if not path.is_file():
        raise SpecError(f"table not found: {path}; give the CSV or Parquet file of your data")
    # a spec with a placeholder task only to reuse the one table reader (formats, gzip, errors)
    probe = parse_spec({"name": "probe", "source": Source(table=str(path.resolve())).model_dump(),
                        "tasks": [{"name": "probe", "type": "binary"}]})
    return read_source(probe).table


def _kind(values: Any) -> tuple[str, str]:
    distinct = {v for v in as_strings(values) if v is not None}
    if len(distinct) == 2:
        return "binary", "two values"
    if not is_numeric(values):
        return "multiclass", f"{len(distinct)} text values"
    return "regression", f"{len(distinct)} numeric values"


def _is_split(values: Any) -> bool:
    return {v for v in as_strings(values) if v is not None} <= set(SPLITS)


def _name_of(path: Path) -> str:
    stem = path.name.split(".")[0]
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem) or "data"
