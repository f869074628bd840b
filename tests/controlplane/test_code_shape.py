"""Modules small enough to read in one sitting and functions that fit on a screen (issue 25's
"none over 600 lines"; the project's style: functions of 80 lines or fewer). Checked on what ships
(the apps and the SDK), parsed, not imported; tests and benchmarks are scripts and exempt."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_LINES = 600
FUNCTION_LINES = 80
EXEMPT_TOP = ("tests", "bench", "infra", "docs")


def shipped_modules(root: Path) -> list[Path]:
    """Every Python file git tracks under `root`, but tests, benchmarks and migrations."""
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        root / name
        for name in listed
        if name.split("/")[0] not in EXEMPT_TOP
        and "migrations" not in name.split("/")
        and "tests" not in name.split("/")
        and (root / name).is_file()
    ]


def oversized(root: Path) -> list[str]:
    """`path: N lines` for each module over MODULE_LINES, `path:line name N lines` for each
    function over FUNCTION_LINES."""
    found: list[str] = []
    for path in shipped_modules(root):
        source = path.read_text()
        where = path.relative_to(root)
        if (lines := source.count("\n")) > MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} {node.name} {length} lines")
    return found


def test_shipped_modules_and_functions_fit_in_one_reading() -> None:
    assert oversized(ROOT) == [], "split by concern (docs/ARCHITECTURE.md §1)"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_a_long_module_and_a_long_function_are_reported(repo: Path) -> None:
    (repo / "fleet").mkdir()
    (repo / "fleet" / "long.py").write_text("x = 1\n" * 601)

    def function(name: str, body_lines: int) -> str:
        return f"def {name}():\n" + "    y = 1\n" * body_lines + "\n\n"

    # 80 lines with its `def`, then one of 81 starting on line 83.
    (repo / "fleet" / "func.py").write_text(function("fits", 79) + function("too_long", 80))
    (repo / "tests").mkdir()
    (repo / "tests" / "long_test.py").write_text("x = 1\n" * 700)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    assert sorted(oversized(repo)) == ["fleet/func.py:83 too_long 81 lines", "fleet/long.py: 601 lines"]
