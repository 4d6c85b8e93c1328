"""The package's layout: folders that import one way, no kind branch outside ``spotlight.models``, small folders.

`tests/test_structure.py` holds the module-level rules (no import cycle, no file over 500 lines, the
maths below the machinery); this file holds the folder-level ones that keep the layout readable
(``docs/architecture.md`` draws it):

- **Folders import one way.** Collapse every module to its top-level folder (``spotlight.runtime.sp.agent``
  to ``runtime``; a top-level module is its own) and the graph between folders has no cycle. Each
  folder defines its own config section (``runtime/section.py``, ``ranks/section.py``, ...), a pydantic
  schema with no machinery, and the run configs (`spotlight.config`, `spotlight.plan_config`) gather
  them: a run config's import of a section is a read of configuration, not a dependency on the
  folder's machinery, and is left out. Every other import counts.
- **No kind branch outside ``spotlight.models``.** The loop, the workers and SP ask a policy (its
  protocol, `spotlight.models.policy`) or a kind's spec (`spotlight.models.spec`); an ``isinstance`` on a
  model class or a ``getattr``/``hasattr`` probe for a policy member elsewhere is the branching the specs
  replaced.
- **No folder over 15 modules**: past that a folder hides its structure; split it by job.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_structure import PACKAGE_ROOT, ModuleImports, cycles, import_graph, package_modules, write_package

MAX_MODULES_PER_FOLDER = 15
CONFIGS = frozenset({"spotlight.config", "spotlight.plan_config"})  # the run configs, which gather every section
KIND_TYPES = frozenset({"TinyDiT", "TinyDiTConfig", "DiffusersPolicy", "DiffusersPolicyConfig", "PipelinePolicy",
                        "LoraShadow", "ReferencePolicy"})
POLICY_MEMBERS = frozenset({"tokenize", "decode_images", "schedule", "save_for_diffusers", "shard_root", "transformer",
                            "latent_shape", "describe", "broadcast_state", "lora_parameters", "bind_prompts"})


def folder_of(module: str) -> str:
    """The top-level folder of ``module`` (a top-level module is its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def is_section(module: str) -> bool:
    """A config section module: ``section`` or ``*_section`` (a pydantic schema, no machinery)."""
    name = module.rpartition(".")[2]
    return name == "section" or name.endswith("_section")


def imports_between_folders(graph: dict[str, ModuleImports]) -> list[tuple[str, str]]:
    """Every (module, imported module) pair across folders, less a run config's reads of a folder's section."""
    return [(module, target) for module, imports in sorted(graph.items()) for target in sorted(imports.spotlight)
            if folder_of(module) != folder_of(target) and not (module in CONFIGS and is_section(target))]


def folder_graph(graph: dict[str, ModuleImports]) -> dict[str, frozenset[str]]:
    """Each folder with the folders its modules import (itself left out)."""
    edges: dict[str, set[str]] = {folder_of(module): set() for module in graph}
    for module, target in imports_between_folders(graph):
        edges[folder_of(module)].add(folder_of(target))
    return {folder: frozenset(targets) for folder, targets in edges.items()}


def folder_cycle_witnesses(graph: dict[str, ModuleImports]) -> list[str]:
    """For each cycle between folders, the module imports that close it (``a.x imports b.y``)."""
    found = []
    for cycle in cycles(folder_graph(graph)):
        steps = []
        for source, target in zip(cycle, cycle[1:], strict=False):
            witness = next(f"{m} imports {t}" for m, t in imports_between_folders(graph)
                           if folder_of(m) == source and folder_of(t) == target)
            steps.append(witness)
        found.append(" -> ".join(cycle) + " (" + "; ".join(steps) + ")")
    return found


def kind_branches(root: Path = PACKAGE_ROOT) -> list[str]:
    """``path:line`` of each isinstance on a model class or getattr/hasattr probe of a policy member outside models/."""
    found = []
    for module, path in package_modules(root).items():
        if module.startswith(f"{root.name}.models"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
                continue
            kind, target = node.func.id, node.args[1]
            if kind == "isinstance":
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                if any((n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)) in KIND_TYPES for n in names):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
            elif kind in ("getattr", "hasattr") and isinstance(target, ast.Constant) and target.value in POLICY_MEMBERS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return sorted(found)


def crowded_folders(root: Path = PACKAGE_ROOT, limit: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    """Folders with more than ``limit`` modules (``__init__`` not counted), by path relative to the repository."""
    counts = {folder: sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
              for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]}
    return {str(folder.relative_to(root.parent)): n for folder, n in counts.items()
            if n > limit}


def test_folders_import_one_way() -> None:
    found = folder_cycle_witnesses(import_graph())
    assert not found, "folders that import each other (move the shared part below both): " + " | ".join(found)


def test_no_kind_branch_outside_models() -> None:
    assert kind_branches() == [], "ask the policy or its spec (spotlight.models.spec) instead of branching on its kind"


def test_no_folder_over_15_modules() -> None:
    assert crowded_folders() == {}, "split each folder by job"


# --- the checks themselves, on small packages written here -----------------------------------------


def test_a_folder_cycle_is_named_with_the_imports_that_close_it(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "a/__init__.py": "", "a/x.py": "from spotlight.b.y import f\n",
        "b/__init__.py": "", "b/y.py": "def f():\n    from spotlight.a.z import g\n", "a/z.py": "",
        "b/section.py": "", "config.py": "from spotlight.b.section import S\n", "a/w.py": "import spotlight.config\n",
    })
    found = folder_cycle_witnesses(import_graph(package))
    assert found == ["a -> b -> a (spotlight.a.x imports spotlight.b.y; spotlight.b.y imports spotlight.a.z)"]


def test_kind_branches_and_crowded_folders_are_found(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "models/__init__.py": "", "models/m.py": "isinstance(p, TinyDiT)\n",
        "loop.py": "isinstance(p, (int, spec.DiffusersPolicy))\ngetattr(p, 'tokenize', None)\ngetattr(p, 'other')\n",
        **{f"many/m{i}.py": "" for i in range(16)}, "many/__init__.py": "",
    })
    assert kind_branches(package) == ["spotlight/loop.py:1", "spotlight/loop.py:2"]
    assert crowded_folders(package) == {"spotlight/many": 16}
