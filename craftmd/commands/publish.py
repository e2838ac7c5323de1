"""``craftmd publish``: a built dataset, a release or a leaderboard to the Hugging Face Hub.

The work is :func:`craftmd.dataset_builder.publish.publish`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from craftmd.commands.cli import command


def register(sub) -> None:
    """Add ``craftmd publish`` to the `craftmd` parser."""
    pub = command(sub, "publish", _publish)
    pub.add_argument("dir", type=Path, nargs="?", metavar="DIR", help="a built dataset folder (what `craftmd build --out` wrote)")
    what = pub.add_mutually_exclusive_group()
    what.add_argument("--release", type=Path, metavar="DIR", help="publish this release folder instead (needs --revision)")
    what.add_argument(
        "--leaderboard",
        type=Path,
        metavar="DIR",
        help="publish this leaderboard folder (`craftmd leaderboard --out`) with the releases at --releases (needs --revision)",
    )
    pub.add_argument(
        "--releases", type=Path, metavar="DIR", help="with --leaderboard: the folder of the releases its page was made from"
    )
    pub.add_argument("--repo", required=True, metavar="ORG/NAME", help="the dataset repo on the Hub")
    pub.add_argument(
        "--revision",
        metavar="TAG",
        help="the version to tag, checked before any upload (default for a dataset: v<version of the build>)",
    )
    pub.add_argument(
        "--include-nejm-images",
        action="store_true",
        help="with a built dataset: publish the nejm_image config too. Left out by default: its images are © Massachusetts "
        "Medical Society, all rights reserved, and no licence lets them be redistributed (for a private repo, or with the "
        "Society's permission)",
    )
    pub.add_argument(
        "--dry-run",
        action="store_true",
        help="print the upload plan (files, sizes, repo, tag) and stop; it refuses what an upload would",
    )


def _publish(args: argparse.Namespace) -> int:
    """publish a built dataset, a release or a whole leaderboard to the Hugging Face Hub, tagged with its version

    Publish, as a dataset repo ORG/NAME on the Hugging Face Hub (created if needed): a built dataset (DIR, what
    `craftmd build` wrote; tag v<version> from build_manifest.json unless --revision), a release (--release DIR:
    its tables, run record and a card) or a whole leaderboard (--leaderboard DIR --releases DIR: the page under
    page/ and every release under releases/<id>/, with a card). Everything is checked locally first, then the
    version on the Hub: a tag that exists already is refused in one line and nothing is uploaded. One commit makes
    the repo's main exactly what is published, and the tag is put on it. The key is read from $HF_TOKEN only and
    never written ($HF_ENDPOINT picks another hub); --dry-run only prints the plan. Only regular files craftmd wrote
    and listed are published: a symbolic link, a file that is not regular or one no craftmd command writes is refused
    in one line, and so is a release whose scores came from elsewhere and were not checked here (craftmd score
    settles them, as craftmd analyse asks). A dataset's NEJM Image Challenge images are left out (its card says why)
    unless --include-nejm-images.
    """
    from craftmd import CraftMDError
    from craftmd.dataset_builder.publish import hub_url, publish
    from craftmd.scoring.score import check_standing

    chosen = [x for x in (args.dir, args.release, args.leaderboard) if x is not None]
    if len(chosen) != 1:
        raise CraftMDError("publish one thing: a built dataset DIR, --release DIR or --leaderboard DIR")
    if args.releases is not None and args.leaderboard is None:
        raise CraftMDError("--releases goes with --leaderboard")
    kind = "release" if args.release else "leaderboard" if args.leaderboard else "dataset"
    plan = publish(
        chosen[0],
        args.repo,
        revision=args.revision,
        dry_run=args.dry_run,
        kind=kind,
        releases=args.releases,
        include_nejm_images=args.include_nejm_images,
        check=check_standing,  # as craftmd analyse: scores made here, or claims kept apart; never a number no one checked
    )
    if args.dry_run:
        print(plan.describe())
        print("dry run: nothing uploaded")
    else:
        print(f"published {len(plan.files)} files to {hub_url()}/datasets/{plan.repo}, tagged {plan.revision}")
    return 0


__all__ = ["register"]
