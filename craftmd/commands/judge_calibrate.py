"""``craftmd judge-calibrate fit|apply``: a rubric judge calibrated against experts' ratings, and added to releases."""

from __future__ import annotations

import json

from craftmd import CraftMDError
from craftmd.commands.cli import command, positive_int, resamples_type, seed_type


def register(sub) -> None:
    """Add ``craftmd judge-calibrate`` to the `craftmd` parser."""
    from craftmd.analysis.agreement.calibration import BY, MIN_RATINGS

    c = command(sub, "judge-calibrate", _calibrate)
    c.add_argument("action", choices=("fit", "apply"))
    c.add_argument(
        "paths", nargs="+", metavar="PATH", help="fit: filled-in judge-review .xlsx sheet(s); apply: release folder(s)"
    )
    c.add_argument("--out", metavar="FILE.json", help="fit: the calibration to write")
    c.add_argument("--calibration", metavar="FILE.json", help="apply: the calibration (judge-calibrate fit)")
    c.add_argument("--by", choices=BY, default="dimension", help="fit: one map per dimension (default) or per category")
    c.add_argument(
        "--min-ratings", type=positive_int, default=MIN_RATINGS, help=f"fit: rated pairs each group needs (default {MIN_RATINGS})"
    )
    c.add_argument("--folds", type=positive_int, default=5, help="fit: cross-validation folds over conversations (default 5)")
    c.add_argument("--seed", type=seed_type, default=15, help="fit: the folds' and the bootstrap's seed (default 15)")
    c.add_argument("--B", type=resamples_type, default=1000, help="fit: bootstrap resamples of the CIs (default 1000)")
    c.add_argument("--overwrite", action="store_true")


def _calibrate(args) -> int:
    """calibrate a rubric judge against experts' ratings, or add the calibrated judge to releases

    fit: from filled-in judge-review sheets, fit per dimension (or --by category) an isotonic map from the judge's
    1-4 score to the experts' resolved rating, measure it out of sample (--folds over conversations: weighted kappa
    and mean bias in points on 0-100, before and after, with 95 % bootstrap CIs) and write it as JSON to --out; every
    group needs --min-ratings rated pairs (default 30), else one line and nothing written. apply: add scorer
    judge-calibrated (metric rubric_score_calibrated) to each RELEASE from its judge's scores; its record names the
    calibration's and the ratings' sha256. craftmd analyse --rubric-scorer chooses whose scores the board shows.
    """
    from craftmd.analysis.agreement.calibration import calibrate, calibrated_judge
    from craftmd.scoring.score import score_with

    if args.action == "fit":
        if args.out is None:
            raise CraftMDError("judge-calibrate fit needs --out FILE.json")
        res = calibrate(args.paths, args.out, by=args.by, min_ratings=args.min_ratings, folds=args.folds, seed=args.seed, B=args.B,
                        overwrite=args.overwrite)  # fmt: skip
        print(json.dumps({"written": str(args.out), "pairs": res["pairs"], "held_out": res["held_out"]}, sort_keys=True))
        return 0
    if args.calibration is None:
        raise CraftMDError("judge-calibrate apply needs --calibration FILE.json")
    print(json.dumps({"calibrated": score_with(calibrated_judge(args.calibration), args.paths)}, sort_keys=True))
    return 0


__all__ = ["register"]
