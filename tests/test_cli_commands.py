"""The ``craftmd`` subcommands: one module each in craftmd.commands, listed once, every one answering ``--help``."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from craftmd.commands.cli import COMMANDS, build_parser, main
from test_imports import ROOT


def _paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand's words (``("encounters", "build")``, ...), nested ones included."""
    out = [path] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _paths(sub, (*path, name))
    return out


PATHS = _paths(build_parser())


def test_craftmd_help_lists_every_command():
    exe = Path(sys.executable).with_name("craftmd")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "craftmd.commands.cli"]
    proc = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    top = [p[0] for p in PATHS if len(p) == 1]
    assert len(top) >= 20 and all(f"\n    {name}" in proc.stdout for name in top), proc.stdout


@pytest.mark.parametrize("words", PATHS, ids=" ".join)
def test_every_command_answers_help(words, capsys):
    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: craftmd {' '.join(words)} ") and "options:" in out, out


def _registered(module: str) -> dict[str, argparse.ArgumentParser]:
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(sub)
    return dict(sub.choices)


@pytest.mark.parametrize("module", [m for m in COMMANDS if m.startswith("craftmd.commands.")])
def test_a_command_module_registers_one_subcommand_of_its_name_and_handles_it(module):
    """craftmd/commands/<name>.py adds the subcommand <name> (``_`` for ``-``), and its handlers are its own."""
    got = _registered(module)
    assert list(got) == [module.rsplit(".", 1)[1].replace("_", "-")]
    handlers = [p.get_default("func") for p in [*got.values(), *(s for p in got.values() for s in _subparsers(p))]]
    assert all(h is None or h.__module__ == module for h in handlers), handlers


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [s for a in parser._actions if isinstance(a, argparse._SubParsersAction) for s in a.choices.values()]


def test_every_subcommand_lives_in_the_command_layer():
    """Every module of the list is one of craftmd.commands; every module of craftmd.commands with a ``register`` is in
    the list, once."""
    assert len(set(COMMANDS)) == len(COMMANDS)
    assert all(m.startswith("craftmd.commands.") for m in COMMANDS), COMMANDS
    defined = {
        f"craftmd.commands.{p.stem}"
        for p in (ROOT / "craftmd" / "commands").glob("*.py")
        if hasattr(importlib.import_module(f"craftmd.commands.{p.stem}"), "register")
    }
    assert defined == {m for m in COMMANDS if m.startswith("craftmd.commands.")}
