"""``craftmd export``: a release as inspect logs, for ``inspect view``."""

from __future__ import annotations

from craftmd.commands.cli import add_quiet_argument, command


def _export(args) -> int:
    """write a release as inspect logs (one per setting and format) for inspect view

    Each answer becomes a sample (epoch = trial + 1) holding its conversation as messages, the answer as
    output, its scores and its release rows, so `inspect view --log-dir DIR` browses the conversations and
    `craftmd ingest --inspect DIR/*.eval --out RELEASE` gives the release back. Needs pip install 'craftmd[inspect]'.
    """
    from craftmd.inspect_bridge.logs import export_release

    for p in export_release(args.release, args.inspect, progress=not args.quiet):
        print(p)
    return 0


def register(sub) -> None:
    """Add ``craftmd export`` to the `craftmd` parser."""
    p = command(sub, "export", _export)
    p.add_argument("release", help="a release folder")
    p.add_argument("--inspect", required=True, metavar="DIR", help="the folder to write the inspect logs into")
    add_quiet_argument(p)


__all__ = ["register"]
