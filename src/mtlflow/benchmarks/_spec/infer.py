"""A first task spec written from a table: ``mtlflow spec init TABLE --tasks a,b``.

The user names the label columns; everything else is read off the table: each task's kind from its
column (two values: binary; other text, or at most 20 integers: multiclass; other numbers: regression),
the numeric features, the low-cardinality text columns as categorical features, and a ``split`` column
of train/val/test values when there is one. A text column whose every value is an image file name (``.png``, ``.jpg``, ...)
makes it an image spec: the images are looked up in ``images`` when given, else in the table's folder and
then in each of its subfolders, and the folder where most of them are becomes ``source.images``. The spec
is commented where a guess was made, so the user can check it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mtlflow.benchmarks._spec.schema import Source, SpecError, parse_spec
from mtlflow.benchmarks._spec.tables import SPLITS, as_strings, first_non_number, is_numeric, number_share, read_source

#: text columns with more distinct values than this are left out (ids, free text), not one-hot encoded
MAX_CATEGORIES = 50
#: a numeric label column of at most this many integer values is guessed to be class ids (multiclass)
MAX_CLASSES = 20
#: file name endings that make a text column the images of an image table (what PIL reads)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: a text column at least this share of whose cells read as numbers is a numeric column with bad cells: left out
#: with a note naming the first bad cell (not one-hot encoded as categories)
MIN_NUMBER_SHARE = 0.5
#: how many image paths are looked up to find their folder and count the missing ones
IMAGES_CHECKED = 1000


def infer_spec(table_path: str | Path, tasks: Sequence[str], spec_path: str | Path,
               images: str | Path | None = None) -> str:
    """The YAML text of a spec, to be written at ``spec_path``, for ``table_path`` whose label columns are
    ``tasks`` (the table is named relative to the spec's folder); ``images``: the folder of an image table's
    files, when it is not the table's folder or one of its subfolders."""
    path, spec_path = Path(table_path), Path(spec_path)
    table = _read(path)
    _check_tasks(table, tasks, path)
    entries, notes = _task_entries(table, tasks)
    split_column = "split" if "split" in table.column_names and _is_split(table.column("split")) else None
    smiles = next((c for c in table.column_names if c.lower() == "smiles" and c not in tasks), None)
    image_column = None if smiles else _image_column(table, tasks)
    source, image_note = _source(table, path, spec_path, smiles, image_column, images)
    spec: dict[str, Any] = {
        "name": _name_of(path),
        "source": source,
        "tasks": entries,
        "split": {"column": split_column} if split_column else {"val": 0.1, "test": 0.2, "seed": 0},
    }
    # a molecule table's input is its SMILES column, an image table's its images: no feature columns
    columns = _feature_columns(table, set(tasks) | {split_column}) if not smiles and image_column is None else None
    if columns is not None:
        spec["features"] = {"numeric": columns["numeric"], "categorical": columns["categorical"]}
    parse_spec(spec)  # what is written must be valid (a SpecError, not a trace, if it is not)
    header = ["# mtlflow task spec written by `mtlflow spec init`; check the guesses below, then run",
              f"#   mtlflow pipeline run --local --param spec={spec_path}  (docs: guides/your-data)",
              "# task kinds, read off the label columns:", *notes]
    if smiles:
        header.append(f"# molecules: every row's {smiles} becomes a graph, the model is the MPNN")
    if image_note:
        header.append(image_note)
    if columns is not None and columns["left_out"]:
        header.append(f"# left out (more than {MAX_CATEGORIES} distinct text values, e.g. ids): "
                      f"{', '.join(columns['left_out'])}")
    if columns is not None and columns["unclean"]:
        header.append(f"# left out (numbers with cells that are not; clean the cells and list the column under "
                      f"features.numeric): {', '.join(columns['unclean'])}")
    return "\n".join(header) + "\n" + yaml.safe_dump(spec, sort_keys=False)


def _check_tasks(table: Any, tasks: Sequence[str], path: Path) -> None:
    """Refuse no ``--tasks``, a task that is not a column of the table, and a column named twice."""
    missing = [t for t in tasks if t not in table.column_names]
    if not tasks or missing:
        shown = ", ".join(table.column_names[:20])
        raise SpecError(f"--tasks {', '.join(missing) or '(none)'}: not columns of {path} (columns: {shown}); name "
                        "the label columns, comma-separated")
    repeated = sorted({t for t in tasks if list(tasks).count(t) > 1})
    if repeated:
        raise SpecError(f"--tasks names {', '.join(repeated)} more than once; name each label column once")


def _task_entries(table: Any, tasks: Sequence[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The spec's task entries and the header's note of each task's guessed kind."""
    entries, notes, names = [], [], set()
    for column_name in tasks:
        kind, why = _kind(table.column(column_name))
        name = _task_name(column_name, names)
        names.add(name)
        # a column whose name is no valid task name (spaces, non-ASCII letters) keeps it as the task's column
        entries.append({"name": name, "type": kind} if name == column_name else
                       {"name": name, "column": column_name, "type": kind})
        notes.append(f"#   {name}: {kind} ({why})" if name == column_name else
                     f"#   {name} (column {column_name}): {kind} ({why})")
    return entries, notes


def _feature_columns(table: Any, used: set[str | None]) -> dict[str, list[str]]:
    """The columns not in ``used`` sorted into ``numeric`` and ``categorical`` features, and those left out:
    ``left_out`` (too many distinct text values) and ``unclean`` (numbers with a few bad cells, each named)."""
    columns: dict[str, list[str]] = {"numeric": [], "categorical": [], "left_out": [], "unclean": []}
    for column_name in table.column_names:
        if column_name in used:
            continue
        values = table.column(column_name)
        if is_numeric(values):
            columns["numeric"].append(column_name)
        elif number_share(values) >= MIN_NUMBER_SHARE:
            # a numeric column with a few bad cells: neither a feature as it stands nor categories
            row, cell = first_non_number(values) or (0, "")
            columns["unclean"].append(f"{column_name} (data row {row + 1} holds {cell!r})")
        elif len({v for v in as_strings(values) if v is not None}) <= MAX_CATEGORIES:
            columns["categorical"].append(column_name)
        else:
            columns["left_out"].append(column_name)
    return columns


def _source(table: Any, path: Path, spec_path: Path, smiles: str | None, image_column: str | None,
            images: str | Path | None) -> tuple[dict[str, Any], str]:
    """The spec's ``source`` (paths relative to the spec's folder) and the header's note on the images ("" for
    a table without an image column)."""
    source: dict[str, Any] = {"table": os.path.relpath(path.resolve(), spec_path.resolve().parent)}
    if smiles:
        source["smiles"] = smiles
    if image_column is None:
        return source, ""
    folder, found, checked = _image_folder(table.column(image_column), path.parent, images, image_column)
    source["images"] = os.path.relpath(folder.resolve(), spec_path.resolve().parent)
    if image_column != "image":
        source["image_column"] = image_column
    return source, (f"# images: column {image_column} names image files; {found} of the first {checked} are in "
                    f"{source['images']} (the model is a ResNet-18; other columns are not used)")


def _read(path: Path) -> Any:
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
    if len(distinct) <= MAX_CLASSES and all(float(v).is_integer() for v in distinct):
        return "multiclass", f"{len(distinct)} integer values, read as class ids; regression if they are amounts"
    return "regression", f"{len(distinct)} numeric values"


def _is_split(values: Any) -> bool:
    return {v for v in as_strings(values) if v is not None} <= set(SPLITS)


def _task_name(column_name: str, taken: set[str]) -> str:
    """``column_name`` when it is a valid task name, else it with every other character made ``_`` (and a
    numbered suffix when that name is taken)."""
    name = "".join(c if (c.isascii() and c.isalnum()) or c in "_.-" else "_" for c in column_name)
    if not name[:1].isalnum():
        name = "task" + name
    unique, number = name, 2
    while unique in taken:
        unique, number = f"{name}_{number}", number + 1
    return unique


def _name_of(path: Path) -> str:
    stem = path.name.split(".")[0]
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem) or "data"


def _image_column(table: Any, tasks: Sequence[str]) -> str | None:
    """The first text column (not a label) whose every value is an image file name, if any."""
    for column_name in table.column_names:
        values = table.column(column_name)
        if column_name in tasks or is_numeric(values):
            continue
        names = [v for v in as_strings(values) if v is not None]
        if names and all(v.lower().endswith(IMAGE_SUFFIXES) for v in names):
            return column_name
    return None


def _image_folder(values: Any, table_folder: Path, given: str | Path | None,
                  column_name: str) -> tuple[Path, int, int]:
    """(folder, images found, images looked up) for the first :data:`IMAGES_CHECKED` paths of an image column:
    the given folder, else the table's folder or the subfolder of it that holds the most of them."""
    names = [v for v in as_strings(values) if v is not None][:IMAGES_CHECKED]
    candidates = ([Path(given)] if given is not None else
                  [table_folder, *sorted(p for p in table_folder.iterdir() if p.is_dir())])
    counted = [(sum((folder / name).is_file() for name in names), folder) for folder in candidates]
    found, folder = max(counted, key=lambda pair: pair[0])  # the first folder wins a tie
    if found == 0:
        where = (f"{given}" if given is not None else f"{table_folder} or its subfolders")
        raise SpecError(f"column {column_name} names image files (e.g. {names[0]}), but none of the first "
                        f"{len(names)} is in {where}; give their folder with --images DIR")
    return folder, found, len(names)
