"""``craftmd judge-review export|import``: rating sheets of judged conversations for experts, and their agreement."""

from __future__ import annotations

import json

from craftmd import CraftMDError
from craftmd.commands.cli import add_list_argument, command, positive_int, resamples_type, seed_type


def _review(args) -> int:
    """export 1-4 rating sheets of judged conversations for experts, or import them and measure agreement

    export: sample --n judged conversations per RELEASE (seeded) into an .xlsx with one row per conversation and
    dimension, a 1-4 column per rater (r1, r2) and the judge's scores in a hidden key sheet. import: read filled-in
    sheets (every bad rating reported with its cell; nothing computed then) and write, per dimension and pooled, the
    experts' agreement with each other and with the judge (weighted kappa, Krippendorff's ordinal alpha, Spearman)
    with 95 % bootstrap CIs as JSON to --out, and the ratings beside it as a scores table (OUT-stem.scores.parquet: metric
    expert_rubric_rating, scorer rater:<name> per rater and experts for the resolved rating, variant key dimension).
    """
    from craftmd.analysis.agreement.rubric_review import export_rubric_review, import_rubric_review

    if args.action == "export":
        if args.out is None:
            raise CraftMDError("judge-review export needs --out FILE.xlsx")
        path = export_rubric_review(args.paths, args.out, n=args.n, seed=args.seed, dimensions=args.dimensions, dataset_dir=args.dataset,
                                    overwrite=args.overwrite)  # fmt: skip
    else:
        if args.out is None and args.into is None:
            raise CraftMDError("judge-review import needs --out FILE.json, --into RELEASES_DIR, or both")
        if args.into is not None:
            from craftmd.analysis.agreement.rubric_review import people_ratings
            from craftmd.scoring.score import score_with

            scorer, rated = people_ratings(args.paths, args.into)
            got = score_with(scorer, [r.path for r in rated])
            if args.out is None:
                print(json.dumps({"releases": got}, sort_keys=True))
                return 0
        path = import_rubric_review(args.paths, args.out, B=args.B, seed=args.seed)
    print(json.dumps({"written": str(path)}))
    return 0


def register(sub) -> None:
    """Add ``craftmd judge-review`` to the `craftmd` parser."""
    r = command(sub, "judge-review", _review)
    r.add_argument("action", choices=("export", "import"))
    r.add_argument("paths", nargs="+", metavar="PATH", help="export: release folder(s); import: filled-in .xlsx sheet(s)")
    r.add_argument(
        "--out",
        metavar="FILE",
        help="export: the .xlsx to write; import: the results .json (the ratings go beside it, .scores.parquet)",
    )
    r.add_argument(
        "--into",
        metavar="RELEASES_DIR",
        default=None,
        help="import: also add the ratings to the rated releases under this folder (scorers rater:<name> and experts, "
        "metric expert_rubric_rating), where the board shows them in a judge's place, marked human",
    )
    r.add_argument("--n", type=positive_int, default=10, help="export: conversations per release (default 10)")
    r.add_argument("--seed", type=seed_type, default=15, help="the sample's and the bootstrap's seed (default 15)")
    add_list_argument(r, "--dimensions", "NAME[,NAME...]", "export: only these dimension ids, categories or meta-categories")
    r.add_argument(
        "--dataset", metavar="DIR", default=None, help="export: the built dataset (a release of another task than craftmd)"
    )
    r.add_argument("--B", type=resamples_type, default=1000, help="import: bootstrap resamples (default 1000)")
    r.add_argument("--overwrite", action="store_true")


__all__ = ["register"]
