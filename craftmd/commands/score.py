"""``craftmd score RELEASE… [--scorer NAME…]``: run any scorer on releases, only what is stale.

Every kind of score goes through here: an answer's grade (``paper``, ``strict``, ``offline``, ``llm:PROVIDER/MODEL``),
a conversation's measures (``history``, ``keyinfo``, ``judge:PROVIDER/MODEL``) and a case's (``meld``), each a scorer
of the one registry (:mod:`craftmd.scoring.scorers`), run by :func:`craftmd.scoring.score.score_release`, the one
writer of a release's scores. ``craftmd score --list`` lists every registered scorer.
"""

from __future__ import annotations

import json
import sys

from craftmd import CraftMDError
from craftmd.commands.cli import (
    add_call_arguments,
    add_dataset_argument,
    add_quiet_argument,
    check_base_url,
    command,
    dominant_reason,
    keywords,
    positive_int,
)
from craftmd.commands.judge import add_judge_arguments, judge_options
from craftmd.commands.serving import add_serve_arguments
from craftmd.scoring.score import claim_lines


def _print_listing() -> None:
    """``craftmd score --list``: every registered scorer, what it applies to and what it writes."""
    from craftmd.scoring.scorers import listing

    for r in listing():
        applies = (
            ("tasks " + ",".join(r["tasks"]) if r["tasks"] != "any" else "any task")
            + (f" posing {','.join(r['datasets'])}" if r["datasets"] != "any" else "")
            + (f"; formats {','.join(r['formats'])}" if r["formats"] else "")
        )
        model = "; calls a model" if r["calls_model"] else ""
        m = r["metrics"]
        writes = ", ".join(m) if len(m) <= 4 else f"{', '.join(m[:3])}, … ({len(m)} metrics)"
        print(f"{r['scorer']:22s} {r['unit']:12s} {applies}{model}\n{'':35s} writes {writes}: {r['about']}")


def _score(args) -> int:
    """run scorers on releases: MCQ rules, FRQ graders, history metrics, key-value metrics, judges, MELD

    Add each scorer's rows to RELEASE/scores.parquet (written atomically; conversations, answers and the run
    record are never rewritten), only for the scorers whose scores are stale: never made, or made by another
    version, rules, model or settings, or from other answers, conversations or dataset files, or with failed
    calls a re-run would ask again (--force runs them anyway; the request cache still answers). Without
    --scorer a release gets its task's default scorers. Judges named together form one committee
    (judge-committee, their median). A failed grader or judge call scores nothing (status error, with its
    reason) and is never a verdict. --list prints every registered scorer and what it writes.
    """
    from craftmd.commands.serving import concurrency, logs_folder, served_scorers, serving
    from craftmd.scoring.scorers import check_scorers

    if args.list:
        _print_listing()
        return 0
    if not args.release:
        raise CraftMDError("no release given (craftmd score RELEASE [--scorer NAME ...]; --list shows the scorers)")
    if args.base_url:
        check_base_url(args.base_url)
    served, args.scorer = served_scorers(args, args.scorer, logs_folder(args.release[0], "score"))
    if args.scorer:
        check_scorers(args.scorer)
    args.server_concurrency = concurrency(served, args.server_concurrency)
    with serving(None if args.estimate else served):  # an estimate sends nothing: no server to start
        return _run(args)


def _run(args) -> int:
    """Score every release given (its servers, if any, running) and report."""
    from craftmd.scoring.score import score_release

    options = dict(
        judge_options(args),
        workers=args.workers,
        max_tokens=args.max_tokens,
        grader_prompts=args.grader_prompts,
        meld_prompts=args.meld_prompts,
    )
    given = keywords(args, "force", "estimate", "base_url", "cache", "allow_self")
    reports = [
        score_release(release, args.dataset, args.scorer, progress=not args.quiet, options=options, **given)
        for release in args.release
    ]
    if args.scorer:
        nowhere = [n for n in dict.fromkeys(reports[0]["skipped"]) if all(n in r["skipped"] for r in reports)]
        if nowhere:
            raise CraftMDError(f"scorer {nowhere[0]} applies to none of the releases given: {reports[0]['skipped'][nowhere[0]]}")
    for r in reports:
        for line in claim_lines(r):
            print(line, file=sys.stderr)
        if r["current"]:
            print(f"{r['release']}: {', '.join(r['current'])} current, nothing to do (--force scores again)", file=sys.stderr)
        if args.estimate:
            print(estimate_text(r))
        else:
            print(json.dumps(r, sort_keys=True))
    if not args.estimate:
        check_outcomes(reports)
    return 0


def estimate_text(report: dict) -> str:
    """``craftmd score --estimate``'s table for one release, in the layout of ``craftmd generate --estimate``: per scorer,
    its model, the calls (expected, and at most: every reply that does not validate asked again), the tokens and the cost."""
    ests = report.get("estimates") or {}
    lines = [
        f"estimate     {report['release']}: nothing was sent. Rough: 4 characters a token; calls at most: every score reply "
        "that does not validate asked again (--max-invalid), replies at their cap",
        "scorer                         model                              calls (at most)          tokens in   tokens out (at most)    cost (at most)",
    ]
    for name, e in ests.items():
        if not e:
            lines.append(f"{name:<30} {'':<34} {'sends nothing to estimate' if not _calls_model(name) else 'no estimate':>26}")
            continue
        model = ", ".join(e.get("models") or []) or name.split(":", 1)[-1]
        cost = e.get("cost_usd_at_most")
        money = f"${cost:,.2f}" if cost is not None else "-"
        lines.append(
            f"{name:<30} {model:<34} {e['calls']:>8,} ({e.get('calls_at_most', e['calls']):>9,})  {e['tokens_in']:>14,}  "
            f"{e['tokens_out_at_most']:>14,}          {money}"
        )
        lines.append(
            f"{'':<30} {e['conversations']} conversations ({e['failed_conversations']} failed, not judged), {e['judges']} "
            f"judge(s), mode {e['mode']}, {e['dimension_scores']} dimension scores"
        )
        if e.get("refused"):
            lines.append(f"{'':<30} a run would be refused: {e['refused']}")
    if not ests:
        lines.append("nothing to estimate: every scorer given is current or does not apply")
    if ests and not any((e or {}).get("cost_usd_at_most") is not None for e in ests.values()):
        lines.append("cost         give --price IN,OUT in USD per million tokens for the cost")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"skipped      {name}: {why}")
    return "\n".join(lines)


def _calls_model(name: str) -> bool:
    from craftmd.scoring.scorers import scorers

    return any(s.calls_model for s in scorers([name]))


def check_outcomes(reports: list[dict]) -> None:
    """Say how much of each scorer that ran failed (stderr); a scorer that produced no score at all is one line and a
    non-zero exit (:class:`CraftMDError`), after every release's scores (with their failures) are written."""
    from craftmd.scoring.score import outcomes

    empty = []
    for r in reports:
        for name, o in outcomes(r["release"], [w for ws in r.get("writes", {}).values() for w in ws]).items():
            if not o["failed"]:
                continue
            print(
                f"{r['release']}: {name}: {o['scored']} scored, {o['failed']} failed (mostly {dominant_reason(o['reasons'])})",
                file=sys.stderr,
            )
            if not o["scored"] or o.get("answered") == 0:  # a grader's answers that need no call are no success
                empty.append((r["release"], name, o))
    if empty:
        release, name, o = empty[0]
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        what = (
            f"all {o['failed']} scores failed"
            if not o["scored"]
            else f"the model answered none of the {o['failed']} answers it was asked about"
        )
        raise CraftMDError(
            f"nothing scored: {name} on {release}: {what}{more}, mostly "
            f"{dominant_reason(o['reasons'])}; the failures are written with their reasons"
        )


def register(sub) -> None:
    """Add ``craftmd score`` to the `craftmd` parser."""
    from craftmd.scoring.judge import DISCUSSION_TOKENS
    from craftmd.scoring.llm_grader import PROMPT_SET, PROMPT_SETS
    from craftmd.scoring.meld import PROMPT_SET as MELD_PROMPT_SET
    from craftmd.scoring.meld import PROMPT_SETS as MELD_PROMPT_SETS

    p = command(sub, "score", _score)
    p.add_argument("release", nargs="*", metavar="RELEASE", help="release folder(s)")
    p.add_argument(
        "--scorer",
        action="append",
        metavar="NAME",
        help="a scorer (repeatable): paper, strict, offline, llm:PROVIDER/MODEL, history, keyinfo, judge:PROVIDER/MODEL, "
        "meld, or a task's own (default: the release's task's scorers; --list shows them all)",
    )
    p.add_argument("--list", action="store_true", help="list every registered scorer: what it applies to and what it writes")
    add_dataset_argument(p, required=False, help="the built dataset folder (answer keys, references, objectives)")
    p.add_argument("--force", action="store_true", help="run the scorers even where their scores are current")
    p.add_argument(
        "--allow-self",
        action="store_true",
        help="let an LLM grader or judge score its own model (recorded; the page never ranks by it)",
    )
    p.add_argument(
        "--estimate",
        action="store_true",
        help="print the calls (expected and at most), tokens and cost the judges would need, as a table, and send nothing "
        "(a judge a run would refuse, such as one of the doctor's own family, is estimated and the refusal named)",
    )
    p.add_argument(
        "--grader-prompts",
        choices=PROMPT_SETS,
        default=PROMPT_SET,
        help=f"the llm: graders' prompt set (default {PROMPT_SET}: upstream's two requests, read from the pinned code, "
        "as the recorded upstream-gpt4 labels were made; grader-v1: the package's own wording)",
    )
    p.add_argument(
        "--meld-prompts",
        choices=MELD_PROMPT_SETS,
        default=MELD_PROMPT_SET,
        help=f"the meld scorer's prompt set (default {MELD_PROMPT_SET}: upstream's, read from the pinned code; meld-v1: "
        "the package's file)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=None, help="worker processes of the history metrics (default: up to 2)"
    )
    add_judge_arguments(p)
    add_serve_arguments(
        p,
        "grader (an llm: scorer's model), judge (a judge: scorer's; grader-2, judge-2, ... for more)",
        "RELEASE.score-servers/ beside the first release",
    )
    add_call_arguments(
        p,
        concurrency=8,
        max_tokens=DISCUSSION_TOKENS,
        temperature=0.0,
        seed_help="judges: the seed of the dimension order and of their sampling; meld: the sampling seed (default 0; recorded)",
    )
    add_quiet_argument(p)


__all__ = ["register", "estimate_text", "check_outcomes"]
