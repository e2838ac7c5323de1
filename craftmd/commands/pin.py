"""``craftmd pin`` (maintainers): the source pin from an unpacked upstream release (:func:`craftmd.source.write_pin`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from craftmd.commands.cli import command


def register(sub) -> None:
    """Add ``craftmd pin`` to the `craftmd` parser."""
    pn = command(sub, "pin", _pin)
    pn.add_argument("unpacked", type=Path, metavar="DIR", help="the unpacked release (its top folder)")
    pn.add_argument("--commit", required=True, help="the upstream commit the folder is")
    pn.add_argument("--dest", type=Path, help="where to write (default: the package's pin folder)")


def _pin(args: argparse.Namespace) -> int:
    """(maintainers) regenerate the source pin from an unpacked upstream release

    Write dataset_builder/pin/<commit>.sha256: the sha256 of every data/, results/, LICENSE and README.md file
    of an unpacked upstream release. Run it only when moving to a new upstream commit.
    """
    from craftmd import CraftMDError
    from craftmd.source import PIN_DIR, write_pin

    if not (args.unpacked / "data").is_dir():
        raise CraftMDError(f"{args.unpacked}: not an unpacked CRAFT-MD release (no data/ folder)")
    dest = args.dest or PIN_DIR / f"{args.commit}.sha256"
    n = write_pin(args.unpacked, args.commit, dest)
    print(f"pinned {n} files of commit {args.commit} in {dest}", file=sys.stdout)
    return 0


__all__ = ["register"]
