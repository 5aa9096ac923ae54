"""`mtlflow baseline`: a task-by-task baseline of prepared data, written as one more row of the sweep."""

from __future__ import annotations

import argparse
import json

KINDS = ("trivial", "hgb", "linear")


def cmd_baseline(args: argparse.Namespace) -> int:
    from mtlflow.jobs.baselines import baseline  # noqa: PLC0415 (lazy: loads torch, as every job does)

    result = baseline(args.data, args.kind, args.out, overwrite=args.overwrite)
    test = result["metrics"].get("test", {})
    print(json.dumps({"out": result["out"], "method": result["method"], "source": result["source"], "test": test}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the baseline command."""
    p = sub.add_parser("baseline", help="fit a per-task baseline on the training rows of prepared data and score it "
                                        "like a trained run: trivial (base rate, class frequencies, median or mean), "
                                        "hgb (gradient boosting) or linear (logistic / ridge), each with a 5-fold "
                                        "cross-validated grid; cached by the data's hash")
    p.add_argument("--data", required=True, help="the prepared data (mtlflow prepare) the methods were trained on")
    p.add_argument("--kind", required=True, choices=KINDS,
                   help="trivial: any data; hgb, linear: a table's features (a tabular spec or table benchmark)")
    p.add_argument("--out", required=True, help="the baseline's directory (run.json, metrics.json and the "
                                                "<split>_evaluation.json files with per-example values)")
    p.add_argument("--overwrite", action="store_true", help="replace a run or another baseline in --out")
    p.set_defaults(func=cmd_baseline)
