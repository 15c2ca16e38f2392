"""The package's layer rule and its import graph (docs/architecture.md, "Layers").

Packages import only their own layer and those below it:

    base (gpdyn/*.py: errors, device, progress, runs, ...)
    data, gp, recipes          import base only
    robots                     imports data (and base)
    sim                        imports robots, data
    control                    imports sim, robots, gp, data
    experiments                imports control and everything below
    cli                        imports anything

Every import statement counts, also those inside functions (a lazy import is still a
dependency); imports under ``if TYPE_CHECKING:`` do not (annotations only). No module may
reach itself through its imports (no cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpdyn"
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "data": set(),
    "gp": set(),
    "recipes": set(),
    "robots": {"data"},
    "sim": {"robots", "data"},
    "control": {"sim", "robots", "gp", "data"},
    "experiments": {"control", "sim", "robots", "gp", "data", "recipes"},
    "cli": {"experiments", "control", "sim", "robots", "gp", "data", "recipes"},
}
ENTRY_POINTS = {"gpdyn.__main__"}  # ``python -m gpdyn`` calls the command line


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "base"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gpdyn"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpdyn"))
    return found


GRAPH = {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_graph_sees_the_package():
    assert len(GRAPH) > 80 and "gpdyn.robots.task" in GRAPH and "gpdyn.gp.base" in GRAPH["gpdyn.gp.svdgp"]
    assert all(_layer(m) in ALLOWED for m in GRAPH), sorted({_layer(m) for m in GRAPH} - set(ALLOWED))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_upward_import(layer):
    upward = sorted(f"{module} imports {target}" for module, targets in GRAPH.items()
                    if _layer(module) == layer and module not in ENTRY_POINTS for target in targets
                    if _layer(target) not in ALLOWED[layer] | {layer, "base"})
    assert not upward, upward


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert not _cycles(GRAPH), _cycles(GRAPH)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
