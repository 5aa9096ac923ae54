"""Every Kubeflow component folder documents its component(s): a README naming every input and output of
the compiled component spec (kubeflow/pipelines-components' layout)."""

from __future__ import annotations

import importlib

import pytest

from conftest import REPO_ROOT

FOLDERS = sorted(p.name for p in (REPO_ROOT / "components").iterdir() if (p / "component.py").is_file())


@pytest.mark.parametrize("folder", FOLDERS)
def test_component_readme_lists_every_input_and_output(folder):
    readme = (REPO_ROOT / "components" / folder / "README.md").read_text()
    module = importlib.import_module(f"mtlflow.components.{folder}.component")
    components = [v for v in vars(module).values() if hasattr(v, "component_spec")]
    assert components
    for component in components:
        spec = component.component_spec
        assert f"## `{component.python_func.__name__}`" in readme
        for name in [*(spec.inputs or {}), *(spec.outputs or {})]:
            assert f"| `{name}` |" in readme, f"{folder}/README.md lacks {name}"


def test_every_component_folder_is_found():
    assert len(FOLDERS) == 12
