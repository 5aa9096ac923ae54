"""import-linter's layers contract over the whole installed ``mtlflow``, the Kubeflow packages included
(pyproject.toml's ``[tool.importlinter]`` names it as the ``installed_layers`` contract type).

grimp reads a package from its folder (``src/mtlflow``). ``mtlflow.pipelines`` and ``mtlflow.components``
install from the repository's top-level ``pipelines/`` and ``components/`` (setup.py's ``package_dir``), so
in the editable install grimp never sees their modules, and it resolves an import of one of them
(``from mtlflow.pipelines import runner``) to ``mtlflow`` itself: neither their imports nor imports of them
were checked. :class:`InstalledLayersContract` adds those packages' modules and imports to the graph, and
the imports of them from the rest of mtlflow, then checks the layers as import-linter's ``layers`` contract
does. Imports under ``if TYPE_CHECKING:`` are left out (the session's ``exclude_type_checking_imports``),
and so are the components' own tests (``test_*.py``, ``conftest.py``), which drive the CLI as users do.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import grimp
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import ContractCheck

#: the packages installed from folders outside the root package's folder
FOLDER_PACKAGES = ("mtlflow.pipelines", "mtlflow.components")
ROOT = "mtlflow"


class InstalledLayersContract(LayersContract):
    """import-linter's layers contract, checked on the graph with :data:`FOLDER_PACKAGES` added."""

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        add_folder_packages(graph)
        return super().check(graph, verbose)


def add_folder_packages(graph: grimp.ImportGraph) -> list[str]:
    """Add the modules of :data:`FOLDER_PACKAGES` that ``graph`` lacks, their imports within ``mtlflow``,
    and the imports of them by the modules already in it; returns the modules added."""
    root = importlib.util.find_spec(ROOT)
    added = {}
    for package in FOLDER_PACKAGES:
        if package in graph.modules:  # a regular install puts it inside mtlflow's folder: grimp has it
            continue
        folder = Path(next(iter(importlib.util.find_spec(package).submodule_search_locations)))
        added.update(_modules(package, folder))
    for module in added:
        graph.add_module(module)
    modules = graph.modules
    scanned = dict(added)
    scanned.update(_modules(ROOT, Path(next(iter(root.submodule_search_locations)))))
    for importer, path in scanned.items():
        for imported, line_number, line in _imports(importer, path, is_package=path.name == "__init__.py"):
            target = _module_of(imported, modules)
            # the modules grimp read keep the imports it found; only those of the added modules are new
            if target is not None and (importer in added or target in added):
                graph.add_import(importer=importer, imported=target, line_number=line_number, line_contents=line)
    return sorted(added)


def _modules(package: str, folder: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder).with_suffix("")
        if "__pycache__" in relative.parts or path.name.startswith("test_") or path.name == "conftest.py":
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        yield ".".join((package, *parts)), path


def _imports(module: str, path: Path, is_package: bool) -> Iterator[tuple[str, int, str]]:
    """(imported name, line number, line) of every import in ``path`` outside ``if TYPE_CHECKING:`` blocks;
    ``from a import b`` gives ``a.b`` (a module or a name in ``a``)."""
    source = path.read_text()
    lines = source.splitlines()
    package = module if is_package else module.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, lines[node.lineno - 1].strip()


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _module_of(name: str, modules: set[str]) -> str | None:
    """The module of mtlflow that ``name`` (a module, or a name defined in one) is, or None outside mtlflow."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None
