"""The ``craftmd`` command: one parser, the subcommands of :data:`COMMANDS`, the argument helpers they share.

Each subcommand is a module of :mod:`craftmd.commands` (``register(subparsers)``: its arguments and its
handler, which calls the functions of the rooms that do the work); :func:`main` runs it and turns a
:class:`~craftmd.CraftMDError` or an operating-system error into one line.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

from craftmd import CraftMDError, __version__
from craftmd.tasks import load_task_files

#: The modules of the subcommands, in the order of ``craftmd --help``: each one's ``register(subparsers)`` adds
#: its subcommand. A new subcommand is a module of craftmd.commands and one line here. They are imported by name
#: when the parser is built (each imports this module for the argument helpers below). A built-in task's own
#: subcommands are its folder's ``commands.py`` (:func:`task_commands`), after these.
COMMANDS = (
    "craftmd.commands.build",
    "craftmd.commands.publish",
    "craftmd.commands.pin",
    "craftmd.commands.generate",
    "craftmd.commands.merge",
    "craftmd.commands.score",
    "craftmd.commands.grader_agreement",
    "craftmd.commands.validate",
    "craftmd.commands.meld",
    "craftmd.commands.review",
    "craftmd.commands.finetune",
    "craftmd.commands.judge",
    "craftmd.commands.judge_review",
    "craftmd.commands.judge_calibrate",
    "craftmd.commands.judge_sensitivity",
    "craftmd.commands.analyse",
    "craftmd.commands.ingest",
    "craftmd.commands.export",
    "craftmd.commands.leaderboard",
    "craftmd.commands.submit",
)


def add_source_argument(parser: argparse.ArgumentParser) -> None:
    """``--source``: the pinned upstream source, the same option (and help) on every subcommand that reads it."""
    parser.add_argument(
        "--source",
        default=None,
        metavar="PATH_OR_URL",
        help="the upstream release: a .tar.gz, an unpacked folder or an http(s) URL "
        "(default: $CRAFTMD_SOURCE, else ../shared/sources/craft-md-<commit>.tar.gz, else upstream's URL)",
    )


def add_dataset_argument(parser: argparse.ArgumentParser, *, required: bool = True, help: str | None = None) -> None:
    """``--dataset DIR``: a built dataset folder, the one name for it on every subcommand."""
    parser.add_argument(
        "--dataset",
        required=required,
        default=None,
        metavar="DIR",
        help=help or "a built dataset folder (craftmd build --out DIR)",
    )


class _CaseIds(argparse.Action):
    """Case ids separated by commas, spaces (several words) or both; each kept once, in order."""

    def __call__(self, parser, namespace, values, option_string=None):
        ids = [x.strip() for v in values for x in v.split(",") if x.strip()]
        if not ids:
            parser.error(f"{option_string}: no case id given")
        setattr(namespace, self.dest, list(dict.fromkeys(ids)))


def add_cases_argument(parser: argparse.ArgumentParser, help: str = "only these case ids") -> None:
    """``--cases ID[,ID...] [ID ...]``: one parser for every subcommand that takes case ids (meld, generate)."""
    parser.add_argument("--cases", nargs="+", action=_CaseIds, metavar="ID", help=f"{help}, comma- or space-separated")


def add_list_argument(parser, name: str, metavar: str, help: str) -> None:
    """An option taking a comma-separated list (:func:`list_type`), the one way every subcommand declares one."""
    parser.add_argument(name, type=list_type, metavar=metavar, help=help)


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bars, the one progress flag on every subcommand."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


class _Concurrency(argparse.Action):
    """``--concurrency N`` (every server) and/or ``--concurrency SERVICE=N[,SERVICE=N]`` (one service's servers)."""

    def __call__(self, parser, namespace, values, option_string=None):
        per = dict(getattr(namespace, "server_concurrency", None) or {})
        for part in (p.strip() for p in values.split(",") if p.strip()):
            name, eq, n = part.rpartition("=")
            try:
                value = int(n)
            except ValueError:
                parser.error(f"{option_string}: {part!r} is not N or SERVICE=N")
            if value < 1:
                parser.error(f"{option_string}: {part!r}: must be at least 1")
            if eq:
                per[name.strip()] = value
            else:
                setattr(namespace, self.dest, value)
        namespace.server_concurrency = per


def add_call_arguments(
    parser: argparse.ArgumentParser,
    *,
    concurrency: int = 32,
    max_tokens: int = 512,
    temperature: float = 1.0,
    seed_help: str = "base sampling seed (default 0)",
) -> None:
    """The options every command that calls models shares: the servers, sampling, retries and the request cache.

    Each model is bound to its own server by its name: ``openai/<model>`` at ``--base-url`` (else
    ``OPENAI_BASE_URL``, else OpenAI) with ``OPENAI_API_KEY``; ``openai-api/<service>/<model>`` at
    ``<SERVICE>_BASE_URL`` with ``<SERVICE>_API_KEY``."""
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible server for openai/ models, usually ending in /v1, e.g. http://localhost:8000/v1 "
        "(default: OPENAI_BASE_URL or OpenAI). An openai-api/<service>/<model> model reads its server from "
        "<SERVICE>_BASE_URL and its key from <SERVICE>_API_KEY instead. Recorded; never a key",
    )
    parser.add_argument(
        "--concurrency",
        action=_Concurrency,
        default=concurrency,
        metavar="N|SERVICE=N",
        help=f"requests in flight per server (default {concurrency}); SERVICE=N sets one service's limit "
        "('openai' for openai/ models), e.g. --concurrency 32 --concurrency local=4",
    )
    parser.set_defaults(server_concurrency={})
    parser.add_argument("--seed", type=seed_type, default=0, help=seed_help)
    parser.add_argument(
        "--temperature", type=temperature_type, default=temperature, help=f"sampling temperature (default {temperature})"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=max_tokens, help=f"most tokens per reply, at least 1 (default {max_tokens})"
    )
    parser.add_argument(
        "--timeout", type=seconds_type, default=120.0, help="seconds to wait for one reply before retrying (default 120)"
    )
    parser.add_argument(
        "--max-retries", type=count_type, default=6, help="retries of a failed call before it is recorded as an error (default 6)"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        metavar="PATH",
        help="request cache (default $CRAFTMD_CACHE/requests.sqlite, else ~/.cache/craftmd/requests.sqlite)",
    )


def _number(text: str, kind, ok, what: str):
    """``text`` as a ``kind`` (int or float) for which ``ok`` holds, else argparse's one-line error saying ``what`` it must be."""
    try:
        value = kind(text)
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {what}")
    return value


def trials_type(text: str) -> int:
    """``--trials N``: 1 ≤ N ≤ :data:`craftmd.release.MAX_TRIALS`, the one trial limit."""
    from craftmd.release import MAX_TRIALS

    return _number(text, int, lambda n: 1 <= n <= MAX_TRIALS, f"a whole number of trials from 1 to {MAX_TRIALS}")


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (``--max-tokens``, ``--max-turns``, ...)."""
    return _number(text, int, lambda n: n >= 1, "a whole number of at least 1")


def count_type(text: str) -> int:
    """A whole number ≥ 0 (``--max-retries``)."""
    return _number(text, int, lambda n: n >= 0, "a whole number of at least 0")


#: The most bootstrap resamples a command draws: the draws are a resamples x cases array held in memory.
MAX_RESAMPLES = 100_000
#: Seeds are whole numbers that fit a signed 64-bit integer and are at least 0 (numpy's generators refuse a negative one).
MAX_SEED = 2**63 - 1


def seed_type(text: str) -> int:
    """A seed: a whole number from 0 to :data:`MAX_SEED` (``--seed``)."""
    return _number(text, int, lambda n: 0 <= n <= MAX_SEED, f"a whole-number seed from 0 to {MAX_SEED}")


def resamples_type(text: str) -> int:
    """Bootstrap resamples: a whole number from 1 to :data:`MAX_RESAMPLES` (``--resamples``, ``--B``)."""
    return _number(text, int, lambda n: 1 <= n <= MAX_RESAMPLES, f"a whole number of resamples from 1 to {MAX_RESAMPLES:,}")


def fraction_type(text: str) -> float:
    """A finite number from 0 to 1 (``--threshold`` of a similarity)."""
    return _number(text, float, lambda x: 0 <= x <= 1, "a number from 0 to 1")


def seconds_type(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``)."""
    return _number(text, float, lambda x: x > 0, "a number of seconds more than 0")


def temperature_type(text: str) -> float:
    """A sampling temperature: finite, ≥ 0."""
    return _number(text, float, lambda x: x >= 0, "a finite sampling temperature of at least 0")


def usd_type(text: str) -> float:
    """An amount of US dollars: finite, > 0 (``--budget``)."""
    return _number(text, float, lambda x: x > 0, "a finite amount of USD more than 0")


def price_type(text: str) -> tuple[float, float]:
    """``--price IN,OUT``: USD per million input and output tokens, each finite and ≥ 0."""
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected IN,OUT in USD per million tokens, e.g. 2.5,10") from None
    if not all(math.isfinite(x) and x >= 0 for x in (a, b)):
        raise argparse.ArgumentTypeError("expected IN,OUT in USD per million tokens, each finite and at least 0, e.g. 2.5,10")
    return a, b


def list_type(text: str) -> list[str]:
    """A comma-separated option value as a list (blanks dropped)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def keywords(args: argparse.Namespace, *names: str) -> dict:
    """The parsed options ``names`` (``--max-retries`` is ``max_retries``) by name: the keyword arguments of the room's
    function a handler hands them to under the same names."""
    return {name: getattr(args, name) for name in names}


def check_base_url(url: str) -> None:
    """A one-line error for a --base-url that is not an http(s) URL with a host, or that carries credentials."""
    from craftmd.models import check_url

    check_url(url, "--base-url", "OPENAI_API_KEY")


def dominant_reason(reasons) -> str:
    """The reason that failed most of ``reasons`` (strings, or a ``{reason: count}`` mapping), as ``N × REASON``
    (ties: the first by name), for the one line of a command that produced nothing usable."""
    from collections import Counter

    counts = Counter(reasons)
    if not counts:
        return "no reason given"
    reason, n = min(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return f"{n} × {str(reason or 'no reason given')[:200]}"


def command(sub, name: str, handler) -> argparse.ArgumentParser:
    """A subcommand ``name`` run by ``handler(args)``; its help is the handler's docstring (first line:
    the one-line help; the rest: the description)."""
    import inspect

    doc = inspect.getdoc(handler) or ""
    first, _, rest = doc.partition("\n\n")
    parser = sub.add_parser(name, help=first.strip().replace("%", "%%"), description=" ".join(rest.split()) or None)
    parser.set_defaults(func=handler)
    return parser


def task_commands() -> list[str]:
    """The modules of the built-in tasks' own subcommands: the ``commands.py`` of a task's folder, where it has one (its
    ``register(subparsers)`` as above), in the registry's order. Only those tasks are imported."""
    import importlib.util
    from pathlib import Path

    from craftmd.tasks import BUILTIN

    out = []
    for package in BUILTIN.values():
        spec = importlib.util.find_spec(package)  # the task's folder, found without importing the task
        folders = (spec.submodule_search_locations if spec is not None else None) or ()
        if any((Path(p) / "commands.py").is_file() for p in folders):
            out.append(f"{package}.commands")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="craftmd",
        description=(
            "CRAFT-MD: build the benchmark dataset from the pinned upstream source, generate or "
            "ingest model conversations into frozen releases, grade them, and regenerate the "
            "leaderboard. Each subcommand has its own --help."
        ),
    )
    parser.add_argument("--version", action="version", version=f"craftmd {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (*COMMANDS, *task_commands()):
        importlib.import_module(name).register(sub)
    return parser


def os_error_line(exc: OSError) -> str:
    """An operating-system error as one line: what failed and on which file (no traceback)."""
    import errno

    what = exc.strerror or str(exc) or type(exc).__name__
    files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    hint = {
        errno.ENOSPC: "; free some space and run it again (what was there before is unchanged)",
        errno.EDQUOT: "; free some space and run it again (what was there before is unchanged)",
        errno.EACCES: "; check the folder's permissions or choose another place",
        errno.EROFS: "; choose a writable place",
    }.get(exc.errno, "")
    return f"{what}: {files}{hint}" if files else f"{what}{hint}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from craftmd.release import one_reading

    try:
        load_task_files()  # tasks of your own ($CRAFTMD_TASKS): their scorers and metrics known to every command
        with one_reading():  # a release's files read and hashed once in the command
            result = args.func(args)
    except CraftMDError as exc:
        if args.debug:
            raise
        print(f"craftmd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder we may not write, a read-only file system: one line, the file named
        if args.debug:
            raise
        print(f"craftmd {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"craftmd {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


def run() -> None:
    """The ``craftmd`` program: :func:`main`, then the exit. Python's own exit handlers run (temporary folders removed,
    logs flushed), but not the native libraries' teardown after them: Arrow's parquet thread pool can abort a finished
    process there, now and then, with "terminate called without an active exception" (apache/arrow#34314), which
    would turn a command that did its work into a failure."""
    import atexit
    import os

    code = [1]

    def leave() -> None:  # registered first, so it runs last of the exit handlers
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code[0])

    atexit.register(leave)
    try:
        code[0] = main()
    except SystemExit as exc:  # argparse's usage errors (2) and --help (0), said by Python as it would
        code[0] = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        raise
    sys.exit(code[0])


if __name__ == "__main__":
    run()
