"""Subcommands of craftmd.analysis (registered by craftmd.cli): ingest, analyse, leaderboard."""

from __future__ import annotations

from pathlib import Path

from craftmd.cli import add_source_argument


def _ingest(args) -> int:
    from craftmd.generation.ingest import ingest
    from craftmd.source import Source

    src = Source(args.source)
    if args.data is None:  # build the dataset the releases are graded against into a scratch folder
        import tempfile

        from craftmd.dataset_builder.build import build_dataset

        with tempfile.TemporaryDirectory() as tmp:
            build_dataset(src, Path(tmp) / "data", progress=not args.quiet)
            paths = ingest(src, Path(tmp) / "data", args.out, models=args.model or None, progress=not args.quiet,
                           overwrite=args.overwrite, skip_existing=args.skip_existing)
    else:
        paths = ingest(src, args.data, args.out, models=args.model or None, progress=not args.quiet,
                       overwrite=args.overwrite, skip_existing=args.skip_existing)
    for p in paths:
        print(p)
    return 0


def _analyse(args) -> int:
    from .pipeline import analyse
    from .page import write_page

    a = analyse(args.releases, args.data, args.out, B=args.resamples, seed=args.seed)
    if args.page:
        write_page(a, Path(args.out))
    print(f"tables written: {Path(args.out, 'tables').resolve()}")
    return 0


def _leaderboard(args) -> int:
    from .pipeline import leaderboard

    leaderboard(source=args.source, data=args.data, releases=args.releases, out=args.out, audits=args.audits,
                graders=args.grader, B=args.resamples, seed=args.seed, progress=not args.quiet)
    return 0


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    from .bootstrap import DEFAULT_B, DEFAULT_SEED

    p = sub.add_parser(
        "ingest",
        help="turn upstream results/<model>/ folders into frozen, graded releases",
        description="Read each upstream results/<model>/ folder of the pinned source once and write a frozen release "
        "OUT/<model>/ (conversations, answers, grades: paper and strict MCQ rules, recorded GPT-4 FRQ labels; manifest).",
    )
    add_source_argument(p)
    p.add_argument("--data", default=None, help="a built dataset folder (craftmd build --out DIR); default: build one into a scratch folder")
    p.add_argument("--out", required=True, help="the releases folder to write into")
    p.add_argument("--model", action="append", help="only this upstream model (repeatable); default: all six")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace existing releases")
    g.add_argument("--skip-existing", action="store_true", help="keep existing releases that are valid ingests of this source")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_ingest)

    p = sub.add_parser(
        "analyse",
        help="accuracy tables with bootstrap CIs and paired tests from graded releases",
        description="Run the named DuckDB queries (analysis/sql) over every graded release and write OUT/tables/*.csv "
        "(accuracy with 95%% bootstrap CIs, p-values) and OUT/figures/*.png.",
    )
    p.add_argument("--releases", required=True, help="folder of release folders")
    p.add_argument("--data", required=True, help="the built dataset folder (case metadata)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--resamples", type=int, default=DEFAULT_B, help=f"bootstrap resamples (default {DEFAULT_B})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    p.add_argument("--page", action="store_true", help="also write index.html and leaderboard.md")
    p.set_defaults(func=_analyse)

    p = sub.add_parser(
        "leaderboard",
        help="build -> ingest -> grade -> analyse -> page, in one command",
        description="Regenerate the leaderboard from the pinned source: build the dataset if needed, ingest upstream "
        "results (keeping valid releases), grade, analyse, render audits, and write OUT/index.html, OUT/leaderboard.md, "
        "OUT/figures/ and OUT/tables/.",
    )
    add_source_argument(p)
    p.add_argument("--data", required=True, help="dataset folder (built here when missing or stale)")
    p.add_argument("--releases", required=True, help="releases folder (upstream releases ingested here)")
    p.add_argument("--out", required=True, help="where the page goes")
    p.add_argument("--audits", default=None, help="folder of audit JSON files to render in 'How far to trust these numbers'")
    p.add_argument("--grader", action="append", default=None, help="FRQ grader(s) to run on every release (default: offline)")
    p.add_argument("--resamples", type=int, default=DEFAULT_B, help=f"bootstrap resamples (default {DEFAULT_B})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_leaderboard)
