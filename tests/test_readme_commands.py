"""The commands the documentation names are the package's: every ``craftmd <command>`` in README.md and docs/ (its
code blocks and its inline code) is a subcommand the parser has, nested ones included; and what the README's commands
write into the checkout (``--out``, an export's ``--inspect`` folder, ``inspect eval``'s own ``logs/``) is git-ignored,
so following the README leaves ``git status`` clean."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from test_cli_commands import PATHS

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
#: Where one shell command ends and the next starts on a line: ``&&``, ``||``, ``;``, ``|``, ``&``, ``(``, ``$(``, a backtick.
SEPARATOR = re.compile(r"&&|\|\||[;|&(`]|\$\(")
COMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*(/[a-z][a-z0-9-]*)*")  # a subcommand, or alternatives: export/import


def documents() -> list[Path]:
    """The README, the documentation site's pages and the task pages kept in the tasks' folders (not what the docs
    build writes, ``docs/_generated`` and ``docs/_build``: the tests collected are the same before a build and after)."""
    pages = [
        p for p in sorted((ROOT / "docs").rglob("*.md")) if not {"_generated", "_build"} & set(p.relative_to(ROOT / "docs").parts)
    ]
    return [ROOT / "README.md", *pages, *sorted((ROOT / "craftmd" / "tasks").glob("*/README.md"))]


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line of a fenced block (its comment dropped) and of every inline code span."""
    out = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start(1)) + 1
        out += [(first + i, re.sub(r"(^|\s)#.*", "", ln)) for i, ln in enumerate(m[1].splitlines())]
    prose = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)  # the same line numbers, the blocks blanked
    for number, line in enumerate(prose.splitlines(), 1):
        out += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return out


def commands(line: str) -> list[list[str]]:
    """The words after ``craftmd`` (or ``.../craftmd``) of each command on a shell line, variables set before it skipped."""
    out = []
    for part in SEPARATOR.split(line):
        words = part.split()
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            words.pop(0)
        if words and (words[0] == "craftmd" or words[0].endswith("/craftmd")):
            out.append(words[1:])
    return out


def unknown(words: list[str]) -> str | None:
    """What in ``craftmd WORDS`` the parser does not have (None: it has it all), walking nested subcommands."""
    path: tuple[str, ...] = ()
    for word in words:
        nested = {p[len(path)] for p in PATHS if len(p) > len(path) and p[: len(path)] == path}
        if not nested or not COMMAND_WORD.fullmatch(word):
            return None  # past the subcommands: arguments, options, a placeholder
        missing = [w for w in word.split("/") if w not in nested]
        if missing:
            return f"craftmd {' '.join([*path, missing[0]])}"
        path = (*path, word.split("/")[0])
    return None


def test_the_documentation_names_at_least_the_readmes_commands():
    """The reading finds the commands (a reading that finds none would pass anything)."""
    found = {tuple(w[:2]) for doc in documents() for _, ln in code_lines(doc.read_text()) for w in commands(ln)}
    assert {("generate", "--task"), ("encounters", "build"), ("judge-review", "export"), ("finetune", "serve")} <= found


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_craftmd_command_the_documentation_names_exists(doc):
    bad = [
        f"{doc.name}:{number}: `{problem}` is no command of craftmd"
        for number, line in code_lines(doc.read_text())
        for words in commands(line)
        if (problem := unknown(words))
    ]
    assert not bad, "\n".join(bad)


def readme_outputs() -> list[str]:
    """The relative paths the documented commands write (the README's and the site's): ``--out``, ``craftmd export
    --inspect``, and the ``logs/`` folder ``inspect eval`` writes unless told ``--log-dir``."""
    out = []
    for _, line in (pair for doc in documents() for pair in code_lines(doc.read_text())):
        for part in SEPARATOR.split(line):
            words = part.split()
            for flag, value in zip(words, words[1:]):
                if flag == "--out" or (flag == "--inspect" and "export" in words) or flag == "--log-dir":
                    out.append(value)
            if words[:2] == ["inspect", "eval"] and "--log-dir" not in words:
                out.append("logs")
    return sorted({p for p in out if not Path(p).is_absolute() and not re.search(r"[A-Z<$*]", p)})


def test_what_the_readmes_commands_write_into_the_checkout_is_git_ignored():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    outputs = readme_outputs()
    assert {"out/data", "logs", "logs/local"} <= set(outputs), outputs
    paths = [p if Path(p).suffix else f"{p}/" for p in outputs]  # a folder as one (git matches `/logs/` to folders only)
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", "-v", "-n", *paths], capture_output=True, text=True
    )
    assert proc.returncode in (0, 1), proc.stderr
    tracked = [ln.split("\t", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("::")]
    assert not tracked, f"not git-ignored: {tracked}"


def test_the_quick_start_script_parses_as_printed():
    """Every ``craftmd`` command of the quick start (``docs/quickstart.sh``, which ``make quickstart`` runs and the quick
    start page shows) is accepted by the program's own parser, option by option, its shell variables filled with
    placeholders; and the page includes the file, so what is shown is what runs."""
    import shlex

    from craftmd.commands.cli import build_parser

    script = (ROOT / "docs" / "quickstart.sh").read_text()
    assert "literalinclude} quickstart.sh" in (ROOT / "docs" / "quickstart.md").read_text()
    joined = re.sub(r"\\\n\s*", " ", script)  # continuation lines joined
    values = {"$M": "openai-api/local/local-model", "${C[@]}": "--concurrency local=1 --max-tokens 128 --seed 0"}
    found = 0
    for line in joined.splitlines():
        words = shlex.split(re.sub(r"(^|\s)#.*", "", line))
        if not words or not words[0].endswith("/craftmd"):
            continue
        argv = [values.get(w, re.sub(r"\$\{?\w+\}?", "x", w)) for w in words[1:]]
        argv = [a for w in argv for a in (w.split() if w.startswith("--concurrency ") else [w])]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"docs/quickstart.sh: the parser refuses: craftmd {' '.join(argv)}")
        found += 1
    assert found >= 6, f"docs/quickstart.sh has {found} craftmd commands"
