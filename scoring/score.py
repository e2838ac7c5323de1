"""Running scorers on releases, only what is stale: ``craftmd score``'s work, and the one writer of scores.

Any :class:`~craftmd.scoring.scorers.Scorer` of the registry (answer graders, conversation measures, judges, MELD)
returns its rows and records (:class:`~craftmd.scoring.scorers.ScorerResult`); :func:`score_release` runs those whose
record is not current (:meth:`~craftmd.scoring.scorers.Scorer.current`) and adds their rows to the release's
``scores.parquet`` (:func:`craftmd.release.write_scores`, atomic); :func:`score_with` runs a scorer given whole (a
calibrated judge, people's ratings) the same way. Nothing else writes scores into a release.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from craftmd import CraftMDError
from craftmd.release import CLAIM_PREFIX, Release, read_release, write_scores
from craftmd.scoring.scorers import Context, Scorer, scorers


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


def score_release(
    release_dir: Path | str,
    dataset_dir: Path | str | None,
    names: list[str] | None = None,
    *,
    force: bool = False,
    estimate: bool = False,
    using: list[Scorer] | None = None,
    **settings,
) -> dict:
    """Run ``names`` (default: the task's scorers) on a release, those that are stale (all with ``force``), and write
    their rows and records into its ``scores.parquet``.

    ``using``: scorers given whole instead of by name (a judge with its whole :class:`~craftmd.scoring.judge.JudgeSpec`).
    ``settings`` go to the :class:`~craftmd.scoring.scorers.Context` (base_url, cache, progress, allow_self, options).
    With ``estimate``, scorers that call models report what they would send and nothing is written. Returns what was
    done: ``scored``, ``current``, ``skipped`` (with the reason), ``estimates`` and the judges' ``summaries``.
    """
    rel = read_release(release_dir)
    ctx = context(dataset_dir, **settings)
    report: dict = {"release": str(release_dir), "scored": [], "current": [], "skipped": {}}
    names = names or default_scorers(rel)
    claims, claimed = (None, {}) if estimate else sender_claims(rel, report)  # kept as claims, or scored here again
    elsewhere = {r.removeprefix(CLAIM_PREFIX) for r in claimed}
    todo = _stale(rel, ctx, using if using is not None else scorers(names) if names else [], force, report, elsewhere)
    if not estimate:
        todo += [s for s in check_made_here(rel, ctx, report) if s.name not in {t.name for t in todo}]
    refused = _refusals(rel, ctx, todo, estimate)
    rows, records = ([claims], dict(claimed)) if claimed else ([], {})  # written once at the end: all, or none
    for s in todo:
        if estimate:
            est = s.estimate(rel, ctx)
            if s.name in refused:
                est = dict(est or {}, refused=refused[s.name])
            report.setdefault("estimates", {})[s.name] = est
            continue
        result = s.run(rel, ctx)
        if result.records:
            mine = dict(result.records)
            for name, found in check_claims(rel, result.rows, mine, claims).items():
                mine[name] = dict(mine[name], claims=found)
                report.setdefault("claims", {})[name] = found
            rows.append(result.rows)
            records.update(mine)
        report["scored"].append(s.name)
        report.setdefault("writes", {})[s.name] = list(s.writes())
        if result.summary:
            report.setdefault("summaries", {})[s.name] = result.summary
    if records:
        table = pa.concat_tables(rows, promote_options="permissive") if len(rows) > 1 else rows[0]
        write_scores(rel, table, records, drop=elsewhere)
    return report


def score_with(scorer: Scorer, release_dirs, dataset_dir: Path | str | None = None, **settings) -> list[dict]:
    """``scorer``, given whole (made from something besides the release: a calibration applied, people's ratings), on
    each of ``release_dirs``: every release checked first (:meth:`~craftmd.scoring.scorers.Scorer.check`: one line, and
    nothing written when one is refused), then each scored by :func:`score_release`, this module's one writer. A release
    whose scores arrived from elsewhere and were not yet checked here is refused first (:func:`check_standing`, as
    ``craftmd analyse`` does): a calibrated judge maps the judge's scores it finds, so they must be made here. Returns
    what each run reports besides (its summary)."""
    releases = [read_release(d) for d in release_dirs]
    check_standing(releases)
    ctx = context(dataset_dir, **settings)
    for rel in releases:
        why = scorer.applies(rel)
        if why:
            raise CraftMDError(f"release {rel.id}: {scorer.name} does not apply ({why})")
        scorer.check(rel, ctx)
    out = []
    for rel in releases:
        report = score_release(rel.path, dataset_dir, using=[scorer], force=True, **settings)
        out.append((report.get("summaries") or {}).get(scorer.name))
    return out


def deterministic(name: str) -> bool:
    """Whether scorer ``name`` computes its scores here without a model (the MCQ rules, the offline grader, the history
    and key-value metrics, a task's own such scorer): scores this machine can always recompute from the release."""
    from craftmd.scoring.scorers import SCORERS

    return name in SCORERS and not SCORERS[name]().calls_model


#: Whose word each scorer name of a release's scores is (:func:`standing`): computed, ingested or checked on this machine;
#: a claim kept apart (``claimed:<name>``); rows that arrived from elsewhere of a scorer without a model (recomputed and
#: compared by ``craftmd score``); rows that arrived from elsewhere that only a model could make again (an LLM grader's,
#: a judge's, MELD's, the recorded GPT-4 labels, the experts' ratings: kept by ``craftmd score`` as the sender's claims).
HERE, CLAIM, TO_CHECK, TO_CLAIM = "made here", "claim", "to check", "to claim"


def standing(rel: Release) -> dict[str, str]:
    """The one place that says, for every scorer name of ``rel``'s scores (its rows' and its records'), whose word its
    scores are: :data:`HERE`, :data:`CLAIM`, :data:`TO_CHECK` or :data:`TO_CLAIM`. Only scores made here are ranked;
    claims are shown apart as their sender's; the other two are settled by ``craftmd score`` before anything reads them
    (:func:`check_standing`)."""
    from craftmd.release import made_here

    here = made_here(rel)
    return {
        n: CLAIM if n.startswith(CLAIM_PREFIX) else HERE if n in here else TO_CHECK if deterministic(n) else TO_CLAIM
        for n in sorted(rel.scorer_names())
    }


def check_standing(releases: list[Release]) -> None:
    """Refuse, in one line naming the release and its scorers, a release whose scores arrived from elsewhere and were
    not yet checked here (``craftmd score`` recomputes those it can and keeps the others as the sender's claims): what
    the analysis reads is either made here or a claim, never a number no one checked."""
    for rel in releases:
        unsettled = [n for n, s in standing(rel).items() if s in (TO_CHECK, TO_CLAIM)]
        if unsettled:
            raise CraftMDError(
                f"release {rel.id}: its {', '.join(unsettled)} scores were not computed or checked on this machine (its "
                f"scores file came from elsewhere); run `craftmd score {rel.path} --dataset DATA` first: it recomputes "
                "those it can and keeps the others apart as the sender's claims, never ranked"
            )


#: What a claim's record says of where its scores came from (:func:`sender_claims`).
FROM_SENDER = "the release's scores file, made elsewhere (not computed here)"


def sender_claims(rel: Release, report: dict) -> tuple[pa.Table | None, dict[str, dict]]:
    """The rows of ``rel``'s scores that arrived from elsewhere and that only a model could make again
    (:data:`TO_CLAIM`), renamed as claims (scorer ``claimed:<name>``, :data:`craftmd.release.CLAIM_PREFIX`), and their
    records, marked ``claimed`` and who reported them: the sender's word, kept apart and never ranked (the analysis's
    ``claims`` table shows them). Reported as ``claimed`` (scorer names). (None, {}) when there are none."""
    import pyarrow.compute as pc

    names = [n for n, s in standing(rel).items() if s == TO_CLAIM]
    if not names:
        return None, {}
    table, records = rel.scores_with_records()
    rows = table.filter(pc.is_in(table.column("scorer"), pa.array(names, pa.string())))
    renamed = pc.binary_join_element_wise(CLAIM_PREFIX, rows.column("scorer"), "")
    rows = rows.set_column(rows.schema.get_field_index("scorer"), "scorer", renamed)
    claimed = {CLAIM_PREFIX + n: dict(records.get(n) or {}, claimed=True, reported_by=FROM_SENDER) for n in names}
    report["claimed"] = names
    return rows, claimed


def check_made_here(rel: Release, ctx: Context, report: dict) -> list[Scorer]:
    """Check the deterministic scorers' rows of a scores file this machine did not write (one that arrived with the
    release): each is recomputed from the release's answers and conversations, and rows that differ from what the
    scorer computes are refused in one line naming the release and the scorer; equal rows are noted as checked here
    (:func:`craftmd.release.note_made_here`, so the next run does not recompute them) and reported as ``verified``.
    Returns the scorers whose rows are stale (made by other rules or from other inputs): they are scored again."""
    import hashlib

    from craftmd.release import SCORES_FILE, made_here, note_made_here
    from craftmd.scoring.scorers import get_scorer

    table, records = rel.scores_with_records()
    if table is None or ctx.dataset_dir is None:  # without the dataset nothing is recomputed, and nothing is noted
        return []
    here = made_here(rel)
    names = [n for n, s in standing(rel).items() if s == TO_CHECK]
    again, checked = [], []
    for name in names:
        s = get_scorer(name)
        why = s.applies(rel)
        if why:
            raise CraftMDError(
                f"release {rel.id}: {SCORES_FILE} holds {name} scores, yet {name} does not apply ({why}); remove the file and score the release again"
            )
        if not s.current(rel, ctx):
            again.append(s)
            continue
        differ = _differ(table, s.run(rel, ctx).rows, s.writes())
        if differ:
            raise CraftMDError(
                f"release {rel.id}: {differ} of its {name} scores are not what {name} computes from its answers "
                f"(scores not made here are never ranked); remove {rel.path / SCORES_FILE} and score the release again"
            )
        checked += s.writes()
    if checked:
        note_made_here(hashlib.sha256(rel.data(SCORES_FILE)).hexdigest(), here | set(checked))
        report["verified"] = checked
    return again


def _differ(old, new, names) -> int:
    """How many of scorers ``names``' rows differ between scores tables ``old`` and ``new`` (a row on one side only, or
    another status, label or value)."""
    import polars as pl

    o = pl.from_arrow(old).filter(pl.col("scorer").is_in(list(names)))
    n = pl.from_arrow(new).filter(pl.col("scorer").is_in(list(names)))
    cols = [c for c in n.columns if c != "detail"]
    if any(c not in o.columns for c in cols):
        return max(o.height, n.height)
    keys = [c for c in cols if c not in ("value", "label", "status")]
    o = o.select(cols)
    n = n.select(cols).cast({c: o.schema[c] for c in cols})
    both = o.join(n, on=keys, how="full", nulls_equal=True, suffix="_now", coalesce=True)
    differ = (
        pl.col("status").is_null()
        | pl.col("status_now").is_null()
        | (pl.col("status") != pl.col("status_now"))
        | pl.col("label").ne_missing(pl.col("label_now"))
        | pl.col("value").is_null().ne(pl.col("value_now").is_null())
        | ((pl.col("value") - pl.col("value_now")).abs() > 1e-9).fill_null(False)
    )
    return both.filter(differ).height


def _stale(
    rel: Release, ctx: Context, chosen: list[Scorer], force: bool, report: dict, elsewhere: set[str] = frozenset()
) -> list[Scorer]:
    """Those of ``chosen`` to run on ``rel``: that apply and are not current (all that apply with ``force``; a scorer
    whose rows arrived from elsewhere, ``elsewhere``, is never current); the others are noted in ``report`` (a task may
    have no default scorers: encounters' judges cost money)."""
    todo = []
    for s in chosen:
        why = s.applies(rel)
        if why:
            report["skipped"][s.name] = why
        elif not force and not set(s.writes()) & elsewhere and s.current(rel, ctx):
            report["current"].append(s.name)
        else:
            todo.append(s)
    return todo


def _refusals(rel: Release, ctx: Context, todo: list[Scorer], estimate: bool) -> dict[str, str]:
    """Every scorer's refusal (a grader or judge of the release's own model), before anything is written: raised, or
    with ``estimate`` (which sends nothing) returned by scorer name to say what a run would refuse."""
    refused = {}
    for s in todo:
        try:
            s.check(rel, ctx)
        except CraftMDError as exc:
            if not estimate:
                raise
            refused[s.name] = str(exc)
    return refused


def judge_release(
    release_dir: Path | str,
    spec,
    *,
    dataset_dir: Path | str | None = None,
    conversations: list[str] | None = None,
    cases: list[str] | None = None,
    estimate: bool = False,
) -> dict:
    """Judge a release with a whole :class:`~craftmd.scoring.judge.JudgeSpec` (settings the command line does not
    give) through :func:`score_release`, even where current; returns the judges' summary (with ``estimate``: what a
    run would send, and nothing is sent or written)."""
    from craftmd.scoring.scorers import Judges

    s = Judges(spec.models, spec=spec)
    report = score_release(
        release_dir,
        dataset_dir,
        using=[s],
        force=True,
        estimate=estimate,
        options={"conversations": conversations, "cases": cases},
    )
    if s.name in report["skipped"]:
        raise CraftMDError(f"release {read_release(release_dir).id}: nothing to judge ({report['skipped'][s.name]})")
    return report["estimates" if estimate else "summaries"][s.name]


def check_claims(release: Release, table, records: dict, also: pa.Table | None = None) -> dict[str, dict]:
    """The release's claims (scorer ``claimed:<name>``: scores an ingested log reported, or that arrived with the
    release: ``also``, :func:`sender_claims`) checked against the scores ``table`` just computed: for each scorer name of
    ``records`` that has claims, how many there are (``checked``) and how many ``disagree`` (another value or status than
    the score computed, or no such score computed)."""
    import polars as pl

    old, _ = release.scores_with_records()
    if old is None or table is None:
        return {}
    if also is not None:  # the sender's claims replace any claim of the same scorer the file held
        old = pa.concat_tables(
            [old.filter(pa.compute.invert(pa.compute.is_in(old.column("scorer"), also.column("scorer").unique()))), also],
            promote_options="permissive",
        )
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
        differ = (
            pl.col("status_now").is_null()
            | (pl.col("status") != pl.col("status_now"))
            | ((pl.col("value") - pl.col("value_now")).abs() > 1e-9).fill_null(False)
        )
        out[name] = {"as": CLAIM_PREFIX + name, "checked": both.height, "disagree": both.filter(differ).height}
    return out


def claim_lines(report: dict) -> list[str]:
    """One line for each scorer of a :func:`score_release` report whose rows arrived with the release and are now kept
    as the sender's claims, and for each whose scores disagree with what the release claimed."""
    kept = [
        f"{report['release']}: its {name} scores came with the release, made elsewhere, and only a model could compute "
        f"them again: kept apart as the sender's claims ({CLAIM_PREFIX}{name}), never ranked "
        f"(`craftmd score {report['release']} --scorer {name}` computes them here)"
        for name in report.get("claimed", [])
    ]
    return kept + [
        f"{report['release']}: {c['disagree']} of its {c['checked']} claimed {name} scores ({c['as']}) "
        f"disagree with {name}'s, computed now; the claims are kept apart and never ranked"
        for name, c in sorted(report.get("claims", {}).items())
        if c["disagree"]
    ]


def outcomes(release_dir: Path | str, written: list[str]) -> dict[str, dict]:
    """Per scorer name among ``written`` (as the scores table has them): ``scored`` (status ok), ``failed`` (status
    error), ``reasons`` (each failure's reason, counted) and, for a scorer whose record counts the answers it ``asked``
    a model about (an LLM grader: a missing answer is scored without a call), ``answered``: those the model answered."""
    import polars as pl

    table, records = read_release(release_dir).scores_with_records() if written else (None, {})
    if table is None:
        return {}
    df = pl.from_arrow(table.select(["scorer", "status", "detail"])).filter(pl.col("scorer").is_in(written))
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
    for name, o in out.items():
        rec = records.get(name) or {}
        if isinstance(rec.get("asked"), int):
            o["answered"] = rec["asked"] - int(rec.get("failures") or 0)
    return out


__all__ = [
    "score_release",
    "judge_release",
    "stale",
    "default_scorers",
    "check_claims",
    "claim_lines",
    "outcomes",
    "standing",
    "check_standing",
    "sender_claims",
]
