"""The documentation: the site builds with `mkdocs build --strict`, and the getting-started tour's shell
blocks run as written on a fresh clone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

GETTING_STARTED = REPO_ROOT / "docs" / "getting-started.md"


def tour_blocks() -> list[str]:
    """The ```bash blocks of the getting-started page's "A five-minute tour" section."""
    text = GETTING_STARTED.read_text()
    tour = text[text.index("## A five-minute tour"):]
    return re.findall(r"```bash\n(.*?)```", tour, flags=re.S)


def test_docs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "-d",
                             str(tmp_path / "site")], cwd=REPO_ROOT, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "methods" / "fairgrad" / "index.html").is_file()  # generated method pages
    assert "plan_train" in (tmp_path / "site" / "reference" / "api" / "index.html").read_text()


def test_getting_started_tour_runs_as_written(tmp_path):
    blocks = tour_blocks()
    assert len(blocks) == 4
    env = {**os.environ, "RUNS": str(tmp_path / "runs"), "MTLFLOW_CACHE": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for block in blocks:
        result = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, capture_output=True, text=True, env=env,
                                timeout=600)
        assert result.returncode == 0, f"{block}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        outputs.append(result)
    assert "alignedmtl" in outputs[0].stdout and "tasks:" in outputs[0].stdout
    assert '"properties"' in outputs[0].stdout and not outputs[0].stderr  # `| head` ends mtlflow quietly
    assert (tmp_path / "runs" / "fairgrad" / "report.html").is_file()
    assert "report:" in outputs[2].stdout and (tmp_path / "runs" / "compare" / "report.html").is_file()
    assert "exit code 2" in outputs[3].stdout and "alpha" in outputs[3].stderr
