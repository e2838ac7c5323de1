"""The rooms depend on each other in one direction only: no import cycle, function-local imports included.

Every ``import`` statement of every module (at any depth, so an import hidden inside a
function counts) is read from the source; the graph between the rooms (dataset_builder,
generation, scoring, analysis) must have no cycle, and the shared ground (``craftmd.*``
modules outside the rooms, such as the release contract, the model layer, the metric
registry) must not reach up into a room, except the modules that run whole jobs on top
of the rooms (the CLI, the pipeline, ingest and score commands).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {"dataset_builder": "dataset_builder", "generation": "generation", "scoring": "scoring", "analysis": "analysis", "cards": "cards"}
#: Shared-ground modules that run jobs across rooms (they sit above the rooms, not below).
JOBS = {"craftmd.cli", "craftmd.pipeline", "craftmd.submit", "craftmd.ingest_cli", "craftmd.export_cli",
        "craftmd.inspect_bridge.tasks", "craftmd.inspect_bridge.logs"}  # the inspect bridge runs the tasks and reads releases


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] == "craftmd":
        return ".".join(parts)
    return ".".join(["craftmd", *parts])


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
    return {n for n in out if n == "craftmd" or n.startswith("craftmd.")}


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "shared"


def graph() -> dict[str, dict[str, set[str]]]:
    """room -> room it imports -> the module pairs that do it."""
    edges: dict[str, dict[str, set[str]]] = {}
    folders = [ROOT / "craftmd", *(ROOT / f for f in ROOMS.values())]
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            mod = _module(path)
            for imp in _imports(path, mod):
                a, b = _room(mod), _room(imp)
                if a != b:
                    if a == "shared" and mod in JOBS:
                        continue
                    edges.setdefault(a, {}).setdefault(b, set()).add(f"{mod} -> {imp}")
    return edges


def test_no_cycle_between_rooms():
    edges = graph()
    seen, stack = set(), []

    def visit(n):
        if n in stack:
            cycle = stack[stack.index(n):] + [n]
            hops = [sorted(edges[x][y])[0] for x, y in zip(cycle, cycle[1:])]
            pytest.fail("import cycle between rooms: " + " -> ".join(cycle) + " (" + "; ".join(hops) + ")")
        if n in seen:
            return
        stack.append(n)
        for m in edges.get(n, {}):
            visit(m)
        stack.pop()
        seen.add(n)

    for n in list(edges):
        visit(n)


def test_shared_ground_does_not_reach_into_rooms():
    up = edges = graph().get("shared", {})
    assert not up, "shared ground imports a room: " + "; ".join(sorted(x for s in edges.values() for x in s))


def test_analysis_only_reads():
    """Analysis never writes a release, builds a dataset or ingests: it imports none of those."""
    bad = []
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        for imp in _imports(path, _module(path)):
            if imp.startswith(("craftmd.dataset_builder", "craftmd.generation")) or imp.endswith(("grade", "ingest")):
                bad.append(f"{_module(path)} -> {imp}")
    assert not bad, "analysis imports a writer: " + "; ".join(bad)
