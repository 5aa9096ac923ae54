"""`mtlflow spec init`: a first task spec of your own table."""

from __future__ import annotations

import argparse

from mtlflow.cli.common import csv_list
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.outputs import check_output_path


def cmd_spec_init(args: argparse.Namespace) -> int:

    # the spec inference (and its pydantic schema) loads when `mtlflow spec infer` runs, not on every CLI start
    from mtlflow.benchmarks._spec.infer import infer_spec  # noqa: PLC0415

    out = check_output_path(args.out, "--out", "file", [("the table", args.table), ("--images", args.images, True)])
    if out.exists() and not args.overwrite:
        raise InvalidParameterError(f"{out} exists; give another --out or --overwrite to replace it")
    text = infer_spec(args.table, csv_list(args.tasks) or [], out, images=args.images)
    atomic.write_text(out, text)
    for line in text.splitlines():
        if line.startswith("# left out"):  # columns that are not in the spec: said here, not only in the file
            print(line.removeprefix("# "))
    print(f"spec: {out} (check the task kinds and features it lists, then: mtlflow pipeline run --local "
          f"--param spec={out})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the spec command."""
    p = sub.add_parser("spec", help="task specs of your own data: `spec init TABLE --tasks a,b --out my.yaml` writes "
                                    "a first spec from a CSV or Parquet table (tables, molecules with a SMILES column, "
                                    "images named in a column)")
    p.add_argument("what", choices=["init"], help="init: write a spec from the table")
    p.add_argument("table", help="the CSV or Parquet file")
    p.add_argument("--tasks", required=True, help="the label columns, comma-separated (one task each)")
    p.add_argument("--out", required=True, help="the spec file to write (YAML); not the table")
    p.add_argument("--images", help="an image table's folder of images, when it is not the table's folder or one of "
                                    "its subfolders (a column of image file names makes the spec an image spec)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=cmd_spec_init)
