"""The house rules on the code itself: ruff is clean ([tool.ruff] in pyproject.toml: pyflakes, isort, bugbear,
pyupgrade, function-local imports), no function is over 80 lines and no module over 700 lines in the package,
the components, the pipelines and the tools (docs/development: functions <= 80 lines, modules <= 700 lines)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE_FOLDERS = ("src", "components", "pipelines", "tools")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 700


def code_files() -> list[Path]:
    return sorted(path for folder in CODE_FOLDERS for path in (ROOT / folder).rglob("*.py"))


def function_lengths(source: str, filename: str = "<source>") -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function and method, nested ones included: a
    function's length runs from its `def` line (decorators excluded) to its last line, docstring and nested
    functions included."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return found


def is_argparse_registration(path: Path, name: str) -> bool:
    """The `register` functions of the CLI's modules only declare sub-commands and their options (argparse calls,
    one after another): they are exempt from the function-length rule."""
    return path.parent == ROOT / "src" / "mtlflow" / "cli" and name == "register"


def test_function_lengths_counts_def_to_last_line_with_nesting():
    source = "def a():\n    x = 1\n\n    def b():\n        return x\n    return b\n\n\nclass C:\n    @staticmethod\n" \
             "    def m():\n        pass\n"
    assert function_lengths(source) == [("a", 1, 6), ("a.b", 4, 2), ("C.m", 11, 2)]


def test_ruff_is_clean():
    """`ruff check` over src/, components/, pipelines/, tools/ and tests/ (the files [tool.ruff] includes); the
    failure lists each violation with its file, line and rule."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout[-6000:] + result.stderr[-2000:]
                                    + "\nfix: `.venv/bin/ruff check --fix` for the fixable ones, the others by hand")


def test_no_function_over_80_lines():
    too_long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                for path in code_files() for name, line, length in function_lengths(path.read_text(encoding="utf-8"), str(path))
                if length > MAX_FUNCTION_LINES and not is_argparse_registration(path, name)]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them): " + "; ".join(too_long)


def test_no_module_over_700_lines():
    too_long = [f"{path.relative_to(ROOT)} ({n} lines)" for path in code_files()
                if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them): " + "; ".join(too_long)
