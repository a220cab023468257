"""The package layout: engine/ is grouped by stage, and a lower stage never imports a higher one.

Every module under engine/ is parsed with ``ast`` (no import runs): every import counts, at any depth,
inside functions and under ``TYPE_CHECKING`` too. The checks:
- no import circle between modules;
- no import from a lower stage to a higher one (STAGES, lowest first; a module's stage is its first
  folder under engine/; ``engine`` itself, which only holds the version, is stage 0);
- no module at engine/ root but ``main.py`` and ``__init__.py``.

``LAYOUT_ROOT=/some/checkout pytest tests/test_layout.py`` checks another checkout's engine/.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf_latest

ROOT = Path(os.environ.get("LAYOUT_ROOT") or Path(__file__).resolve().parent.parent)
ENGINE = ROOT / "engine"

# lowest first: a module may import its own stage and lower ones
STAGES = ["runtime", "config", "report", "datasets", "model", "distributed", "training", "tasks", "tools",
          "main"]
ROOT_MODULES = {"__init__.py", "main.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py")) if "__pycache__" not in p.parts}


def imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The engine modules that the module ``name`` at ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # ``from engine.x import y``: y may be a module of its own
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else module)
    result = set()
    for target in found:
        while target and target not in modules:  # ``import engine.x.y`` of a name we do not know
            target = target.rpartition(".")[0]
        if target and target != name:
            result.add(target)
    return result


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imported(path, name, modules) for name, path in modules.items()}


def stage_of(module: str) -> int | None:
    parts = module.split(".")
    if parts == ["engine"]:
        return 0
    return STAGES.index(parts[1]) if parts[1] in STAGES else None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a list of modules, the first again at the end) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:  # Tarjan, recursive: the graph is small
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:  # a shortest circle through the component's first module
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    queue = []
                    cycles.append(paths[node] + [start])
                    break
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
    return cycles


def test_engine_root_holds_only_main_and_init():
    loose = sorted(p.name for p in ENGINE.glob("*.py") if p.name not in ROOT_MODULES)
    assert not loose, f"modules at engine/ root (move each into the folder of its stage): {loose}"


def test_every_module_has_a_stage():
    unplaced = sorted(m for m in all_modules() if stage_of(m) is None)
    assert not unplaced, f"modules outside the stage folders {STAGES}: {unplaced}"


def test_no_import_circles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_lower_stages_never_import_higher_ones():
    wrong = []
    for module, targets in sorted(import_graph().items()):
        here = stage_of(module)
        for target in sorted(targets):
            there = stage_of(target)
            if here is not None and there is not None and there > here:
                wrong.append(f"{module} ({STAGES[here]}, stage {here}) -> {target} "
                             f"({STAGES[there] if there else 'engine'}, stage {there})")
    assert not wrong, f"imports from a lower stage to a higher one (order: {' < '.join(STAGES)}):\n" + \
        "\n".join(wrong)
