"""Nothing outside ``craftmd/tasks/`` names a task (issue #43): a task brings what it needs in its folder (its analysis,
its environment, its inspect dataset, its commands) and the rest of the package loops over the registered tasks.

Every module of the package outside ``craftmd/tasks/`` is read (its syntax tree, not its text, so prose in docstrings
and comments is not counted), and a string that is a built-in task's name fails the test: ``"consultation"`` or
``"encounters"`` anywhere, ``"craftmd"`` where it names the task (compared with a task, given as a task, a key beside
another task's name), since ``"craftmd"`` is also the package's and the dataset's name. The registry's list of built-in
modules (``craftmd/tasks/__init__.py``) is inside the folder, and so allowed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_imports import ROOT, _modules  # noqa: E402

from craftmd.tasks import BUILTIN  # noqa: E402

#: A name that is also the package's and the dataset's: a task only where the code around it says so.
SHARED = {"craftmd"}


def _text(node: ast.AST) -> str:
    return ast.unparse(node).lower()


def _strings(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _parameter(args: ast.arguments, default: ast.AST) -> str:
    """The name of the parameter whose default is ``default``."""
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return next((a.arg for a, d in pairs if d is default), "")


def task_names_in(source: str, names=tuple(BUILTIN)) -> list[tuple[int, str]]:
    """(line, why) for each place ``source`` names one of the tasks ``names``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    found = []
    for node in _strings(tree):
        if node.value not in names or id(node) in docstrings:
            continue
        if node.value not in SHARED:
            found.append((node.lineno, f"the task name {node.value!r}"))
            continue
        up = parents.get(node)
        while isinstance(up, (ast.Tuple, ast.List, ast.Set)):  # a collection: judged by where it stands
            up = parents.get(up)
        others = {s.value for s in _strings(parents.get(node))} & (set(names) - SHARED) if parents.get(node) else set()
        said = None
        if others:
            said = "beside other tasks' names"
        elif isinstance(up, ast.Compare) and "task" in _text(up):
            said = "compared with a task"
        elif isinstance(up, ast.keyword) and up.arg and "task" in up.arg:
            said = f"given as {up.arg}="
        elif isinstance(up, ast.keyword) and "task" in _text(parents[up]):  # add_argument("--task", default=...)
            said = f"given as {up.arg}= beside a task"
        elif isinstance(up, ast.Call) and "task" in _text(up.func):
            said = f"given to {ast.unparse(up.func)}()"
        elif isinstance(up, (ast.Assign, ast.AnnAssign)) and "task" in _text(
            up.targets[0] if isinstance(up, ast.Assign) else up.target
        ):
            said = "assigned to a task"
        elif isinstance(up, ast.arguments) and "task" in _parameter(up, node):
            said = "a task parameter's default"
        elif isinstance(up, ast.Dict) and any(k is not None and "task" in _text(k) for k in up.keys):
            said = "in a task's entry"
        if said:
            found.append((node.lineno, f"the task name {node.value!r} {said}"))
    return found


def test_nothing_outside_the_task_folders_names_a_task():
    bad = []
    for module, path in sorted(_modules().items()):
        if path.is_relative_to(ROOT / "craftmd" / "tasks") and path != ROOT / "craftmd" / "tasks" / "base.py":
            continue  # the task folders, and the registry with its list of built-in modules
        for line, why in task_names_in(path.read_text()):
            bad.append(f"{path.relative_to(ROOT)}:{line}: {why}")
    assert not bad, f"{len(bad)} place(s) outside craftmd/tasks/ name a task:\n" + "\n".join(bad)


def test_the_check_finds_a_task_named_and_lets_the_package_and_the_dataset_be():
    src = '''
def f(release, task="craftmd", name="craftmd"):
    """The consultation's analysis (prose is not a name)."""
    if release.manifest.task == "encounters":
        pass
    if task == "craftmd":
        get_task("craftmd")
    weights = {"craftmd": 1, "consultation": 2}
    parser.add_argument("--task", default="craftmd")
    return {"name": "craftmd", "version": 1}, load(dataset="craftmd"), prog("craftmd")
'''
    lines = sorted(line for line, _ in task_names_in(src))
    assert lines == [2, 4, 6, 7, 8, 8, 9], task_names_in(src)
