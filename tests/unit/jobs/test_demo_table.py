"""README.md's demo table is the table of the committed demo results (docs/results/demo.json, written by `make demo
readme-table`), re-rendered through the report's own code; tools/demo_table.py's check fails on any other text."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def demo_table_tool():
    spec = importlib.util.spec_from_file_location("demo_table", REPO_ROOT / "tools" / "demo_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_committed_demo_results_table() -> None:
    tool = demo_table_tool()
    summary = json.loads(tool.COMMITTED_RESULTS.read_text())
    block = tool.readme_block(tool.README.read_text())
    assert block == tool.render(summary)
    assert tool.check() == 0
    # what the issue asks of the demo: 3 seeds of every method and reference, with intervals and verdicts
    assert all(len(row["seeds"]) >= 3 for row in summary["methods"].values())
    seeds_per_reference = {}
    for source in summary["references"]["sources"]:
        seeds_per_reference.setdefault(source["task"], set()).add(source["seed"])
    assert sorted(seeds_per_reference) == summary["tasks"]
    assert all(len(seeds) >= 3 for seeds in seeds_per_reference.values()), seeds_per_reference
    assert "± 0.0000" not in block and "no interval" not in block


@pytest.mark.parametrize("edit", ["0.9", "ls", "indistinguishable at 95 %"])
def test_a_hand_edited_readme_table_fails_the_check(edit: str, tmp_path: Path, monkeypatch) -> None:
    tool = demo_table_tool()
    readme = tool.README.read_text()
    block = tool.readme_block(readme)
    assert edit in block
    changed = tmp_path / "README.md"
    changed.write_text(tool.with_block(readme, block.replace(edit, edit + "x", 1)))
    monkeypatch.setattr(tool, "README", changed)
    assert tool.check() == 1


def test_readme_block_needs_both_markers() -> None:
    tool = demo_table_tool()
    with pytest.raises(ValueError, match="lacks the markers"):
        tool.readme_block("no markers here")
    with pytest.raises(ValueError, match="lacks the markers"):
        tool.readme_block(f"{tool.END} then {tool.BEGIN}")
