"""``craftmd judge``: MedPI's rubric judge over a release's conversations (:mod:`craftmd.scoring.judge`)."""

from __future__ import annotations

import json

from craftmd import CraftMDError
from craftmd.commands.cli import add_call_arguments, add_cases_argument, add_quiet_argument, add_source_argument, check_base_url, command, list_type, price_type


def _judge(args) -> int:
    """judge whole conversations on MedPI's 105-dimension rubric with a committee of LLM judges

    Each conversation of each RELEASE is discussed by a committee (three viewpoints, quoting the
    transcript) per rubric category, then scored 1-4 per dimension with a rationale and quoted evidence,
    conditioned on that discussion; only the dimensions that apply to the encounter's objective are
    scored (CRAFT-MD conversations are diagnosis encounters). Scores go to the release's scores.parquet
    (scorer judge:PROVIDER/MODEL, and judge-committee for the median of several judges; metric
    rubric_score; a reply that never validates is a failed score, not a number). --catalog prints the
    rubric as JSON lines; --estimate prints the calls and tokens a run would need and sends nothing. A release whose
    judge records match this run (same conversations, objectives, selection, catalog, prompts and settings, no
    transient failure) is left as it is ("scores current, nothing to do") unless --overwrite.
    """
    import sys

    from craftmd.scoring.judge import JudgeSpec, estimate_release, judge_release, stale
    from craftmd.scoring.rubric import catalog_lines, load_catalog

    if args.catalog:
        for line in catalog_lines(load_catalog()):
            print(line)
        return 0
    if not args.release and not args.validity:
        raise CraftMDError("no release given (craftmd judge RELEASE --judge PROVIDER/MODEL)")
    if args.base_url:
        check_base_url(args.base_url)
    spec = JudgeSpec(
        models=args.judge or [], mode=args.mode, seeds=args.seeds, seed=args.seed, dimensions=args.dimensions,
        response_format=args.response_format, temperature=args.temperature, discussion_tokens=args.max_tokens,
        score_tokens=args.score_tokens, max_invalid=args.max_invalid, base_url=args.base_url, cache=args.cache,
        concurrency=args.concurrency, server_concurrency=args.server_concurrency, max_retries=args.max_retries, timeout=args.timeout, force=args.force,
        progress=not args.quiet, price=args.price,
    )  # fmt: skip
    if not spec.models:
        raise CraftMDError("no judge given (--judge PROVIDER/MODEL, once per judge)")
    if args.validity:
        return _validity(args, spec)
    where = dict(dataset_dir=args.dataset, conversations=args.conversation, cases=args.cases)
    for release in args.release:
        if not args.estimate and not args.overwrite and not stale(release, spec, **where):
            print(f"{release}: scores current, nothing to do (--overwrite judges again)", file=sys.stderr)
            print(json.dumps({"release": str(release), "current": True}, sort_keys=True))
            continue
        out = estimate_release(release, spec, **where) if args.estimate else judge_release(release, spec, **where)
        print(json.dumps(out, sort_keys=True))
    return 0


def _validity(args, spec) -> int:
    """The judge against the dermatologists' Q1/Q2 labels, written as an audit (JSON) to --validity."""
    from craftmd.atomic import atomic_write_json
    from craftmd.analysis.agreement.judge_validity import judge_validity, judge_validity_audit
    from craftmd.source import Source, default_location

    if args.dataset is None:
        raise CraftMDError("--validity needs --dataset (the built dataset)")
    res = judge_validity(args.dataset, Source(args.source or default_location()), spec)
    atomic_write_json(args.validity, judge_validity_audit(res))
    print(json.dumps({k: res[k] for k in ("conversations", "judges", "scorer", "requests", "sent", "failures")}, sort_keys=True))
    return 0


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
        path = export_rubric_review(args.paths, args.out, n=args.n, seed=args.seed, dimensions=args.dimensions, dataset_dir=args.dataset,
                                    overwrite=args.overwrite)  # fmt: skip
    else:
        path = import_rubric_review(args.paths, args.out, B=args.B, seed=args.seed)
    print(json.dumps({"written": str(path)}))
    return 0


def register(sub) -> None:
    """Add ``craftmd judge`` and ``craftmd judge-review`` to the `craftmd` parser."""
    from craftmd.scoring.judge import DISCUSSION_TOKENS, MODES, RESPONSE_FORMATS, SCORE_TOKENS

    p = command(sub, "judge", _judge)
    p.add_argument("release", nargs="*", metavar="RELEASE", help="release folder(s)")
    p.add_argument("--judge", action="append", metavar="PROVIDER/MODEL", help="a judge model; repeat for a committee")
    p.add_argument("--seeds", type=int, default=1, help="committee members per judge model, seeds 0..N-1 (default 1)")
    p.add_argument("--dimensions", type=list_type, metavar="NAME[,NAME...]",
                   help="only these dimension ids, categories or meta-categories (default: all that apply)")
    p.add_argument("--mode", choices=MODES, default="dimension",
                   help="scoring calls: one per dimension (the method's, default) or one per category (cheaper)")
    p.add_argument("--response-format", choices=RESPONSE_FORMATS, default="json_schema",
                   help="how the reply's JSON schema is requested: OpenAI json_schema (default), llama.cpp's json_object, or none")
    p.add_argument("--conversation", type=list_type, metavar="KIND[,KIND...]", help="only these conversation kinds (e.g. standard)")
    add_cases_argument(p)
    p.add_argument("--dataset", metavar="DIR", default=None,
                   help="the built dataset (needed for a release of another task than craftmd: its packets config gives the objectives)")
    add_call_arguments(p, concurrency=8, max_tokens=DISCUSSION_TOKENS, temperature=0.0,
                       seed_help="seed of the dimension order and of the judges' sampling (default 0; recorded)")
    p.add_argument("--score-tokens", type=int, default=SCORE_TOKENS, help=f"cap of a score reply per dimension (default {SCORE_TOKENS})")
    p.add_argument("--max-invalid", type=int, default=2, help="times a reply that does not validate is asked again (default 2)")
    p.add_argument("--price", type=price_type, metavar="IN,OUT", help="USD per million input,output tokens, for the cost")
    p.add_argument("--estimate", action="store_true", help="print calls, tokens (and cost with --price) and send nothing")
    p.add_argument("--force", action="store_true", help="allow a judge of the doctor's own model family (recorded)")
    p.add_argument("--overwrite", action="store_true", help="judge again even when the scores are current (the request cache still answers)")
    p.add_argument("--catalog", action="store_true", help="print the rubric catalog as JSON lines and exit")
    p.add_argument("--validity", metavar="OUT.json", default=None,
                   help="instead of a release: judge the conversations the CRAFT-MD dermatologists rated and write each "
                        "information-gathering and diagnosis dimension's AUC for their Q1/Q2 labels as an audit (needs --dataset)")
    add_source_argument(p)
    add_quiet_argument(p)

    r = command(sub, "judge-review", _review)
    r.add_argument("action", choices=("export", "import"))
    r.add_argument("paths", nargs="+", metavar="PATH", help="export: release folder(s); import: filled-in .xlsx sheet(s)")
    r.add_argument("--out", required=True, metavar="FILE", help="export: the .xlsx to write; import: the results .json (the ratings go beside it, .scores.parquet)")
    r.add_argument("--n", type=int, default=10, help="export: conversations per release (default 10)")
    r.add_argument("--seed", type=int, default=15, help="the sample's and the bootstrap's seed (default 15)")
    r.add_argument("--dimensions", type=list_type, metavar="NAME[,NAME...]", help="export: only these dimension ids, categories or meta-categories")
    r.add_argument("--dataset", metavar="DIR", default=None, help="export: the built dataset (a release of another task than craftmd)")
    r.add_argument("--B", type=int, default=1000, help="import: bootstrap resamples (default 1000)")
    r.add_argument("--overwrite", action="store_true")


__all__ = ["register"]
