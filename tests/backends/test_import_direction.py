"""Calls go one way: the loop imports its backends, never the reverse; the runtime knows nothing of either."""

from __future__ import annotations

import ast
from pathlib import Path

import spotlight

PACKAGE = Path(spotlight.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_backends_never_import_the_loop() -> None:
    for path in sorted((PACKAGE / "backends").glob("*.py")):
        assert "spotlight.trainer" not in imported_modules(path), path.name


def test_the_runtime_imports_neither_the_loop_nor_the_backends_nor_the_update() -> None:
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        for module in imported_modules(path):
            assert not module.startswith(("spotlight.trainer", "spotlight.backends", "spotlight.rl")), \
                f"{path.name} imports {module}"
