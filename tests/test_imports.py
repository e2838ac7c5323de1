"""Modules and rooms depend on each other in one direction only: no import cycle, function-local imports included.

Every ``import`` statement of every module (at any depth, so an import hidden inside a function counts) is read
from the source, and every module sits in one layer, from the bottom:

- the shared ground: ``craftmd.*`` outside the layers below (the release contract, the model layer, the metric
  registry, the tasks' registry ``craftmd.tasks`` and ``craftmd.tasks.base``, ...); it imports no room and nothing above;
- the rooms (dataset_builder, generation, scoring, analysis, cards): they import the shared ground and each other in
  one direction only, and nothing above them;
- above the rooms: the task packages (``craftmd/tasks/<name>/``: a task, its protocol, its prompts; none imports
  another), the inspect bridge and the training environments;
- the command layer, ``craftmd.commands``: every subcommand, one module each, and a task's own subcommands (its
  folder's ``commands.py``). Nothing else imports it.

Between modules there is no cycle at all (``from package import module`` counts as importing the module; a
package's ``__init__`` counts as a module of its own). No module is exempt.

The source walk cannot see what a module does when it runs (a module ``__getattr__`` that looks a task up, a
default task resolved on import), so every module of the shared ground and of the rooms is also imported as in a
fresh interpreter, and the modules that import loads are checked against the same layers and the layout page's
table of rooms (``docs/layout.md``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {
    "dataset_builder": "dataset_builder",
    "generation": "generation",
    "scoring": "scoring",
    "analysis": "analysis",
    "cards": "cards",
}
#: Every subcommand, one module each: the top layer.
COMMANDS = "craftmd.commands"
#: The inspect_ai bridge runs the tasks' protocols and scorers and reads and writes releases: above the rooms.
BRIDGE = "craftmd.inspect_bridge"
#: The training environments run the tasks' protocols with their patients and scorers: above the rooms too.
ENVS = "craftmd.envs"
#: The tasks: ``craftmd.tasks`` (the registry) and ``craftmd.tasks.base`` are shared ground; each task package
#: ``craftmd/tasks/<name>/`` (a folder) sits above the rooms, whose machinery its protocol runs.
TASKS = "craftmd.tasks"


def _module(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
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


def _modules(root: Path = ROOT) -> dict[str, Path]:
    folders = [root / "craftmd", *(root / f for f in ROOMS.values())]
    return {_module(p, root): p for folder in folders if folder.is_dir() for p in sorted(folder.rglob("*.py"))}


def module_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> module it imports (the longest known prefix of each imported name) -> the line."""
    mods = _modules(root)
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


def task_package(module: str, root: Path = ROOT) -> str | None:
    """The task package ``module`` is in (``craftmd.tasks.<name>`` with a folder ``craftmd/tasks/<name>/``), else None."""
    parts = module.split(".")
    if module.startswith(TASKS + ".") and parts[2] != "base" and (root / "craftmd" / "tasks" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return None


def layer(module: str, root: Path = ROOT) -> str:
    """``commands``, ``above`` (task packages, the inspect bridge, the environments), ``room`` or ``shared``."""

    def under(*prefixes: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    if under(COMMANDS) or (task_package(module, root) and module.split(".")[3:4] == ["commands"]):
        return "commands"
    if under(BRIDGE, ENVS) or task_package(module, root):
        return "above"
    return "room" if _room(module) != "shared" else "shared"


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "shared"


def _edges(root: Path = ROOT) -> list[tuple[str, str, int]]:
    """Every import between two modules, but the pending ones: (module, module it imports, line)."""
    return [(m, t, line) for m, ts in module_graph(root).items() for t, line in ts.items()]


def graph(root: Path = ROOT) -> dict[str, dict[str, set[str]]]:
    """room -> room it imports -> the module pairs that do it (every module of a room, none exempt)."""
    edges: dict[str, dict[str, set[str]]] = {}
    for mod, imp, _ in _edges(root):
        a, b = _room(mod), _room(imp)
        if a != b and layer(mod, root) == "room" and layer(imp, root) == "room":
            edges.setdefault(a, {}).setdefault(b, set()).add(f"{mod} -> {imp}")
    return edges


#: What each layer may not import.
FORBIDDEN = {"shared": ("room", "above", "commands"), "room": ("above", "commands"), "above": ("commands",), "commands": ()}


def layering_errors(root: Path = ROOT) -> list[str]:
    """Each import that reaches up a layer, or from one task package into another."""
    bad = []
    for mod, imp, line in _edges(root):
        a, b = layer(mod, root), layer(imp, root)
        if b in FORBIDDEN[a]:
            bad.append(f"{mod} ({a}) imports {imp} ({b}), line {line}")
        elif task_package(mod, root) and task_package(imp, root) and task_package(mod, root) != task_package(imp, root):
            bad.append(f"task {task_package(mod, root)} imports task {task_package(imp, root)} ({mod} -> {imp}, line {line})")
    return bad


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
    assert "craftmd.analysis.agreement.graders" in module_graph()["craftmd.commands.leaderboard"]  # inside a function


def test_no_cycle_between_rooms():
    edges = graph()
    seen, stack = set(), []

    def visit(n):
        if n in stack:
            cycle = stack[stack.index(n) :] + [n]
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


def test_no_module_reaches_up_a_layer():
    """The shared ground imports no room; no room imports a task package, the bridge, the environments or a command;
    only the command layer imports the command layer; no task package imports another."""
    bad = layering_errors()
    assert not bad, "an import reaches up a layer:\n" + "\n".join(bad)


def test_no_room_imports_the_command_layer():
    bad = [f"{m} -> {t} (line {line})" for m, t, line in _edges() if layer(m) == "room" and layer(t) == "commands"]
    assert not bad, "a room imports the command layer: " + "; ".join(bad)


def test_the_layers_follow_the_folders(tmp_path):
    """A task folder is above the rooms (its registry and base are shared ground), and the check finds the imports that
    break the layers: a room importing a task or a command, a task importing another, the shared ground a room."""
    files = {
        "craftmd/tasks/__init__.py": "import importlib\n",
        "craftmd/tasks/base.py": "",
        "craftmd/tasks/toy/__init__.py": "from craftmd.tasks.toy.protocol import Toy\n",
        "craftmd/tasks/toy/protocol.py": "from craftmd.generation.runner import Runner\nfrom craftmd.tasks.base import Task\n",
        "craftmd/tasks/toy/commands.py": "from craftmd.commands.cli import command\nfrom craftmd.tasks.toy import Toy\n",
        "craftmd/tasks/other/__init__.py": "from craftmd.tasks.toy import protocol\n",
        "craftmd/commands/cli.py": "from craftmd.tasks.toy import Toy\n",
        "craftmd/release.py": "from craftmd.scoring.mcq import grade\n",
        "generation/runner.py": "from craftmd.release import x\n",
        "scoring/mcq.py": "def f():\n    from craftmd.tasks.toy import Toy\n",
        "analysis/cli.py": "from craftmd.commands.cli import command\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert [
        layer(m, tmp_path)
        for m in (
            "craftmd.tasks",
            "craftmd.tasks.base",
            "craftmd.tasks.toy",
            "craftmd.tasks.toy.protocol",
            "craftmd.tasks.toy.commands",
            "craftmd.commands.cli",
            "craftmd.generation.runner",
            "craftmd.release",
        )
    ] == ["shared", "shared", "above", "above", "commands", "commands", "room", "shared"]
    assert sorted(layering_errors(tmp_path)) == [
        "craftmd.analysis.cli (room) imports craftmd.commands.cli (commands), line 1",
        "craftmd.release (shared) imports craftmd.scoring.mcq (room), line 1",
        "craftmd.scoring.mcq (room) imports craftmd.tasks.toy (above), line 2",
        "task craftmd.tasks.other imports task craftmd.tasks.toy (craftmd.tasks.other -> craftmd.tasks.toy, line 1)",
        "task craftmd.tasks.other imports task craftmd.tasks.toy (craftmd.tasks.other -> craftmd.tasks.toy.protocol, line 1)",
    ]


def test_analysis_only_reads():
    """Analysis never writes a release, builds a dataset or ingests: it imports none of those, nor a writer of releases or
    scores (a calibrated judge and people's ratings are scorers, written by ``craftmd score``'s writer)."""
    writers = ("grade", "ingest", "write_scores", "write_release", "score_release", "score_with", "note_made_here")
    bad = []
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        for imp in _imports(path, _module(path)):
            if imp.startswith(("craftmd.dataset_builder", "craftmd.generation")) or imp.endswith(writers):
                bad.append(f"{_module(path)} -> {imp}")
    assert not bad, "analysis imports a writer: " + "; ".join(bad)


def stated_room_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """The layout page's table (``docs/layout.md``): room -> the rooms it imports."""
    import re

    text = (root / "docs" / "layout.md").read_text()
    stated = {}
    for room, deps in re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", text, re.M):
        stated[room] = set() if deps.strip() == "none" else set(re.findall(r"`(\w+)`", deps))
    return stated


def may_load(module: str, root: Path = ROOT) -> callable:
    """Whether importing ``module`` (of the shared ground or a room) may load a module: the shared ground only the
    shared ground; a room that too, itself, and the rooms the layout page says it imports, and theirs in turn."""
    if layer(module, root) == "shared":
        return lambda m: layer(m, root) == "shared"
    stated, rooms, todo = stated_room_imports(root), set(), [_room(module)]
    while todo:
        r = todo.pop()
        if r not in rooms:
            rooms.add(r)
            todo += stated.get(r, ())
    return lambda m: layer(m, root) == "shared" or (layer(m, root) == "room" and _room(m) in rooms)


#: Run in a fresh interpreter: import each module named on stdin, one per line, and print, for each, the package's
#: modules then loaded; between two, every module of the package is dropped again (the next one loads as in a new
#: interpreter; the libraries beneath stay loaded, so the walk takes seconds rather than a minute a module).
LOADS = """
import importlib, json, sys
for name in sys.stdin.read().split():
    importlib.import_module(name)
    ours = sorted(m for m in sys.modules if m == "craftmd" or m.startswith("craftmd."))
    print(json.dumps([name, ours]), flush=True)
    for m in ours:
        del sys.modules[m]
"""


def loaded_by_import(modules: list[str]) -> dict[str, list[str]]:
    """module -> every module of the package that importing it loads, each module imported as in a new interpreter."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", LOADS], input="\n".join(modules), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    return dict(json.loads(line) for line in run.stdout.splitlines())


def test_the_ground_and_the_rooms_load_nothing_above_them_when_imported():
    """At run time too, not only in the source: importing a module of the shared ground or of a room loads no task
    package, no inspect bridge, environment or command, and no room its own does not import (the layout page's
    table). A module that looks a task up when it is imported (a default task, a module ``__getattr__``) fails here."""
    mods = _modules()
    below = sorted(m for m in mods if layer(m) in ("shared", "room"))
    bad = []
    for name, loaded in loaded_by_import(below).items():
        allowed = may_load(name)
        bad += [f"importing {name} ({layer(name)}) loads {m} ({layer(m)})" for m in loaded if m in mods and not allowed(m)]
    assert not bad, "\n".join(bad)


def test_the_run_time_check_sees_a_task_looked_up_on_import():
    """The check above catches what the source walk cannot: a module whose import looks the diagnosis task up."""
    loaded = loaded_by_import(["craftmd.tasks"])["craftmd.tasks"]
    assert "craftmd.tasks.diagnosis" not in loaded and not may_load("craftmd.release")("craftmd.tasks.diagnosis")
    import subprocess
    import sys

    probe = "import craftmd.tasks, sys; craftmd.tasks.get_task('craftmd'); print('craftmd.tasks.diagnosis' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "True"
    assert not may_load("craftmd.analysis.runner")("craftmd.generation.runner")  # analysis does not import generation
    assert may_load("craftmd.analysis.runner")("craftmd.dataset_builder.schema")  # through scoring, which does
