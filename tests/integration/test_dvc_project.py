"""What DVC makes of this project's dvc.yaml, params.yaml and .dvc/ (the working tree's, in a scratch git + DVC
repository, without training anything): a change of one method's hyper-parameters changes only that method's
stages, and `dvc plots show` writes a page that loads nothing from the network and draws its plots offline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _run(args, cwd) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.com",
           "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@example.com"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _dvc(cwd, *args) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd)


@pytest.fixture
def project(tmp_path) -> Path:
    """The project's pipeline files and DVC configuration, in a new git repository with DVC initialised."""
    repo = tmp_path / "project"
    repo.mkdir()
    _run(["git", "init", "-q"], repo)
    _dvc(repo, "init", "-q")
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    return repo


def stage_paths(repo: Path) -> dict[str, list[str]]:
    """Every stage of the resolved pipeline (matrices expanded) with the paths of its dependencies and outputs."""
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc_repo:
        return {stage.name: [str(Path(d.def_path)) for d in [*stage.deps, *stage.outs]
                                   if not d.def_path.endswith(".yaml")]
                for stage in dvc_repo.index.stages}


def lock_stand_ins(project: Path) -> dict[str, list[str]]:
    """dvc.lock as after a `dvc repro` of the project's params.yaml, with stand-ins for the data, code and
    results that do not exist yet; returns the stages and their paths."""
    stages = stage_paths(project)
    # stand-ins for the data, code and results (DVC only hashes them here): a folder where a stage names a path
    # inside it (runs/mtl, src/mtlflow/engine), else a file
    paths = {path for paths in stages.values() for path in paths}
    for path in sorted(paths):
        is_folder = any(other.startswith(path + "/") for other in paths)
        target = project / path / "stand-in" if is_folder else project / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_text(path)
    _dvc(project, "commit", "-f", "-q")
    return stages


def test_a_method_hyper_parameter_changes_only_that_methods_stages(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    stages = lock_stand_ins(project)
    status = json.loads(_dvc(project, "status", "--json"))
    assert status == {"source": ["always changed"]}

    params["method_hparams"]["fairgrad"]["alpha"] = 2.0  # `dvc exp run -S method_hparams.fairgrad.alpha=2.0`
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    status = json.loads(_dvc(project, "status", "--json"))
    status.pop("source")
    fairgrads = {f"train@fairgrad-{i}" for i, _ in enumerate(params["seeds"])}
    assert params["dvc"]["experiment_method"] == "fairgrad"
    assert set(status) == fairgrads | {"experiment"}, status
    assert set(stages) - set(status) >= {f"train@{m}-0" for m in params["methods"] if m != "fairgrad"}
    for reasons in status.values():
        assert reasons == [{"changed deps": {"params.yaml": {"method_hparams.fairgrad": "modified"}}}]


def write_plot_data(project: Path) -> int:
    """One file of each of the pipeline's plots (the fields the stages write); returns how many plots there are."""
    curve = [{"epoch": e, "train_loss": 1.0 / e, "val": 0.5 + 0.1 * e, "test": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    for folder in ("plots/train/ls-s0", "plots/experiment/s0"):
        (project / folder).mkdir(parents=True)
        (project / folder / "left.json").write_text(json.dumps(curve))
    (project / "plots" / "pareto.json").write_text(json.dumps([
        {"method": m, "label": m, "first task error": a, "second task error": b, "pareto_optimal": True}
        for m, a, b in (("ls", 0.2, 0.3), ("famo", 0.3, 0.2))]))
    return 3


def test_plots_show_loads_nothing_from_the_network_and_draws_offline(project, tmp_path):
    from dvc_render.vega import VegaRenderer

    n_plots = write_plot_data(project)
    _dvc(project, "plots", "show", "-o", str(tmp_path / "out"))
    page = (tmp_path / "out" / "index.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "a <script src=...> loads code from elsewhere"
    assert page.count("vegaEmbed('#") == n_plots
    # the inlined libraries are the versions DVC's own page loads, the ones its plot specifications are made for
    wanted = re.findall(r"npm/(vega(?:-lite|-embed)?@[\d.]+)", VegaRenderer.SCRIPTS)
    assert len(wanted) == 3
    assert re.findall(r'<script type="text/javascript">/\* (vega(?:-lite|-embed)?@[\d.]+) \*/', page) == wanted

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless browser to draw the page with")
    # every request to the network goes to a closed port: what draws, draws offline
    drawn = _run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--proxy-server=http://127.0.0.1:9",
                  f"--user-data-dir={tmp_path / 'browser'}", "--virtual-time-budget=10000", "--dump-dom",
                  (tmp_path / "out" / "index.html").as_uri()], tmp_path)
    assert drawn.count('<canvas') == n_plots


def test_stage_status_shows_a_new_table_version_that_dvc_status_does_not(project):
    """`dvc status` says "always changed" for the source stage whatever the data; `mtlflow stage status` says
    whether the data's inputs (here a task spec's table) changed since dvc.lock, and what else would re-run."""
    (project / "churn.csv").write_text("x,churned\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n")
    (project / "churn.yaml").write_text("name: churn\nsource: {table: churn.csv}\n"
                                        "tasks: [{name: churned, type: binary}]\n")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(spec="churn.yaml", data_options={}, methods=["ls"], seeds=[0], reference_seeds=[0],
                  method_hparams={"ls": {}}, dvc={"reference_tasks": ["churned"], "experiment_method": "ls"})
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_cli("stage", "source", cwd=project).returncode == 0
    lock_stand_ins(project)
    done = run_cli("stage", "status", cwd=project)
    assert done.returncode == 0 and json.loads(done.stdout) == {}, done.stderr
    assert "everything is up to date" in done.stderr

    (project / "churn.csv").write_text("x,churned\n1,1\n2,1\n3,0\n4,1\n5,0\n6,1\n")  # the next version
    assert json.loads(_dvc(project, "status", "--json")) == {"source": ["always changed"]}
    done = run_cli("stage", "status", cwd=project)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert list(status) == ["source"] and "changed since dvc.lock (table_sha256)" in status["source"][0]
    assert done.stderr.startswith("source: the data's inputs changed since dvc.lock (table_sha256)")
    # a stage that DVC itself sees as changed is listed as `dvc status` lists it
    (project / "runs" / "mtl" / "ls-s0").write_text("another result")
    assert json.loads(run_cli("stage", "status", cwd=project).stdout)["train@ls-0"] == [
        {"changed outs": {"runs/mtl/ls-s0": "modified"}}]
