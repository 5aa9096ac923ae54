"""The tuning guide's tuned table, produced by `make demo-tuned` and checked, never typed in.

``table OUT`` writes the docs' example table ``churn.csv`` (400 real scm20d rows from the shared real-data folder,
three tasks of three kinds: the recipe of ``tests/conftest.py``'s ``churn_csv``, which a test checks this one
matches). ``update DIR`` copies what the tuning report of the tuning run in ``DIR`` (``demo-tuned/tune`` after
``make demo-tuned``) is rendered from to ``docs/results/demo-tuned.json`` and rewrites docs/guides/tuning.md between
the tuned-table markers with :func:`mtlflow.jobs.tune_report.markdown` of it (without the wall time, which is the
machine's). ``check`` re-renders the committed results and fails when the guide differs:
``tests/unit/jobs/test_tuned_table.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mtlflow.benchmarks._tabular import read_arff
from mtlflow.benchmarks.realdata import candidates, realdata_path
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, MtlflowError
from mtlflow.jobs.compare.summary import Summary, from_json
from mtlflow.jobs.tune_report import TuneReport, markdown

REPO_ROOT = Path(__file__).resolve().parent.parent
GUIDE = REPO_ROOT / "docs" / "guides" / "tuning.md"
COMMITTED_RESULTS = REPO_ROOT / "docs" / "results" / "demo-tuned.json"
BEGIN = "<!-- tuned-table:begin (tools/tuned_table.py update; do not edit by hand) -->"
END = "<!-- tuned-table:end -->"
#: what of tune.json the tuned table reads (the rest: trials, spaces, the machine's seconds, stays in the run)
STUDY_KEYS = ("kind", "method", "tasks", "chosen", "best_value", "retrained")
SPENT_KEYS = ("steps", "budget_steps", "trials", "complete", "pruned", "diverged")


def churn_table(out: Path, rows: int = 400) -> Path:
    """``churn.csv`` from the first ``rows`` rows of the real scm20d table: ``churned`` (binary: the price LBL
    above its median, "yes"/"no", 15 % of the cells blank, drawn by a seeded generator), ``spend`` (regression:
    the target MTLp2A) and ``plan`` (multiclass: the tertiles of MTLp9A); the other 61 features and 13 targets are
    features."""
    import pandas as pd

    source = realdata_path("mtr", "scm20d.arff")
    if source is None:
        raise DataError(f"the real table mtr/scm20d.arff is not in {', '.join(map(str, candidates()))}; set "
                        "MTLFLOW_REALDATA to the shared realdata folder")
    table, names = read_arff(source)
    frame = pd.DataFrame(table, columns=names).iloc[:rows].reset_index(drop=True)
    churned = pd.Series(np.where(frame["LBL"] > frame["LBL"].median(), "yes", "no"), dtype=object)
    churned.iloc[np.random.default_rng(0).choice(len(frame), size=round(0.15 * len(frame)), replace=False)] = None
    frame["churned"] = churned
    frame["plan"] = pd.qcut(frame["MTLp9A"], 3, labels=["basic", "plus", "pro"]).astype(str)
    frame = frame.drop(columns=["LBL", "MTLp9A"]).rename(columns={"MTLp2A": "spend"})
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return out


def committed(work_dir: Path) -> dict[str, Any]:
    """What the tuned table is rendered from: tune.json's studies (chosen configuration, best score, budget),
    selection mode, warnings and defaults runs, and the tuned and defaults comparisons' results.json."""
    result = atomic.read_json(work_dir / "tune.json", "tuning result")
    studies = {name: {**{k: study[k] for k in STUDY_KEYS}, "spent": {k: study["spent"][k] for k in SPENT_KEYS}}
               for name, study in result["studies"].items()}
    return {"tune": {"studies": studies, "selection": {"mode": result["selection"]["mode"]},
                     "warnings": result["warnings"], "defaults": {"runs": result["defaults"]["runs"]}},
            "tuned": atomic.read_json(work_dir / result["comparison"]["results"], "tuned results"),
            "defaults": atomic.read_json(work_dir / result["defaults"]["results"], "defaults results")}


def render(results: dict[str, Any]) -> str:
    """The tuned table of the committed results' content."""
    report = TuneReport(results["tune"], from_json(Summary, results["tuned"]),
                        from_json(Summary, results["defaults"]))
    return markdown(report, wall_time=False)


def guide_block(guide: str) -> str:
    """The text between the markers (a ValueError when they are missing or out of order)."""
    start, end = guide.find(BEGIN), guide.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/guides/tuning.md lacks the markers {BEGIN!r} ... {END!r}")
    return guide[start + len(BEGIN):end].strip("\n") + "\n"


def with_block(guide: str, block: str) -> str:
    guide_block(guide)  # the markers must be there
    start, end = guide.find(BEGIN) + len(BEGIN), guide.find(END)
    return guide[:start] + "\n" + block.strip("\n") + "\n" + guide[end:]


def update(work_dir: Path) -> None:
    text = json.dumps(committed(work_dir), indent=2) + "\n"  # in the run's order: LS first, as the report has it
    atomic.write_text(COMMITTED_RESULTS, text)
    atomic.write_text(GUIDE, with_block(GUIDE.read_text(), render(json.loads(text))))
    print(f"docs/guides/tuning.md's tuned table and {COMMITTED_RESULTS.relative_to(REPO_ROOT)} updated from "
          f"{work_dir}")


def check() -> int:
    expected = render(json.loads(COMMITTED_RESULTS.read_text()))
    if guide_block(GUIDE.read_text()) != expected:
        print("docs/guides/tuning.md's tuned table differs from docs/results/demo-tuned.json; run `make demo-tuned "
              "tuned-table`", file=sys.stderr)
        return 1
    print("docs/guides/tuning.md's tuned table matches docs/results/demo-tuned.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    table = sub.add_parser("table", help="write churn.csv (400 real scm20d rows) for the tuned demo")
    table.add_argument("out", type=Path)
    up = sub.add_parser("update", help="copy the tuned demo's results and rewrite the guide's table")
    up.add_argument("work_dir", nargs="?", default="demo-tuned/tune", type=Path)
    sub.add_parser("check", help="fail when the guide's table is not the committed results' table")
    args = parser.parse_args(argv)
    if args.action == "table":
        try:
            print(churn_table(args.out))
        except MtlflowError as exc:
            print(f"tuned_table: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.action == "update":
        update(args.work_dir)
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
