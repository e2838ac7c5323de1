"""``craftmd judge --catalog|--validity``: MedPI's rubric, and its judge measured against the dermatologists.

Judging a release is a scorer (``craftmd score RELEASE --scorer judge:PROVIDER/MODEL``, :mod:`craftmd.commands.score`);
:func:`add_judge_arguments` and :func:`judge_options` are the judges' options there and here.
"""

from __future__ import annotations

import json

from craftmd import CraftMDError
from craftmd.commands.cli import (
    add_call_arguments,
    add_cases_argument,
    add_list_argument,
    add_quiet_argument,
    add_source_argument,
    check_base_url,
    command,
    count_type,
    positive_int,
    price_type,
)
from craftmd.commands.serving import add_serve_arguments


def _judge(args) -> int:
    """print MedPI's rubric, or measure the judge against the dermatologists' labels

    --catalog prints the rubric catalog (105 dimensions, each with its ACGME core competency) as JSON lines. --validity judges the conversations the
    CRAFT-MD dermatologists rated and writes each information-gathering and diagnosis dimension's AUC for their
    Q1/Q2 labels as an audit. Judging a release's conversations is a scorer: craftmd score RELEASE --scorer
    judge:PROVIDER/MODEL [--scorer judge:...] (several judges form a committee).
    """
    from craftmd.commands.serving import concurrency, logs_folder, numbered, plan, serving
    from craftmd.scoring.judge import JudgeSpec
    from craftmd.scoring.rubric import catalog_lines, load_catalog

    if args.catalog:
        for line in catalog_lines(load_catalog()):
            print(line)
        return 0
    if not args.validity:
        raise CraftMDError(
            "craftmd judge needs --catalog or --validity OUT.json (judging a release: craftmd score RELEASE --scorer judge:PROVIDER/MODEL)"
        )
    if args.base_url:
        check_base_url(args.base_url)
    if not args.judge:
        raise CraftMDError("no judge given (--judge PROVIDER/MODEL, once per judge)")
    if args.dataset is None:
        raise CraftMDError("--validity needs --dataset (the built dataset)")
    roles = dict(zip(numbered(args.judge, "judge"), args.judge))
    served, called = plan(args, roles, logs_folder(args.validity, "judge"))
    args.server_concurrency = concurrency(served, args.server_concurrency)
    options = {k: v for k, v in judge_options(args).items() if k not in ("conversations", "cases")}
    spec = JudgeSpec(models=list(called.values()), base_url=args.base_url, cache=args.cache, progress=not args.quiet, **options)
    with serving(served):
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
    g.add_argument("--seeds", type=positive_int, default=1, help="committee members per judge model, seeds 0..N-1 (default 1)")
    add_list_argument(
        g, "--dimensions", "NAME[,NAME...]", "only these dimension ids, categories or meta-categories (default: all that apply)"
    )
    g.add_argument(
        "--mode",
        choices=MODES,
        default="dimension",
        help="scoring calls: one per dimension (the method's, default) or one per category (cheaper)",
    )
    g.add_argument(
        "--response-format",
        choices=RESPONSE_FORMATS,
        default="json_schema",
        help="the first way the reply's JSON schema is requested: OpenAI json_schema (default), llama-cpp-python's "
        "json_object, or none; a server that refuses one is asked the next way, once (recorded)",
    )
    if selection:
        add_list_argument(g, "--conversation", "KIND[,KIND...]", "only these conversation kinds (e.g. standard)")
        add_cases_argument(g)
    g.add_argument(
        "--score-tokens",
        type=positive_int,
        default=SCORE_TOKENS,
        help=f"cap of a score reply per dimension (default {SCORE_TOKENS})",
    )
    g.add_argument(
        "--max-invalid", type=count_type, default=2, help="times a reply that does not validate is asked again (default 2)"
    )
    g.add_argument("--price", type=price_type, metavar="IN,OUT", help="USD per million input,output tokens, for the cost")
    add_list_argument(
        g,
        "--flags",
        "all|FLAG[,FLAG...]",
        "also ask each judge, in one more call per conversation, for flags from a fixed list (unsafe_advice, "
        "missed_escalation, contradicts_packet, invented_fact, privacy_breach) with evidence quotes; written as "
        "metric judge_flag, never a score",
    )


def _validity(args, spec) -> int:
    """The judge against the dermatologists' Q1/Q2 labels, written as an audit (JSON) to --validity."""
    from craftmd.atomic import atomic_write_json
    from craftmd.analysis.agreement.judge_validity import judge_validity, judge_validity_audit
    from craftmd.source import Source, default_location

    res = judge_validity(args.dataset, Source(args.source or default_location()), spec)
    atomic_write_json(args.validity, judge_validity_audit(res))
    print(json.dumps({k: res[k] for k in ("conversations", "judges", "scorer", "requests", "sent", "failures")}, sort_keys=True))
    return 0


def register(sub) -> None:
    """Add ``craftmd judge`` to the `craftmd` parser."""
    from craftmd.scoring.judge import DISCUSSION_TOKENS

    p = command(sub, "judge", _judge)
    p.add_argument(
        "--catalog",
        action="store_true",
        help="print the rubric catalog as JSON lines (each dimension with its ACGME core competency) and exit",
    )
    p.add_argument(
        "--validity",
        metavar="OUT.json",
        default=None,
        help="judge the conversations the CRAFT-MD dermatologists rated and write each information-gathering and "
        "diagnosis dimension's AUC for their Q1/Q2 labels as an audit (needs --dataset)",
    )
    p.add_argument("--judge", action="append", metavar="PROVIDER/MODEL", help="a judge model; repeat for a committee")
    p.add_argument("--dataset", metavar="DIR", default=None, help="the built dataset")
    add_judge_arguments(p, selection=False)
    add_serve_arguments(p, "judge (the first --judge; judge-2, ... for the others)", "OUT.json.judge-servers/")
    add_call_arguments(
        p,
        concurrency=8,
        max_tokens=DISCUSSION_TOKENS,
        temperature=0.0,
        seed_help="seed of the dimension order and of the judges' sampling (default 0; recorded)",
    )
    add_source_argument(p)
    add_quiet_argument(p)


__all__ = ["register", "add_judge_arguments", "judge_options"]
