"""The package's structure: import layers (import-linter contracts in pyproject.toml), no import cycles,
and the Kubeflow components and pipelines installed under the mtlflow namespace only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[3]


def test_import_layers_hold():
    """`lint-imports` checks the layers contract; it fails naming the offending import."""
    result = subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in result.stdout


def strongly_connected_components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (a cycle is a component of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_strongly_connected_components_finds_a_hand_made_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert sorted(c for c in strongly_connected_components(edges) if len(c) > 1) == [["a", "b", "c"]]


def test_no_import_cycles():
    """Module-level import graph of mtlflow (imports inside functions included; annotation-only imports
    under TYPE_CHECKING excluded) has no cycle."""
    graph = grimp.build_graph("mtlflow", exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = [c for c in strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_components_and_pipelines_install_under_the_mtlflow_namespace(tmp_path):
    """From outside the repository, `mtlflow.components` / `mtlflow.pipelines` import and top-level
    `components` / `pipelines` packages do not exist."""
    code = ("import importlib.util as u, mtlflow.components.train.component, mtlflow.pipelines.benchmark_sweep;"
            "print(u.find_spec('components'), u.find_spec('pipelines'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "None"]
    assert importlib.util.find_spec("mtlflow.components") is not None


def _installed_layers():
    """tools/import_layers.py, the contract type pyproject.toml's layers contract uses."""
    spec = importlib.util.spec_from_file_location("import_layers", ROOT / "tools" / "import_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layers_contract_reads_the_kubeflow_packages():
    """grimp alone reads src/mtlflow only; the contract adds mtlflow.pipelines and mtlflow.components (installed
    from the top-level folders) with their imports and the imports of them, so a wrong one breaks it."""
    import tomllib

    import_layers = _installed_layers()
    graph = grimp.build_graph("mtlflow", exclude_type_checking_imports=True)
    assert "mtlflow.pipelines.runner" not in graph.modules   # what the contract exists for
    added = import_layers.add_folder_packages(graph)
    assert {"mtlflow.pipelines.runner", "mtlflow.components.train.component"} <= set(added)
    assert not [m for m in added if m.rpartition(".")[2].startswith("test_")]   # the components' tests are not
    imported_by = graph.find_modules_directly_imported_by
    assert "mtlflow.components.train.component" in imported_by("mtlflow.pipelines.benchmark_sweep")   # within
    assert "mtlflow.jobs.data" in imported_by("mtlflow.pipelines.runner")                           # out of them
    assert "mtlflow.pipelines.runner" in imported_by("mtlflow.cli.pipelines")                       # into them
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    contract = import_layers.InstalledLayersContract(
        name="layers", session_options={"root_packages": ["mtlflow"]},
        contract_options={"containers": options["containers"], "layers": options["layers"]})
    assert contract.check(graph, verbose=False).kept
    graph.add_import(importer="mtlflow.pipelines.cluster", imported="mtlflow.cli", line_number=1,
                     line_contents="from mtlflow.cli import main")
    assert not contract.check(graph, verbose=False).kept
