"""The README's demo table, produced by `make demo` and checked, never typed in.

``update`` copies the demo's ``results.json`` (``demo/results/results.json`` after ``make demo``) to
``docs/results/demo.json`` and rewrites the README between the demo-table markers with
:func:`mtlflow.jobs.report.headline_markdown` of it (the verdict and the results table, without the step time,
which is the machine's). ``check`` re-renders the committed results and fails when the README differs:
``tests/unit/jobs/test_demo_table.py`` runs it, and ``make e2e`` compares a fresh demo's table with the README.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtlflow.core import atomic
from mtlflow.jobs.compare.summary import Summary, from_json
from mtlflow.jobs.report import headline_markdown

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
COMMITTED_RESULTS = REPO_ROOT / "docs" / "results" / "demo.json"
BEGIN = "<!-- demo-table:begin (tools/demo_table.py update; do not edit by hand) -->"
END = "<!-- demo-table:end -->"


def render(summary: dict) -> str:
    """The demo table of a results.json's content."""
    return headline_markdown(from_json(Summary, summary))


def readme_block(readme: str) -> str:
    """The text between the markers (a ValueError when they are missing or out of order)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    return readme[start + len(BEGIN):end].strip("\n") + "\n"


def with_block(readme: str, block: str) -> str:
    readme_block(readme)  # the markers must be there
    start, end = readme.find(BEGIN) + len(BEGIN), readme.find(END)
    return readme[:start] + "\n" + block.strip("\n") + "\n" + readme[end:]


def update(results: Path) -> None:
    summary = atomic.read_json(results, "demo results")
    atomic.write_text(COMMITTED_RESULTS, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    atomic.write_text(README, with_block(README.read_text(), render(summary)))
    print(f"README.md's demo table and {COMMITTED_RESULTS.relative_to(REPO_ROOT)} updated from {results}")


def check() -> int:
    expected = render(json.loads(COMMITTED_RESULTS.read_text()))
    actual = readme_block(README.read_text())
    if actual != expected:
        print("README.md's demo table differs from docs/results/demo.json; run `make demo readme-table`",
              file=sys.stderr)
        return 1
    print("README.md's demo table matches docs/results/demo.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("update", help="copy the demo's results and rewrite the README's table")
    up.add_argument("results", nargs="?", default="demo/results/results.json", type=Path)
    sub.add_parser("check", help="fail when the README's table is not the committed results' table")
    args = parser.parse_args(argv)
    if args.action == "update":
        update(args.results)
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
