"""``craftmd review export|import|upstream``: the expert review of the doctor-AI, patient-AI and grader-AI.

Each step calls one function of :mod:`craftmd.analysis.agreement.review` or :mod:`~craftmd.analysis.agreement.expert`.
"""

from __future__ import annotations

import argparse
import json
import sys

from craftmd.commands.cli import add_source_argument, command, positive_int, seed_type


def register(sub) -> None:
    """Add ``craftmd review export|import|upstream`` to the `craftmd` parser."""
    review = sub.add_parser(
        "review",
        help="expert review: export sheets for clinicians, import their answers, recompute the paper's expert figures",
        description="Expert review of the doctor-AI, patient-AI and grader-AI.",
    )
    rsub = review.add_subparsers(dest="review_command", metavar="ACTION", required=True)
    ex = command(rsub, "export", _review_export)
    ex.add_argument("--release", action="append", required=True, metavar="DIR",
                    help="a release folder, or a folder of releases (repeatable)")  # fmt: skip
    ex.add_argument("--dataset", required=True, help="built dataset folder")
    ex.add_argument("--n", type=positive_int, required=True, help="conversations per model x dataset source")
    ex.add_argument("--seed", type=seed_type, required=True)
    ex.add_argument(
        "--grader", help="grader whose verdicts go into the key (default: an llm: grader, else upstream-gpt4, else offline)"
    )
    ex.add_argument("--out", required=True, help="the .xlsx to write")
    ex.add_argument("--overwrite", action="store_true")

    im = command(rsub, "import", _review_import)
    im.add_argument("files", nargs="+", metavar="FILE", help=".xlsx sheets (or upstream's validation_graderai.csv)")
    im.add_argument("--out", required=True, help="folder for the results (e.g. the leaderboard's audits folder)")
    im.add_argument("--dataset", help="built dataset folder: checks the case ids of upstream-layout sheets")
    im.add_argument(
        "--release", help="release whose grades judge upstream's grader-validation cases (default: the pinned source)"
    )
    im.add_argument("--grader", default="upstream-gpt4", help="grader of --release for the grader-validation counts")
    add_source_argument(im)
    im.add_argument("--id", default="expert-review", help="audit id (file name of the JSON)")

    up = command(rsub, "upstream", _review_upstream)
    add_source_argument(up)
    up.add_argument("--out", help="write the audit JSON (expert-upstream.json) into this folder")
    up.add_argument("--json", action="store_true", help="print the full results as JSON")


def _review_export(args: argparse.Namespace) -> int:
    """write an .xlsx of sampled conversations with the review questions

    Sample N conversations per model x dataset source (single-diagnosis cases first), seeded, into an .xlsx
    with one answer column per question for two raters (r1:, r2:) and a hidden key of the grader's verdicts.
    """
    from craftmd.analysis.agreement.review import export_review

    out = export_review(
        args.release, args.dataset, args.out, n=args.n, seed=args.seed, grader=args.grader, overwrite=args.overwrite
    )
    print(f"wrote {out}")
    return 0


def _print_results(res: dict) -> None:
    gc = res.get("grader_counts")
    if gc:
        print(f"grader vs dermatologists: {gc['agreement_pct']} % agreement over {gc['cases']} cases x 5 trials "
              f"({gc['trial_disagreements']} trial disagreements); counts equal in {gc['count_equal_pct']} % of cases; "
              f"Spearman rho {gc['spearman_rho']}; extracted answers matching the grader's: "
              f"{gc['extracted_matching_grader']}/{gc['extracted_total']}")  # fmt: skip
    gv = res.get("grader_vs_expert")
    if gv:
        print(f"grader vs experts: {gv['agreement_pct']} % agreement over {gv['conversations']} conversations; "
              f"kappa {gv['kappa']}; Spearman rho {gv['spearman_rho']}")  # fmt: skip
    for r in res.get("interrater", []):
        print(f"inter-rater  {r['question']:20s} {r['model']:12s} n {r['n']:3d}  agreement {r['agreement_pct']} %  "
              f"kappa {r['kappa']}  tie-broken {r['tiebroken']}  unresolved {r['unresolved']}")  # fmt: skip
    for r in res.get("shares", []):
        print(f"share yes    {r['question']:20s} {r['model']:12s} {r['yes']:3d}/{r['n']:3d} = {r['share_pct']} %")


def _review_import(args: argparse.Namespace) -> int:
    """validate filled-in sheets and compute agreement (kappa), shares and expert-vs-grader agreement

    Read filled-in review sheets (this package's, or upstream's annotation files, detected by their header).
    The first two rater sets with answers are the primary raters (files in order, r1 before r2); later sets
    break ties. Any unknown id or blank/malformed answer is reported with file, sheet, row and column, and
    nothing is written. Writes OUT/<id>.json (audit dict with every figure) and the ratings as a scores table OUT/<id>.scores.parquet.
    """
    from craftmd.analysis.agreement.expert import import_review

    source = None
    if args.source:
        from craftmd.source import Source

        source = Source(args.source)
    path = import_review(args.files, args.out, dataset_dir=args.dataset, release=args.release, grader=args.grader,
                         source=source, audit_id=args.id)  # fmt: skip
    _print_results(json.loads(path.read_text())["data"])
    print(f"wrote {path}")
    return 0


def _review_upstream(args: argparse.Namespace) -> int:
    """recompute the paper's expert figures from the annotations in the pinned source

    Import results/expert_annotations/ of the pinned source through the same path as `review import` and print
    every figure: grader-vs-dermatologist agreement (published 93.35 %), per-model shares and kappas.
    """
    from craftmd.analysis.agreement.expert import upstream_expert_audit, write_upstream_expert_audit
    from craftmd.source import Source

    source = Source(args.source) if args.source else Source()
    if args.out:
        path = write_upstream_expert_audit(source, args.out)
        audit = json.loads(path.read_text())
    else:
        audit, path = upstream_expert_audit(source), None
    if args.json:
        json.dump(audit["data"], sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        _print_results(audit["data"])
    if path:
        print(f"wrote {path}")
    return 0


__all__ = ["register"]
