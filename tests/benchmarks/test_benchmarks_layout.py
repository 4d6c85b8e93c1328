"""benchmarks/ keeps its layout: programs in the folder of what they measure, each listed in the README,
each importing the others as ``benchmarks.<folder>.<module>`` (a bare ``from provenance import`` only
works from one working directory)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TOP = {"__init__.py", "provenance.py", "tables.py", "headline.py", "write_results_page.py"}  # shared, not benchmarks


def programs() -> list[Path]:
    """Every program and helper in a sub-folder (the sections modules belong to the results page)."""
    return sorted(path for pattern in ("*/*.py", "*/*.sh") for path in BENCHMARKS.glob(pattern)
                  if path.name not in ("sections.py", "__init__.py") and path.parent.name != "results")


def test_only_shared_modules_stay_at_the_top() -> None:
    stray = sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name not in TOP)
    stray += sorted(path.name for path in BENCHMARKS.glob("*.sh"))
    assert not stray, f"move these into the benchmarks/ sub-folder of what they measure: {stray}"


def test_every_program_has_its_line_in_the_readme() -> None:
    readme = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    missing = [f"{path.parent.name}/{path.name}" for path in programs()
               if f"`{path.parent.name}/{path.name}`" not in readme]
    assert not missing, f"benchmarks/README.md lists no line for {missing}"


def test_benchmark_modules_are_imported_by_their_package_name() -> None:
    bare = {path.stem for path in BENCHMARKS.glob("**/*.py")} - {"__init__"}
    wrong = []
    for path in [*programs(), *BENCHMARKS.glob("*/sections.py"), *(BENCHMARKS / name for name in TOP)]:
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.relative_to(BENCHMARKS)}: {name}" for name in names if name.split(".")[0] in bare]
    assert not wrong, f"import these as benchmarks.<folder>.<module>: {wrong}"
