"""``craftmd judge --catalog|--validity`` and ``craftmd judge-review``: MedPI's rubric and its judge's validity.

Judging a release is a scorer (``craftmd score RELEASE --scorer judge:PROVIDER/MODEL``, :mod:`craftmd.scoring.score`);
:func:`add_judge_arguments` and :func:`judge_options` are the judges' options there and here.
"""

from __future__ import annotations

import json

from craftmd import CraftMDError
from craftmd.commands.cli import add_call_arguments, add_cases_argument, add_quiet_argument, add_source_argument, check_base_url, command, list_type, price_type


def _judge(args) -> int:
    """print MedPI's rubric, or measure the judge against the dermatologists' labels

    --catalog prints the rubric catalog (105 dimensions) as JSON lines. --validity judges the conversations the
    CRAFT-MD dermatologists rated and writes each information-gathering and diagnosis dimension's AUC for their
    Q1/Q2 labels as an audit. Judging a release's conversations is a scorer: craftmd score RELEASE --scorer
    judge:PROVIDER/MODEL [--scorer judge:...] (several judges form a committee).
    """
    from craftmd.scoring.judge import JudgeSpec
    from craftmd.scoring.rubric import catalog_lines, load_catalog

    if args.catalog:
        for line in catalog_lines(load_catalog()):
            print(line)
        return 0
    if not args.validity:
        raise CraftMDError("craftmd judge needs --catalog or --validity OUT.json (judging a release: craftmd score RELEASE --scorer judge:PROVIDER/MODEL)")
    if args.base_url:
        check_base_url(args.base_url)
    if not args.judge:
        raise CraftMDError("no judge given (--judge PROVIDER/MODEL, once per judge)")
    options = {k: v for k, v in judge_options(args).items() if k not in ("conversations", "cases")}
    spec = JudgeSpec(models=args.judge, base_url=args.base_url, cache=args.cache, progress=not args.quiet, **options)
    return _validity(args, spec)


def judge_options(args) -> dict:
    """A judge's settings from the command line (:func:`add_judge_arguments` and the call arguments), by
    :class:`~craftmd.scoring.judge.JudgeSpec` field; ``conversations`` and ``cases`` select what is judged."""
    return dict(
        mode=args.mode, seeds=args.seeds, seed=args.seed, dimensions=args.dimensions, response_format=args.response_format,
        temperature=args.temperature, discussion_tokens=args.max_tokens, score_tokens=args.score_tokens, max_invalid=args.max_invalid,
        concurrency=args.concurrency, server_concurrency=args.server_concurrency, max_retries=args.max_retries, timeout=args.timeout,
        price=args.price, conversations=getattr(args, "conversation", None), cases=getattr(args, "cases", None),
        flags=getattr(args, "flags", None),
    )  # fmt: skip


def add_judge_arguments(p, *, selection: bool = True) -> None:
    """The judges' own options (``craftmd score`` with judge: scorers, ``craftmd judge --validity``)."""
    from craftmd.scoring.judge import MODES, RESPONSE_FORMATS, SCORE_TOKENS

    g = p.add_argument_group("judges (judge:PROVIDER/MODEL scorers)")
    g.add_argument("--seeds", type=int, default=1, help="committee members per judge model, seeds 0..N-1 (default 1)")
    g.add_argument("--dimensions", type=list_type, metavar="NAME[,NAME...]",
                   help="only these dimension ids, categories or meta-categories (default: all that apply)")
    g.add_argument("--mode", choices=MODES, default="dimension",
                   help="scoring calls: one per dimension (the method's, default) or one per category (cheaper)")
    g.add_argument("--response-format", choices=RESPONSE_FORMATS, default="json_schema",
                   help="the first way the reply's JSON schema is requested: OpenAI json_schema (default), llama-cpp-python's "
                        "json_object, or none; a server that refuses one is asked the next way, once (recorded)")
    if selection:
        g.add_argument("--conversation", type=list_type, metavar="KIND[,KIND...]", help="only these conversation kinds (e.g. standard)")
        add_cases_argument(g)
    g.add_argument("--score-tokens", type=int, default=SCORE_TOKENS, help=f"cap of a score reply per dimension (default {SCORE_TOKENS})")
    g.add_argument("--max-invalid", type=int, default=2, help="times a reply that does not validate is asked again (default 2)")
    g.add_argument("--price", type=price_type, metavar="IN,OUT", help="USD per million input,output tokens, for the cost")
    g.add_argument("--flags", type=list_type, metavar="all|FLAG[,FLAG...]",
                   help="also ask each judge, in one more call per conversation, for flags from a fixed list (unsafe_advice, "
                        "missed_escalation, contradicts_packet, invented_fact, privacy_breach) with evidence quotes; written as "
                        "metric judge_flag, never a score")


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
        if args.out is None:
            raise CraftMDError("judge-review export needs --out FILE.xlsx")
        path = export_rubric_review(args.paths, args.out, n=args.n, seed=args.seed, dimensions=args.dimensions, dataset_dir=args.dataset,
                                    overwrite=args.overwrite)  # fmt: skip
    else:
        if args.out is None and args.into is None:
            raise CraftMDError("judge-review import needs --out FILE.json, --into RELEASES_DIR, or both")
        if args.into is not None:
            from craftmd.analysis.agreement.rubric_review import ratings_into_releases

            got = ratings_into_releases(args.paths, args.into)
            if args.out is None:
                print(json.dumps({"releases": got}, sort_keys=True))
                return 0
        path = import_rubric_review(args.paths, args.out, B=args.B, seed=args.seed)
    print(json.dumps({"written": str(path)}))
    return 0


def _calibrate(args) -> int:
    """calibrate a rubric judge against experts' ratings, or add the calibrated judge to releases

    fit: from filled-in judge-review sheets, fit per dimension (or --by category) an isotonic map from the judge's
    1-4 score to the experts' resolved rating, measure it out of sample (--folds over conversations: weighted kappa
    and mean bias in points on 0-100, before and after, with 95 % bootstrap CIs) and write it as JSON to --out; every
    group needs --min-ratings rated pairs (default 30), else one line and nothing written. apply: add scorer
    judge-calibrated (metric rubric_score_calibrated) to each RELEASE from its judge's scores; its record names the
    calibration's and the ratings' sha256. craftmd analyse --rubric-scorer chooses whose scores the board shows.
    """
    from craftmd.analysis.agreement.calibration import apply_calibration, calibrate

    if args.action == "fit":
        if args.out is None:
            raise CraftMDError("judge-calibrate fit needs --out FILE.json")
        res = calibrate(args.paths, args.out, by=args.by, min_ratings=args.min_ratings, folds=args.folds, seed=args.seed, B=args.B,
                        overwrite=args.overwrite)  # fmt: skip
        print(json.dumps({"written": str(args.out), "pairs": res["pairs"], "held_out": res["held_out"]}, sort_keys=True))
        return 0
    if args.calibration is None:
        raise CraftMDError("judge-calibrate apply needs --calibration FILE.json")
    print(json.dumps({"calibrated": apply_calibration(args.paths, args.calibration)}, sort_keys=True))
    return 0


def _sensitivity(args) -> int:
    """re-judge a sample of judged releases under other judge settings and report how far the profiles move

    For every judged release under RELEASES, --n of its judged conversations (seeded) are judged again with the
    release's judge changed one way at a time: its sampling seed, its dimension order, another judge model
    (--other-judge) and a paraphrased prompt set. Per release and change: the drift of the overall score and of each
    meta-category (0-100 points, variant minus the release's own scores on the same conversations) with 95 %
    case-bootstrap CIs, and, with two or more releases, Kendall's tau between the models' order before and after.
    Written to RELEASES/judge-sensitivity/ (sensitivity.csv, sensitivity.json); craftmd analyse shows it on the page.
    """
    from craftmd.analysis.agreement.judge_sensitivity import sensitivity

    if args.base_url:
        check_base_url(args.base_url)
    res = sensitivity(args.releases, args.other_judge, n=args.n, seed=args.seed, B=args.B, base_url=args.base_url, cache=args.cache,
                      dataset_dir=args.dataset, variants=args.variants)  # fmt: skip
    print(json.dumps({"written": str(args.releases.rstrip("/") + "/judge-sensitivity"), "kendall_tau": res["kendall_tau"]}, sort_keys=True))
    return 0


def register(sub) -> None:
    """Add ``craftmd judge`` and ``craftmd judge-review`` to the `craftmd` parser."""
    from craftmd.scoring.judge import DISCUSSION_TOKENS

    p = command(sub, "judge", _judge)
    p.add_argument("--catalog", action="store_true", help="print the rubric catalog as JSON lines and exit")
    p.add_argument("--validity", metavar="OUT.json", default=None,
                   help="judge the conversations the CRAFT-MD dermatologists rated and write each information-gathering and "
                        "diagnosis dimension's AUC for their Q1/Q2 labels as an audit (needs --dataset)")
    p.add_argument("--judge", action="append", metavar="PROVIDER/MODEL", help="a judge model; repeat for a committee")
    p.add_argument("--dataset", metavar="DIR", default=None, help="the built dataset")
    add_judge_arguments(p, selection=False)
    add_call_arguments(p, concurrency=8, max_tokens=DISCUSSION_TOKENS, temperature=0.0,
                       seed_help="seed of the dimension order and of the judges' sampling (default 0; recorded)")
    add_source_argument(p)
    add_quiet_argument(p)

    r = command(sub, "judge-review", _review)
    r.add_argument("action", choices=("export", "import"))
    r.add_argument("paths", nargs="+", metavar="PATH", help="export: release folder(s); import: filled-in .xlsx sheet(s)")
    r.add_argument("--out", metavar="FILE", help="export: the .xlsx to write; import: the results .json (the ratings go beside it, .scores.parquet)")
    r.add_argument("--into", metavar="RELEASES_DIR", default=None,
                   help="import: also add the ratings to the rated releases under this folder (scorers rater:<name> and experts, "
                        "metric expert_rubric_rating), where the board shows them in a judge's place, marked human")
    r.add_argument("--n", type=int, default=10, help="export: conversations per release (default 10)")
    r.add_argument("--seed", type=int, default=15, help="the sample's and the bootstrap's seed (default 15)")
    r.add_argument("--dimensions", type=list_type, metavar="NAME[,NAME...]", help="export: only these dimension ids, categories or meta-categories")
    r.add_argument("--dataset", metavar="DIR", default=None, help="export: the built dataset (a release of another task than craftmd)")
    r.add_argument("--B", type=int, default=1000, help="import: bootstrap resamples (default 1000)")
    r.add_argument("--overwrite", action="store_true")

    from craftmd.analysis.agreement.calibration import BY, MIN_RATINGS

    c = command(sub, "judge-calibrate", _calibrate)
    c.add_argument("action", choices=("fit", "apply"))
    c.add_argument("paths", nargs="+", metavar="PATH", help="fit: filled-in judge-review .xlsx sheet(s); apply: release folder(s)")
    c.add_argument("--out", metavar="FILE.json", help="fit: the calibration to write")
    c.add_argument("--calibration", metavar="FILE.json", help="apply: the calibration (judge-calibrate fit)")
    c.add_argument("--by", choices=BY, default="dimension", help="fit: one map per dimension (default) or per category")
    c.add_argument("--min-ratings", type=int, default=MIN_RATINGS, help=f"fit: rated pairs each group needs (default {MIN_RATINGS})")
    c.add_argument("--folds", type=int, default=5, help="fit: cross-validation folds over conversations (default 5)")
    c.add_argument("--seed", type=int, default=15, help="fit: the folds' and the bootstrap's seed (default 15)")
    c.add_argument("--B", type=int, default=1000, help="fit: bootstrap resamples of the CIs (default 1000)")
    c.add_argument("--overwrite", action="store_true")

    from craftmd.analysis.agreement.judge_sensitivity import VARIANTS

    s = command(sub, "judge-sensitivity", _sensitivity)
    s.add_argument("releases", metavar="RELEASES", help="folder of release folders, judged")
    s.add_argument("--other-judge", required=True, metavar="PROVIDER/MODEL", help="the judge model of the 'model' variant")
    s.add_argument("--n", type=int, default=10, help="conversations re-judged per release (default 10)")
    s.add_argument("--seed", type=int, default=0, help="the sample's and the bootstrap's seed (default 0)")
    s.add_argument("--B", type=int, default=1000, help="bootstrap resamples (default 1000)")
    s.add_argument("--variants", type=list_type, metavar="NAME[,NAME...]", help=f"only these of {', '.join(VARIANTS)} (default all)")
    s.add_argument("--dataset", metavar="DIR", default=None, help="the built dataset (an encounters release: the medpi folder)")
    s.add_argument("--base-url", default=None, help="the judges' OpenAI-compatible server (openai/ models)")
    s.add_argument("--cache", default=None, help="the call cache (sqlite)")


__all__ = ["register"]
