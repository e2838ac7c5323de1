"""Subcommands of the benchmark's audits: ``craftmd meld`` and ``craftmd review export|import|upstream``.

Registered by ``craftmd.scoring.cli.register``; each handler parses nothing itself and
calls one function of :mod:`craftmd.scoring.meld`, :mod:`~craftmd.analysis.agreement.review` or
:mod:`~craftmd.analysis.agreement.expert`.
"""

from __future__ import annotations

import argparse
import json
import sys

from craftmd.commands.cli import (
    add_cases_argument, add_dataset_argument, add_quiet_argument, add_source_argument, command, positive_int, temperature_type,
)


def register_audits(sub) -> None:
    meld = command(sub, "meld", _meld)
    add_dataset_argument(meld)
    meld.add_argument("--model", required=True, help="PROVIDER/MODEL, e.g. openai/gpt-4o or vllm/Qwen/Qwen2.5-7B-Instruct")
    meld.add_argument("--base-url", help="OpenAI-compatible server (e.g. a vllm serve endpoint)")
    meld.add_argument("--config", action="append", dest="configs", metavar="CONFIG",
                      help="dataset config(s) to test (repeatable; default medqa_usmle, derm_public, derm_private)")  # fmt: skip
    add_cases_argument(meld)
    meld.add_argument("--limit", type=int, help="only the first N cases of each config")
    meld.add_argument("--cache", help="request cache (SQLite) path; reruns answer from it")
    meld.add_argument("--split", choices=("chars", "words"), default="chars",
                      help="halve at the space nearest the character midpoint (the paper's rule, default) or by word count")  # fmt: skip
    meld.add_argument("--role", choices=("system", "user"), default="system", help="send the prompt as this role (paper: system)")
    meld.add_argument("--temperature", type=temperature_type, default=0.0)
    meld.add_argument("--max-tokens", type=positive_int, default=1024)
    meld.add_argument("--seed", type=int, default=0)
    meld.add_argument("--concurrency", type=int, default=8)
    meld.add_argument("--threshold", type=float, default=0.95, help="similarity that flags a case (default 0.95)")
    meld.add_argument("--out", required=True, help="output folder (written atomically)")
    meld.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    meld.add_argument("--audits", help="also write the leaderboard audit JSON (and figure) into this folder")
    add_quiet_argument(meld)

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
    ex.add_argument("--n", type=int, required=True, help="conversations per model x dataset source")
    ex.add_argument("--seed", type=int, required=True)
    ex.add_argument("--grader", help="grader whose verdicts go into the key (default: an llm: grader, else upstream-gpt4, else offline)")
    ex.add_argument("--out", required=True, help="the .xlsx to write")
    ex.add_argument("--overwrite", action="store_true")

    im = command(rsub, "import", _review_import)
    im.add_argument("files", nargs="+", metavar="FILE", help=".xlsx sheets (or upstream's validation_graderai.csv)")
    im.add_argument("--out", required=True, help="folder for the results (e.g. the leaderboard's audits folder)")
    im.add_argument("--dataset", help="built dataset folder: checks the case ids of upstream-layout sheets")
    im.add_argument("--release", help="release whose grades judge upstream's grader-validation cases (default: the pinned source)")
    im.add_argument("--grader", default="upstream-gpt4", help="grader of --release for the grader-validation counts")
    add_source_argument(im)
    im.add_argument("--id", default="expert-review", help="audit id (file name of the JSON)")

    up = command(rsub, "upstream", _review_upstream)
    add_source_argument(up)
    up.add_argument("--out", help="write the audit JSON (expert-upstream.json) into this folder")
    up.add_argument("--json", action="store_true", help="print the full results as JSON")


def _meld(args: argparse.Namespace) -> int:
    """contamination check (MELD): can a model write the second half of each vignette?

    For each case, give the model the first half of the vignette with the paper's MELD prompt
    (scoring/prompts/meld.txt) and compare its completion with the true second half: similarity = 1 -
    Levenshtein distance / length of the longer text; similarity >= threshold flags the case as likely
    memorised. Writes OUT/scores.parquet (per case: meld_similarity, meld_flagged), OUT/summary.json and
    OUT/similarity_hist.png.
    """
    from craftmd.analysis.meld import write_meld_audit
    from craftmd.scoring.meld import DEFAULT_CONFIGS, read_summary, run_meld

    out = run_meld(
        args.dataset, args.model, args.out, base_url=args.base_url, configs=tuple(args.configs or DEFAULT_CONFIGS),
        cases=args.cases, limit=args.limit, cache=args.cache, split=args.split, role=args.role,
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed, concurrency=args.concurrency,
        threshold=args.threshold, overwrite=args.overwrite, progress=not args.quiet,
    )  # fmt: skip
    s = read_summary(out)
    for name, st in [*sorted(s["configs"].items()), ("all", s["overall"])]:
        share = "n/a" if st["share_flagged"] is None else f"{100 * st['share_flagged']:.2f} %"
        print(f"{name:14s} cases {st['n']:5d}  failed {st['n_failed']:4d}  flagged {st['n_flagged']:4d} ({share})  "
              f"mean similarity {st['mean_similarity']}")  # fmt: skip
    if args.audits:
        print(f"audit: {write_meld_audit(out, args.audits)}")
    print(f"wrote {out}")
    return 0


def _review_export(args: argparse.Namespace) -> int:
    """write an .xlsx of sampled conversations with the review questions

    Sample N conversations per model x dataset source (single-diagnosis cases first), seeded, into an .xlsx
    with one answer column per question for two raters (r1:, r2:) and a hidden key of the grader's verdicts.
    """
    from craftmd.analysis.agreement.review import export_review

    out = export_review(args.release, args.dataset, args.out, n=args.n, seed=args.seed, grader=args.grader, overwrite=args.overwrite)
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
