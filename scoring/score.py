"""``craftmd score RELEASE… [--scorer NAME…]``: run any scorer on releases, only what is stale.

Every kind of score goes through here: an answer's grade (``paper``, ``strict``, ``offline``,
``llm:PROVIDER/MODEL``), a conversation's measures (``history``, ``keyinfo``, ``judge:PROVIDER/MODEL``)
and a case's (``meld``), each a :class:`~craftmd.scoring.scorers.Scorer` of the one registry.
Without ``--scorer`` a release gets its task's default scorers (:attr:`craftmd.tasks.Task.scorers`).
A scorer whose record in the release is current (same identity, same inputs, no failed call
to ask again: :meth:`~craftmd.scoring.scorers.Scorer.current`) is not run again unless
``force``; a scorer that does not apply to a release (another task, no conversations) is
skipped with the reason. Each scorer's rows and record are added to the release's
``scores.parquet`` (:func:`craftmd.release.write_scores`, atomic); conversations, answers and the
run record are never rewritten. ``craftmd score --list`` lists every registered scorer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from craftmd import CraftMDError
from craftmd.commands.cli import add_call_arguments, add_dataset_argument, add_quiet_argument, command
from craftmd.release import Release, read_release, write_scores
from craftmd.scoring.scorers import Context, scorers


def default_scorers(release: Release) -> list[str]:
    """The scorers ``release``'s task runs by default."""
    return list(release.task.scorers)


def context(dataset_dir: Path | str | None, **settings) -> Context:
    return Context(None if dataset_dir is None else Path(dataset_dir), **settings)


def stale(release_dir: Path | str, dataset_dir: Path | str | None, names: list[str], **settings) -> list[str]:
    """Those of ``names`` that apply to the release and whose scores are not current (judges: one committee)."""
    rel = read_release(release_dir)
    ctx = context(dataset_dir, **settings)
    return [s.name for s in scorers(names) if s.applies(rel) is None and not s.current(rel, ctx)]


def score_release(release_dir: Path | str, dataset_dir: Path | str | None, names: list[str] | None = None, *, force: bool = False,
                  estimate: bool = False, **settings) -> dict:
    """Run ``names`` (default: the task's scorers) on a release, those that are stale (all with ``force``).

    ``settings`` go to the :class:`~craftmd.scoring.scorers.Context` (base_url, cache, progress,
    allow_self, options). With ``estimate``, scorers that call models report what they would send
    and nothing is written. Returns what was done: ``scored``, ``current``, ``skipped`` (with the
    reason), ``estimates`` and the judges' ``summaries``.
    """
    rel = read_release(release_dir)
    ctx = context(dataset_dir, **settings)
    report: dict = {"release": str(release_dir), "scored": [], "current": [], "skipped": {}}
    names = names or default_scorers(rel)
    todo = []
    for s in scorers(names) if names else []:  # a task with no default scorers (encounters: judges cost money)
        why = s.applies(rel)
        if why:
            report["skipped"][s.name] = why
        elif not force and s.current(rel, ctx):
            report["current"].append(s.name)
        else:
            todo.append(s)
    refused = {}
    for s in todo:  # refusals (a grader or judge of the release's own model) before anything is written
        try:
            s.check(rel, ctx)
        except CraftMDError as exc:
            if not estimate:
                raise
            refused[s.name] = str(exc)  # an estimate sends nothing: it says what a run would refuse
    for s in todo:
        if estimate:
            est = s.estimate(rel, ctx)
            if s.name in refused:
                est = dict(est or {}, refused=refused[s.name])
            report.setdefault("estimates", {})[s.name] = est
            continue
        table, records = s.run(rel, ctx)
        if records:
            for name, found in check_claims(rel, table, records).items():
                records[name] = dict(records[name], claims=found)
                report.setdefault("claims", {})[name] = found
            write_scores(rel, table, records)
        rel._scores_cache = None  # a scorer that writes its own scores (the judges) leaves the cache behind
        report["scored"].append(s.name)
        report.setdefault("writes", {})[s.name] = list(s.writes())
        if getattr(s, "summary", None):
            report.setdefault("summaries", {})[s.name] = s.summary
    return report


def check_claims(release: Release, table, records: dict) -> dict[str, dict]:
    """The release's claims (scorer ``claimed:<name>``: scores an ingested log reported) checked against the scores
    ``table`` just computed: for each scorer name of ``records`` that has claims, how many there are (``checked``) and how
    many ``disagree`` (another value or status than the score computed, or no such score computed)."""
    import polars as pl

    from craftmd.release import CLAIM_PREFIX

    old, _ = release.scores_with_records()
    if old is None or table is None:
        return {}
    claims = pl.from_arrow(old).filter(pl.col("scorer").str.starts_with(CLAIM_PREFIX))
    if claims.is_empty():
        return {}
    new = pl.from_arrow(table)
    out = {}
    for name in records:
        claimed = claims.filter(pl.col("scorer") == CLAIM_PREFIX + name)
        if claimed.is_empty():
            continue
        keys = [c for c in new.columns if c in claimed.columns and c not in ("scorer", "value", "label", "detail", "status")]
        mine = new.filter(pl.col("scorer") == name).select(*keys, "value", "status").unique(keys, keep="first")
        both = claimed.select(*keys, "value", "status").join(mine, on=keys, how="left", nulls_equal=True, suffix="_now")
        differ = (pl.col("status_now").is_null() | (pl.col("status") != pl.col("status_now"))
                  | ((pl.col("value") - pl.col("value_now")).abs() > 1e-9).fill_null(False))
        out[name] = {"as": CLAIM_PREFIX + name, "checked": both.height, "disagree": both.filter(differ).height}
    return out


def claim_lines(report: dict) -> list[str]:
    """One line for each scorer of a :func:`score_release` report whose scores disagree with what the release claimed."""
    return [f"{report['release']}: {c['disagree']} of its {c['checked']} claimed {name} scores ({c['as']}, reported by an ingested log) "
            f"disagree with {name}'s, computed now; the claims are kept apart and never ranked"
            for name, c in sorted(report.get("claims", {}).items()) if c["disagree"]]


# -- the command -------------------------------------------------------------------------------------


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
    from craftmd.scoring.judge_cli import judge_options
    from craftmd.scoring.scorers import check_scorers, listing

    if args.list:
        for r in listing():
            applies = ("tasks " + ",".join(r["tasks"]) if r["tasks"] != "any" else "any task") + (
                f"; formats {','.join(r['formats'])}" if r["formats"] else "")
            model = "; calls a model" if r["calls_model"] else ""
            m = r["metrics"]
            writes = ", ".join(m) if len(m) <= 4 else f"{', '.join(m[:3])}, … ({len(m)} metrics)"
            print(f"{r['scorer']:22s} {r['unit']:12s} {applies}{model}\n{'':35s} writes {writes}: {r['about']}")
        return 0
    if not args.release:
        raise CraftMDError("no release given (craftmd score RELEASE [--scorer NAME ...]; --list shows the scorers)")
    if args.base_url:
        from craftmd.commands.cli import check_base_url

        check_base_url(args.base_url)
    if args.scorer:
        check_scorers(args.scorer)
    options = dict(judge_options(args), workers=args.workers, max_tokens=args.max_tokens)
    reports = []
    for release in args.release:
        reports.append(score_release(release, args.dataset, args.scorer, force=args.force, estimate=args.estimate, base_url=args.base_url,
                                     cache=args.cache, progress=not args.quiet, allow_self=args.allow_self, options=options))
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
    lines = [f"estimate     {report['release']}: nothing was sent. Rough: 4 characters a token; calls at most: every score reply "
             "that does not validate asked again (--max-invalid), replies at their cap",
             "scorer                         model                              calls (at most)          tokens in   tokens out (at most)    cost (at most)"]
    for name, e in ests.items():
        if not e:
            lines.append(f"{name:<30} {'':<34} {'sends nothing to estimate' if not _calls_model(name) else 'no estimate':>26}")
            continue
        model = ", ".join(e.get("models") or []) or name.split(":", 1)[-1]
        cost = e.get("cost_usd_at_most")
        money = f"${cost:,.2f}" if cost is not None else "-"
        lines.append(f"{name:<30} {model:<34} {e['calls']:>8,} ({e.get('calls_at_most', e['calls']):>9,})  {e['tokens_in']:>14,}  "
                     f"{e['tokens_out_at_most']:>14,}          {money}")
        lines.append(f"{'':<30} {e['conversations']} conversations ({e['failed_conversations']} failed, not judged), {e['judges']} "
                     f"judge(s), mode {e['mode']}, {e['dimension_scores']} dimension scores")
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
    return any(s.calls_model for s in scorers([name]))


def outcomes(release_dir: Path | str, written: list[str]) -> dict[str, dict]:
    """Per scorer name among ``written`` (as the scores table has them): ``scored`` (status ok), ``failed`` (status
    error) and ``reasons`` (each failure's reason, counted)."""
    import polars as pl

    path = Path(release_dir) / "scores.parquet"
    if not written or not path.exists():
        return {}
    df = pl.read_parquet(path, columns=["scorer", "status", "detail"]).filter(pl.col("scorer").is_in(written))
    out: dict[str, dict] = {}
    for row in df.iter_rows(named=True):
        o = out.setdefault(row["scorer"], {"scored": 0, "failed": 0, "reasons": {}})
        if row["status"] == "ok":
            o["scored"] += 1
            continue
        o["failed"] += 1
        try:
            reason = json.loads(row["detail"] or "{}").get("error")
        except (ValueError, AttributeError):
            reason = row["detail"]
        reason = str(reason or "no reason given")[:200]
        o["reasons"][reason] = o["reasons"].get(reason, 0) + 1
    return out


def check_outcomes(reports: list[dict]) -> None:
    """Say how much of each scorer that ran failed (stderr); a scorer that produced no score at all is one line and a
    non-zero exit (:class:`CraftMDError`), after every release's scores (with their failures) are written."""
    from craftmd.commands.cli import dominant_reason

    empty = []
    for r in reports:
        for name, o in outcomes(r["release"], [w for ws in r.get("writes", {}).values() for w in ws]).items():
            if not o["failed"]:
                continue
            print(f"{r['release']}: {name}: {o['scored']} scored, {o['failed']} failed (mostly {dominant_reason(o['reasons'])})",
                  file=sys.stderr)
            if not o["scored"]:
                empty.append((r["release"], name, o))
    if empty:
        release, name, o = empty[0]
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise CraftMDError(f"nothing scored: {name} on {release}: all {o['failed']} scores failed{more}, mostly "
                           f"{dominant_reason(o['reasons'])}; the failures are written with their reasons")


def register(sub) -> None:
    """Add ``craftmd score`` to the `craftmd` parser."""
    from craftmd.scoring.judge import DISCUSSION_TOKENS
    from craftmd.scoring.judge_cli import add_judge_arguments

    p = command(sub, "score", _score)
    p.add_argument("release", nargs="*", metavar="RELEASE", help="release folder(s)")
    p.add_argument("--scorer", action="append", metavar="NAME",
                   help="a scorer (repeatable): paper, strict, offline, llm:PROVIDER/MODEL, history, keyinfo, judge:PROVIDER/MODEL, "
                        "meld, or a task's own (default: the release's task's scorers; --list shows them all)")
    p.add_argument("--list", action="store_true", help="list every registered scorer: what it applies to and what it writes")
    add_dataset_argument(p, required=False, help="the built dataset folder (answer keys, references, objectives)")
    p.add_argument("--force", action="store_true", help="run the scorers even where their scores are current")
    p.add_argument("--allow-self", action="store_true",
                   help="let an LLM grader or judge score its own model (recorded; the page never ranks by it)")
    p.add_argument("--estimate", action="store_true",
                   help="print the calls (expected and at most), tokens and cost the judges would need, as a table, and send nothing "
                        "(a judge a run would refuse, such as one of the doctor's own family, is estimated and the refusal named)")
    p.add_argument("--workers", type=int, default=None, help="worker processes of the history metrics (default: up to 2)")
    add_judge_arguments(p)
    add_call_arguments(p, concurrency=8, max_tokens=DISCUSSION_TOKENS, temperature=0.0,
                       seed_help="judges: the seed of the dimension order and of their sampling; meld: the sampling seed (default 0; recorded)")
    add_quiet_argument(p)


__all__ = ["score_release", "stale", "default_scorers", "check_claims", "claim_lines", "register"]
