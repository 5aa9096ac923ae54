"""The component folders' README.md and metadata.yaml are generated from the code (tools/component_docs.py,
`make component-docs`) and current; the components are thin calls into mtlflow; the generated facts (defaults,
kfp pin, called functions, examples) agree with independent readings of the code."""

import ast
import importlib
import importlib.util
import inspect
import re
import shutil

import pytest
import yaml

from conftest import REPO_ROOT

FOLDERS = sorted(p.parent.name for p in (REPO_ROOT / "components").glob("*/component.py"))


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("component_docs", REPO_ROOT / "tools" / "component_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def components_of(folder):
    module = importlib.import_module(f"mtlflow.components.{folder}.component")
    return [v for v in vars(module).values() if hasattr(v, "component_spec") and hasattr(v, "python_func")]


def test_committed_readmes_and_metadata_are_current(tool):
    assert tool.stale() == [], "regenerate with `make component-docs`"


def test_a_hand_edited_readme_is_found_stale(tool, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "components"
    shutil.copytree(REPO_ROOT / "components", copy, ignore=shutil.ignore_patterns("__pycache__"))
    readme = copy / "train" / "README.md"
    readme.write_text(readme.read_text().replace("training epochs", "training epochs (hand-edited)"))
    (copy / "evaluate" / "metadata.yaml").unlink()
    monkeypatch.setattr(tool, "COMPONENTS", copy)
    assert tool.stale() == ["components/evaluate/metadata.yaml", "components/train/README.md"]
    assert tool.main(["check"]) == 1
    assert "components/train/README.md" in capsys.readouterr().err
    assert tool.main(["write"]) == 0 and tool.stale() == []


def test_an_undocumented_or_unknown_argument_is_refused_naming_the_fix(tool):
    from kfp import dsl

    @dsl.component(base_image="python:3.11", install_kfp_package=False)
    def scale(x: float, factor: float = 2.0) -> float:
        """Multiply.

        Args:
            x: the value
            offset: no such input

        Returns:
            x times factor
        """
        return x * factor

    path = REPO_ROOT / "components" / "example" / "component.py"
    with pytest.raises(tool.ComponentDocError, match="no Args entry for factor: add one line each under 'Args:'"):
        tool.parse_docstring(scale, path)


@pytest.mark.parametrize("folder", FOLDERS)
def test_readme_defaults_are_the_signatures_defaults(folder):
    """Each input's default in the README's table is the Python signature's (read with inspect, not kfp)."""
    readme = (REPO_ROOT / "components" / folder / "README.md").read_text()
    for component in components_of(folder):
        section = readme.split(f"## `{component.python_func.__name__}`", 1)[1].split("\n## ", 1)[0]
        outputs = component.component_spec.outputs or {}
        for name, parameter in inspect.signature(component.python_func).parameters.items():
            if name in outputs:
                continue
            (row,) = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
            if parameter.default is inspect.Parameter.empty:
                assert "| required |" in row or name == "status", row
            else:
                assert f"| `{parameter.default!r}` |" in row, row


@pytest.mark.parametrize("folder", FOLDERS)
def test_metadata_names_the_installed_kfp_the_image_and_real_functions(folder):
    import kfp

    from mtlflow.components.image import DEFAULT_IMAGE

    metadata = yaml.safe_load((REPO_ROOT / "components" / folder / "metadata.yaml").read_text())
    assert metadata["name"] == folder and metadata["stability"] in ("alpha", "beta", "stable")
    assert metadata["dependencies"]["kubeflow"] == [{"name": "Pipelines", "version": f"=={kfp.__version__}"}]
    assert metadata["image"] == DEFAULT_IMAGE
    assert [c["name"] for c in metadata["components"]] == sorted(
        (c.python_func.__name__ for c in components_of(folder)), key=[c["name"] for c in metadata["components"]].index)
    for component in metadata["components"]:
        assert component["calls"], f"{component['name']} calls no mtlflow function"
        for dotted in component["calls"]:
            module, _, name = dotted.rpartition(".")
            assert callable(getattr(importlib.import_module(module), name)), dotted


@pytest.mark.parametrize("folder", FOLDERS)
def test_components_are_thin_calls_into_mtlflow(folder):
    """A body imports inside itself (kfp runs the function's source alone), calls a job function and copies its
    results into the kfp outputs: no control flow beyond loops over those results, one if and the writing of a
metrics file, few statements."""
    tree = ast.parse((REPO_ROOT / "components" / folder / "component.py").read_text())
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        body = [s for s in function.body[1:] if not isinstance(s, (ast.Import, ast.ImportFrom))]
        imports = [s.module for s in function.body if isinstance(s, ast.ImportFrom)]
        assert any(re.match(r"mtlflow\.(jobs|experiments|config\.pipeline)\b", m or "") for m in imports), function.name
        assert len(body) <= 8, f"{function.name}: {len(body)} statements; move the work into mtlflow.jobs"
        assert not [s for s in ast.walk(function) if isinstance(s, (ast.While, ast.Try))], function.name
        assert sum(isinstance(s, ast.If) for s in ast.walk(function)) <= 1, function.name


def test_launch_trainjob_is_one_call_of_the_launcher():
    tree = ast.parse((REPO_ROOT / "components" / "launch_trainjob" / "component.py").read_text())
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [type(s).__name__ for s in function.body] == ["Expr", "ImportFrom", "Expr"]
    assert function.body[1].module == "mtlflow.jobs.launch"


@pytest.mark.parametrize("folder", FOLDERS)
def test_readme_examples_are_quoted_from_the_pipelines(folder):
    readme = (REPO_ROOT / "components" / folder / "README.md").read_text()
    examples = re.findall(r"\*\*Example\*\* \(`pipelines/(\w+\.py)`[^\n]*\n\n```python\n(.*?)\n```", readme, re.DOTALL)
    used = [c for c in components_of(folder) if re.search(rf"\b{c.python_func.__name__}\(", "".join(
        p.read_text() for p in (REPO_ROOT / "pipelines").glob("*.py")))]
    assert len(examples) == len(used)
    for file, code in examples:
        source = (REPO_ROOT / "pipelines" / file).read_text()
        for line in code.splitlines():
            assert line.strip() in source, f"{folder}/README.md quotes a line not in pipelines/{file}: {line}"
