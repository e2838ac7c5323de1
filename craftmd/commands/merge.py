"""``craftmd merge``: join the shard releases of one run (``--shard k/K``) into its release.

The work is :func:`craftmd.generation.shards.merge`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from craftmd.commands.cli import command


def register(sub) -> None:
    """Add ``craftmd merge`` to the `craftmd` parser."""
    p = command(sub, "merge", run_merge)
    p.add_argument("shards", nargs="+", type=Path, metavar="SHARD", help="the K shard releases (craftmd generate … --shard k/K)")
    p.add_argument("--out", required=True, type=Path, metavar="RELEASE_DIR", help="the merged release folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace RELEASE_DIR if it exists")


def run_merge(args) -> int:
    """merge the K shard releases of one run into the run's release

    Checks that the shards are one run (same task, dataset, selection, roles and settings, prompt set and K;
    each shard k of K exactly once) and writes one release whose data files are byte-identical to those of the
    same run unsharded; its run record says it was merged from K shards. A missing, repeated or foreign shard is
    refused and nothing is written.
    """
    from craftmd.generation.shards import merge

    report = merge(args.shards, args.out, overwrite=args.overwrite)
    print(report.summary(), file=sys.stderr)
    return 0


__all__ = ["register"]
