"""Subcommands of craftmd.dataset_builder (registered by craftmd.commands.cli): build, publish, pin."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from craftmd.commands.cli import add_quiet_argument, add_source_argument, command


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    b = command(sub, "build", _build)
    add_source_argument(b)
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write the dataset folder")
    b.add_argument("--version", dest="data_version", metavar="X.Y.Z", help="dataset version (default: the package version)")
    b.add_argument(
        "--medqa",
        type=Path,
        metavar="FILE.jsonl",
        help="build medqa_usmle from this MedQA JSONL file, keeping the items the MedQA rule picks",
    )
    b.add_argument("--medqa-train", type=Path, metavar="FILE.jsonl",
                   help="also make golden consultations (consult_train) and CRAFT-MD training cases (craftmd_train) from this MedQA-format JSONL file (MedQA's training "
                        "split: question, options, answer_idx; optional facts)")
    b.add_argument("--golden-writer", metavar="PROVIDER/MODEL",
                   help="also write golden consultations with this model playing both sides (cached; failures listed in "
                        "build_report.md); openai-api/<service>/<model> reads <SERVICE>_BASE_URL and <SERVICE>_API_KEY")
    b.add_argument("--golden-limit", type=int, metavar="N", help="with --golden-writer: write the first N kept cases only")
    b.add_argument("--golden-base-url", metavar="URL", help="with --golden-writer: the server of an openai/ model")
    b.add_argument("--cache", type=Path, metavar="FILE", help="with --golden-writer: the request cache (default: the package's)")
    b.add_argument("--overwrite", action="store_true", help="replace an existing build at --out (atomically)")
    add_quiet_argument(b)

    pub = command(sub, "publish", _publish)
    pub.add_argument("dir", type=Path, nargs="?", metavar="DIR", help="a built dataset folder (what `craftmd build --out` wrote)")
    what = pub.add_mutually_exclusive_group()
    what.add_argument("--release", type=Path, metavar="DIR", help="publish this release folder instead (needs --revision)")
    what.add_argument("--leaderboard", type=Path, metavar="DIR",
                      help="publish this leaderboard folder (`craftmd leaderboard --out`) with the releases at --releases (needs --revision)")
    pub.add_argument("--releases", type=Path, metavar="DIR", help="with --leaderboard: the folder of the releases its page was made from")
    pub.add_argument("--repo", required=True, metavar="ORG/NAME", help="the dataset repo on the Hub")
    pub.add_argument("--revision", metavar="TAG",
                     help="the version to tag, checked before any upload (default for a dataset: v<version of the build>)")
    pub.add_argument("--dry-run", action="store_true", help="print the upload plan (files, sizes, repo, tag) and stop")

    pn = command(sub, "pin", _pin)
    pn.add_argument("unpacked", type=Path, metavar="DIR", help="the unpacked release (its top folder)")
    pn.add_argument("--commit", required=True, help="the upstream commit the folder is")
    pn.add_argument("--dest", type=Path, help="where to write (default: the package's pin folder)")


def _build(args: argparse.Namespace) -> int:
    """build the Hugging Face dataset from the pinned upstream source

    Build the CRAFT-MD dataset (configs medqa_usmle, derm_public, derm_private, all, nejm_image, diagnoses)
    from the pinned upstream release, verified file by file against dataset_builder/pin/<commit>.sha256, and
    the facts config (MediQ's atomic facts, CC BY 4.0) from the pinned MediQ archive ($CRAFTMD_MEDIQ, else
    ../shared/sources).
    The consult_train config (split train) holds golden consultations for training a doctor: scripted from MediQ's
    MedQA lines (and --medqa-train's), no model needed, and with --golden-writer also written by a model; every
    benchmark case is excluded (dropped candidates listed in build_report.md).
    The craftmd_train config (split train) holds the same MedQA items posed as CRAFT-MD vignettes (the columns
    of medqa_usmle, ids train_...), for training; every benchmark case is excluded the same way.
    Writes parquet per config, a README.md card, build_manifest.json and build_report.md into --out,
    atomically; any bad input stops the build with one line and leaves nothing at --out.
    """
    from craftmd import CraftMDError
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.source import Source

    if args.golden_writer is None and any(x is not None for x in (args.golden_limit, args.golden_base_url, args.cache)):
        raise CraftMDError("--golden-limit, --golden-base-url and --cache go with --golden-writer")
    golden_writer = None
    if args.golden_writer:
        from craftmd.generation.golden import writer

        golden_writer = writer(args.golden_writer, base_url=args.golden_base_url, cache=args.cache, limit=args.golden_limit,
                               progress=not args.quiet)

    report = build_dataset(
        Source(args.source),
        args.out,
        version=args.data_version,
        overwrite=args.overwrite,
        progress=not args.quiet,
        medqa=args.medqa,
        medqa_train=args.medqa_train,
        golden_writer=golden_writer,
    )
    print(report.summary())
    print(f'dataset written to {args.out}; load it with datasets.load_dataset("{args.out}", "medqa_usmle")')
    return 0


def _publish(args: argparse.Namespace) -> int:
    """publish a built dataset, a release or a whole leaderboard to the Hugging Face Hub, tagged with its version

    Publish, as a dataset repo ORG/NAME on the Hugging Face Hub (created if needed): a built dataset (DIR, what
    `craftmd build` wrote; tag v<version> from build_manifest.json unless --revision), a release (--release DIR:
    its tables, run record and a card) or a whole leaderboard (--leaderboard DIR --releases DIR: the page under
    page/ and every release under releases/<id>/, with a card). Everything is checked locally first, then the
    version on the Hub: a tag that exists already is refused in one line and nothing is uploaded. One commit makes
    the repo's main exactly what is published, and the tag is put on it. The key is read from $HF_TOKEN only and
    never written ($HF_ENDPOINT picks another hub); --dry-run only prints the plan.
    """
    from craftmd import CraftMDError
    from craftmd.dataset_builder.publish import hub_url, publish

    chosen = [x for x in (args.dir, args.release, args.leaderboard) if x is not None]
    if len(chosen) != 1:
        raise CraftMDError("publish one thing: a built dataset DIR, --release DIR or --leaderboard DIR")
    if args.releases is not None and args.leaderboard is None:
        raise CraftMDError("--releases goes with --leaderboard")
    kind = "release" if args.release else "leaderboard" if args.leaderboard else "dataset"
    plan = publish(chosen[0], args.repo, revision=args.revision, dry_run=args.dry_run, kind=kind, releases=args.releases)
    if args.dry_run:
        print(plan.describe())
        print("dry run: nothing uploaded")
    else:
        print(f"published {len(plan.files)} files to {hub_url()}/datasets/{plan.repo}, tagged {plan.revision}")
    return 0


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
