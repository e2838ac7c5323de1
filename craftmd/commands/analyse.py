"""``craftmd analyse``: the tables, figures and page of graded releases (:func:`craftmd.analysis.tables.analyse`).

Analysis only reads releases; the main job that builds, ingests and grades first is
``craftmd leaderboard`` (:mod:`craftmd.commands.leaderboard`).
"""

from __future__ import annotations

from pathlib import Path

from craftmd.commands.cli import add_dataset_argument, command, resamples_type, seed_type


def _analyse(args) -> int:
    """accuracy tables with bootstrap CIs and paired tests from graded releases

    Run the named DuckDB queries (analysis/sql) over every graded release and write OUT/tables/*.csv (accuracy
    with 95% bootstrap CIs, p-values between settings and models, four-choice MCQ against FRQ, with against
    without the image) and OUT/figures/*.png. Models are compared pairwise in every setting and format while a
    family has at most 8 models; on a larger board each model is tested against its neighbours in the ranking and
    against the leader (Holm over exactly those tests), unless --all-pairs. OUT is replaced whole (a failed run leaves the
    previous one as it was); an existing OUT must be an earlier analysis or leaderboard folder. An analysis into the
    folder of an earlier one reads back, from OUT/.cache, every release's case scores and every interval and p-value
    whose inputs are unchanged (and the figures, when no table changed): adding a release computes that release and
    its pairs, and the output is the same bytes as a full run (--no-cache recomputes everything).
    """
    from craftmd.atomic import atomic_dir

    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import OWNS, analyse

    with atomic_dir(args.out, owns=OWNS) as tmp:  # OUT is replaced whole, or left as it was
        a = analyse(
            args.releases,
            args.dataset,
            tmp,
            B=args.resamples,
            seed=args.seed,
            packets=args.packets,
            rubric_options={"unsupported": args.unsupported, "prefer": args.rubric_scorer},
            all_pairs=args.all_pairs,
            previous=None if args.no_cache else args.out,
        )
        if args.page:
            write_page(a, tmp)
    print(f"tables written: {Path(args.out, 'tables').resolve()}")
    return 0


def register(sub) -> None:
    """Add ``craftmd analyse`` to the `craftmd` parser."""
    from craftmd.analysis.bootstrap import DEFAULT_B, DEFAULT_SEED

    p = command(sub, "analyse", _analyse)
    p.add_argument("--releases", required=True, help="folder of release folders")
    add_dataset_argument(p, help="the built dataset folder (case metadata)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--resamples", type=resamples_type, default=DEFAULT_B, help=f"bootstrap resamples (default {DEFAULT_B})")
    p.add_argument("--seed", type=seed_type, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    p.add_argument(
        "--all-pairs",
        action="store_true",
        help="test every pair of models (default: every pair only up to 8 models per setting and format; on a larger "
        "board each model against its neighbours in the ranking and against the leader, linear in the board)",
    )
    p.add_argument("--page", action="store_true", help="also write index.html and leaderboard.md")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute every case score, interval, p-value and figure (default: read back from OUT/.cache what an earlier "
        "analysis into OUT computed from the same cases and scores; the output is the same bytes either way)",
    )
    p.add_argument(
        "--packets", help="the built medpi folder (craftmd encounters build): gives each encounter's reason and objective"
    )
    p.add_argument(
        "--unsupported",
        choices=("count", "drop"),
        default="count",
        help="rubric scores none of whose evidence quotes is in the transcript (label no_evidence): count them "
        "(default) or leave them out of the profiles; the page says which",
    )
    p.add_argument(
        "--rubric-scorer",
        choices=("auto", "judge", "calibrated", "human"),
        default="auto",
        help="whose rubric scores stand for a release: auto (the calibrated judge, else the judge, else the "
        "experts' imported ratings; default), or only that kind; the page names it",
    )


__all__ = ["register"]
