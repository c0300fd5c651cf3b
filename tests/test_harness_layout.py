"""The harness's packages import one way: no cycle among them (nor among its modules), read from
the source's own import statements (lazy ones inside functions included); and kvbits, below the
harness, imports nothing of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
KVBITS = ROOT / "kvbits"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The harness modules ``path`` imports, relative imports resolved: ``from . import x`` names
    the module ``x`` (not its package), ``from .x import y`` the module ``x``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found |= submodules or {base}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the harness modules it imports."""
    paths = {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}
    return {name: imported(path, set(paths)) for name, path in paths.items()}


def room(module: str) -> str:
    """The package a module lives in below ``harness`` (``harness.run``), or the module itself
    when it sits in ``harness`` directly (``harness.records``)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "harness":
            continue
        rooms.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) not in (room(module), "harness"))
    return rooms


def test_no_cycle_among_the_harness_packages():
    assert cycles(room_graph(import_graph())) == []


def test_no_cycle_among_the_harness_modules():
    assert cycles(import_graph()) == []


def test_the_harness_package_imports_nothing():
    """``import harness.records`` must not pull torch or the rest of the harness in."""
    assert import_graph()["harness"] == set()


def harness_references(path: Path) -> list[str]:
    """Where ``path`` imports the harness: import statements, and module names of it as strings
    (what importlib would load)."""
    module_name = re.compile(r"harness(\.\w+)*")
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                  if module_name.fullmatch(name)]
    return found


def test_kvbits_imports_nothing_of_the_harness():
    """The wheel holds kvbits alone; the harness runs from a checkout and is loaded by nothing in it."""
    found = [ref for path in sorted(KVBITS.rglob("*.py")) for ref in harness_references(path)]
    assert found == []


if __name__ == "__main__":  # the graph, for the curious: python tests/test_harness_layout.py
    graph = import_graph()
    for name, targets in sorted(room_graph(graph).items()):
        print(f"{name:<22} -> {', '.join(sorted(targets)) or '-'}")
    print("package cycles:", cycles(room_graph(graph)) or "none", "; module cycles:", cycles(graph) or "none")
