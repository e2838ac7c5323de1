"""Modules and rooms depend on each other in one direction only: no import cycle, function-local imports included.

Every ``import`` statement of every module (at any depth, so an import hidden inside a
function counts) is read from the source. Between modules there is no cycle at all (``from
package import module`` counts as importing the module; a package's ``__init__`` counts as a
module of its own). The graph between the rooms (dataset_builder, generation, scoring,
analysis) must have no cycle, and the shared ground (``craftmd.*``
modules outside the rooms, such as the release contract, the model layer, the metric
registry) must not reach up into a room. The command layer sits above the rooms and may import
any of them: ``craftmd.commands`` (the CLI, the main job, submit, ingest, the audits) and each
room's CLI module (its subcommands' argument parsing).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {"dataset_builder": "dataset_builder", "generation": "generation", "scoring": "scoring", "analysis": "analysis", "cards": "cards"}
#: The commands that run jobs across rooms (the CLI, the main job, submit, ingest, the audits) sit together above
#: the rooms, in craftmd.commands.
COMMANDS = "craftmd.commands"
#: The inspect_ai bridge runs the tasks' protocols and scorers and reads and writes releases: it sits above the rooms too.
BRIDGE = "craftmd.inspect_bridge"
#: The training environments run the tasks' protocols with their patients and scorers: they sit above the rooms too
#: (but never import the command layer: test_environments checks that).
ENVS = "craftmd.envs"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] == "craftmd":
        return ".".join(parts)
    return ".".join(["craftmd", *parts])


def _import_lines(path: Path, module: str) -> dict[str, int]:
    """Every name ``module`` imports (at any depth) -> the first line that does; ``from pkg import name``
    gives ``pkg.name`` as well as ``pkg`` (the module graph keeps the one that is a module)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.setdefault(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.setdefault(name, node.lineno)
            for a in node.names:
                out.setdefault(f"{name}.{a.name}", node.lineno)
    return {n: ln for n, ln in out.items() if n == "craftmd" or n.startswith("craftmd.")}


def _imports(path: Path, module: str) -> set[str]:
    return set(_import_lines(path, module))


def _modules() -> dict[str, Path]:
    folders = [ROOT / "craftmd", *(ROOT / f for f in ROOMS.values())]
    return {_module(p): p for folder in folders for p in sorted(folder.rglob("*.py"))}


def module_graph() -> dict[str, dict[str, int]]:
    """module -> module it imports (the longest known prefix of each imported name) -> the line."""
    mods = _modules()
    graph: dict[str, dict[str, int]] = {}
    for mod, path in mods.items():
        edges = graph.setdefault(mod, {})
        for name, line in sorted(_import_lines(path, mod).items(), key=lambda x: x[1]):
            parts = name.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            target = ".".join(parts)
            if target and target not in (mod, "craftmd"):  # craftmd/__init__ holds only CraftMDError
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _above_rooms(module: str) -> bool:
    """The command layer: the jobs that run across rooms and every room's CLI module (``cli``, ``*_cli``: each
    subcommand parses its arguments and calls a function of a room, any room). They sit above the rooms."""
    return (module in (COMMANDS, BRIDGE, ENVS) or module.startswith((COMMANDS + ".", BRIDGE + ".", ENVS + "."))
            or module.rsplit(".", 1)[-1].endswith("cli"))


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "shared"


def graph() -> dict[str, dict[str, set[str]]]:
    """room -> room it imports -> the module pairs that do it."""
    edges: dict[str, dict[str, set[str]]] = {}
    for mod, targets in module_graph().items():
        for imp in targets:
            a, b = _room(mod), _room(imp)
            if a != b and not _above_rooms(mod):
                edges.setdefault(a, {}).setdefault(b, set()).add(f"{mod} -> {imp}")
    return edges


def test_no_cycle_between_modules():
    graph = module_graph()
    found = cycles(graph)
    lines = []
    for comp in found:
        hops = [f"{a} -> {b} (line {graph[a][b]})" for a in comp for b in graph[a] if b in comp]
        lines.append("import cycle between modules: " + "; ".join(hops))
    assert not found, "\n".join(lines)


def test_the_cycle_check_sees_function_local_imports(tmp_path):
    """A cycle closed only by an import inside a function is found (the check reads every import, at any depth)."""
    assert cycles({"a": {"b": 1}, "b": {"a": 9}}) == [["a", "b"]]
    src = "def f():\n    from craftmd.samples import Sample\n"
    (tmp_path / "m.py").write_text(src)
    assert _import_lines(tmp_path / "m.py", "craftmd.m") == {"craftmd.samples": 2, "craftmd.samples.Sample": 2}
    assert "craftmd.scoring.judge" in module_graph()["craftmd.analysis.agreement.review.sample"]  # module level
    assert "craftmd.analysis.agreement.graders" in module_graph()["craftmd.commands.pipeline"]  # inside a function


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
