"""What the rubric judges said beside their scores: flags, evidence found, and rationales with their quotes.

For each release, from the rows of the scorer that stands for it (:func:`craftmd.scoring.judge.pick_scorer`):

* **flags** (metric ``judge_flag``, :data:`craftmd.scoring.judge.FLAGS`): per model and flag, the conversations checked,
  those flagged and the failed checks (``tables/judge_flags.csv``), and every raised flag with its quotes and whether
  each is in the transcript (``tables/judge_flagged.csv``); flags are never folded into a score;
* **evidence**: per model and scorer, the valid scores, those with at least one quote found in the transcript and the
  share (``tables/judge_evidence.csv``); scores without found evidence are labelled ``no_evidence`` by the judge and
  count in the profiles unless the analysis is asked to drop them (``unsupported="drop"``);
* **rationales**: for a sample of conversations per model (the flagged ones first, then by a hash of the conversation's
  key: deterministic), the transcript with every quote of every score highlighted where it is found, and each score's
  rationale and quotes (found or not). The page escapes every text: names, quotes and transcripts come from models.
"""

from __future__ import annotations

import json
import zlib

import polars as pl

from craftmd.scoring.judge import FLAG_METRIC, FLAGS, NO_EVIDENCE, normalise_text, pick_scorer, quote_found, transcript

SAMPLE = 2  # conversations per model shown with their rationales
KEY = ["case_id", "trial", "conversation", "with_image"]
FLAG_COLUMNS = ["model", "scorer", "flag", "n_conversations", "n_flagged", "n_failed", "share"]
FLAGGED_COLUMNS = ["model", "scorer", *KEY, "flag", "notes", "evidence", "evidence_found"]
EVIDENCE_COLUMNS = ["model", "scorer", "n_scores", "n_evidence_found", "n_no_evidence", "share_found"]


def _empty(columns, types) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(zip(columns, types)))


def judge_rows(releases) -> list[tuple[object, str, pl.DataFrame]]:
    """(release, its judge, that judge's rubric and flag rows) of every judged release."""
    import pyarrow.parquet as pq

    from craftmd.release import SCORES_FILE
    from craftmd.scoring.judge import METRIC

    out = []
    for r in releases:
        path = r.path / SCORES_FILE
        if not path.exists() or "dimension" not in pq.read_schema(path).names:
            continue
        t, _ = r.scores_with_records()
        df = pl.from_arrow(t).filter(pl.col("metric").is_in([METRIC, FLAG_METRIC]))
        scorer = pick_scorer(sorted(df.filter(pl.col("metric") == METRIC)["scorer"].unique().to_list()))
        if scorer is not None:
            out.append(
                (
                    r,
                    scorer,
                    df.filter(pl.col("scorer") == scorer).select(
                        *KEY, "dimension", "metric", "value", "label", "detail", "status"
                    ),
                )
            )
    return out


def flag_tables(judged) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per model × flag counts, every raised flag with its quotes)."""
    counts, raised = [], []
    for r, scorer, rows in judged:
        fl = rows.filter(pl.col("metric") == FLAG_METRIC).to_dicts()
        if not fl:
            continue
        for flag in [k for k in FLAGS if any(x["dimension"] == k for x in fl)]:
            mine = [x for x in fl if x["dimension"] == flag]
            ok = [x for x in mine if x["status"] == "ok"]
            n_flagged = sum(x["value"] == 1.0 for x in ok)
            counts.append({"model": r.id, "scorer": scorer, "flag": flag, "n_conversations": len(ok), "n_flagged": n_flagged,
                           "n_failed": len(mine) - len(ok), "share": round(n_flagged / len(ok), 4) if ok else None})  # fmt: skip
        for x in sorted(
            (x for x in fl if x["status"] == "ok" and x["value"] == 1.0),
            key=lambda x: (*(str(x[k]) for k in KEY), x["dimension"]),
        ):
            d = json.loads(x["detail"] or "{}")
            raised.append({"model": r.id, "scorer": scorer, **{k: x[k] for k in KEY}, "flag": x["dimension"],
                           "notes": " | ".join(d.get("notes") or []), "evidence": json.dumps(d.get("evidence") or [], ensure_ascii=False),
                           "evidence_found": int(d.get("evidence_found") or 0)})  # fmt: skip
    ct = pl.DataFrame(
        counts, schema=dict(zip(FLAG_COLUMNS, [pl.String, pl.String, pl.String, pl.Int64, pl.Int64, pl.Int64, pl.Float64]))
    )
    rt = pl.DataFrame(raised, schema=dict(zip(FLAGGED_COLUMNS, [pl.String, pl.String, pl.String, pl.Int64, pl.String, pl.Boolean, pl.String,
                                                                 pl.String, pl.String, pl.Int64])))  # fmt: skip
    return ct, rt


def evidence_table(judged) -> pl.DataFrame:
    """Per model and scorer: valid scores, those with evidence found, those labelled no_evidence, and the share found."""
    from craftmd.scoring.judge import METRIC

    rows = []
    for r, scorer, xs in judged:
        ok = xs.filter(pl.col("metric") == METRIC, pl.col("status") == "ok")
        none = ok.filter(pl.col("label") == NO_EVIDENCE).height
        rows.append({"model": r.id, "scorer": scorer, "n_scores": ok.height, "n_evidence_found": ok.height - none, "n_no_evidence": none,
                     "share_found": round((ok.height - none) / ok.height, 4) if ok.height else None})  # fmt: skip
    return pl.DataFrame(
        rows, schema=dict(zip(EVIDENCE_COLUMNS, [pl.String, pl.String, pl.Int64, pl.Int64, pl.Int64, pl.Float64]))
    )


def segments(text: str, quotes: list[str]) -> list[dict]:
    """``text`` cut into pieces, ``mark`` set on those where one of ``quotes`` is found (matched on normalised text,
    :func:`craftmd.scoring.judge.normalise_text`, then mapped back to the original characters)."""
    # the normalised text, built character by character with each normalised character's original index
    chars, where = [], []
    space = True
    for i, ch in enumerate(text):
        n = normalise_text(ch) if not ch.isspace() else " "
        if n == " " or (not n and ch.isspace()):
            if not space:
                chars.append(" ")
                where.append(i)
            space = True
            continue
        for c in n:
            chars.append(c)
            where.append(i)
        space = False
    folded = "".join(chars)
    marks = [False] * len(text)
    for q in quotes:
        nq = normalise_text(q).strip().strip("\"'").strip(".").strip()
        if not nq:
            continue
        start = folded.find(nq)
        while start >= 0:
            for i in range(where[start], where[start + len(nq) - 1] + 1):
                marks[i] = True
            start = folded.find(nq, start + 1)
    out: list[dict] = []
    for ch, m in zip(text, marks):
        if out and out[-1]["mark"] == m:
            out[-1]["text"] += ch
        else:
            out.append({"text": ch, "mark": m})
    return out


def samples(judged, n: int = SAMPLE) -> list[dict]:
    """Per model, ``n`` conversations (flagged first, then by a hash of their key) with their transcript in highlighted
    pieces, each score's rationale and quotes (found or not) and their raised flags."""
    import pyarrow.parquet as pq

    from craftmd.scoring.judge import METRIC

    out = []
    for r, scorer, xs in judged:
        flagged = set(xs.filter(pl.col("metric") == FLAG_METRIC, pl.col("value") == 1.0).select(KEY).unique().iter_rows())
        judged_ok = list(xs.filter(pl.col("metric") == METRIC, pl.col("status") == "ok").select(KEY).unique().iter_rows())
        pick = sorted(judged_ok, key=lambda k: (k not in flagged, zlib.crc32("|".join(map(str, k)).encode())))[:n]
        if not pick:
            continue
        chosen = pl.DataFrame(pick, schema={"case_id": pl.String, "trial": xs.schema["trial"], "conversation": pl.String,
                                            "with_image": pl.Boolean}, orient="row")  # fmt: skip
        by_conv: dict[tuple, list[dict]] = {}
        for x in xs.join(chosen, on=KEY, how="semi").to_dicts():
            by_conv.setdefault(tuple(x[k] for k in KEY), []).append(x)
        conv = pq.read_table(
            r.path / "conversations.parquet",
            columns=[*KEY, "messages"],
            filters=[("case_id", "in", sorted({k[0] for k in pick}))],
        ).to_pylist()  # only the sampled cases
        texts = {tuple(c[k] for k in KEY): transcript(c["messages"]) for c in conv}
        for k in pick:
            text = texts.get(k, "")
            fold = normalise_text(text)
            scores, quotes = [], []
            for x in sorted(by_conv[k], key=lambda x: (x["metric"], x["dimension"] or "")):
                if x["status"] != "ok":
                    continue
                d = json.loads(x["detail"] or "{}")
                ev = [str(q) for q in d.get("evidence") or []]
                if x["metric"] == FLAG_METRIC and x["value"] != 1.0:
                    continue
                quotes += ev
                scores.append({"what": x["dimension"], "flag": x["metric"] == FLAG_METRIC,
                               "score": None if x["metric"] == FLAG_METRIC else int(x["value"]),
                               "rationale": d.get("rationale") or " | ".join(d.get("notes") or []), "no_evidence": x["label"] == NO_EVIDENCE,
                               "quotes": [{"text": q, "found": quote_found(q, fold)} for q in ev]})  # fmt: skip
            out.append({"model": r.id, "scorer": scorer, "case_id": k[0], "trial": k[1], "conversation": k[2], "with_image": k[3],
                        "flagged": k in flagged, "segments": segments(text, quotes), "scores": scores})  # fmt: skip
    return out


def judge_extras(releases) -> dict:
    """The flags, evidence and sample tables of the releases' standing judges (empty frames when nothing was judged)."""
    judged = judge_rows(releases)
    flags, flagged = flag_tables(judged)
    return {"judge_flags": flags, "judge_flagged": flagged, "judge_evidence": evidence_table(judged), "samples": samples(judged)}


def page_section(extras: dict | None, name=None) -> dict | None:
    """What the page shows: the evidence share per judge, the flag counts and flagged conversations per model, and the
    sampled conversations with their rationales. The tables name a release by its id (``model``); ``name`` (release id
    -> the name it is shown under; default: the id) gives each row's ``model`` here, its id kept as ``release``."""
    if not extras or extras["judge_evidence"].height == 0:
        return None
    name = name or str
    shown = lambda rows: [{**x, "model": name(x["model"]), "release": x["model"]} for x in rows]  # noqa: E731
    flagged: dict[str, list] = {}
    for x in extras["judge_flagged"].to_dicts():
        flagged.setdefault(x["model"], []).append({**x, "evidence": json.loads(x["evidence"])})
    return {"evidence": shown(extras["judge_evidence"].to_dicts()), "flags": shown(extras["judge_flags"].to_dicts()),
            "flagged": [{"model": name(m), "release": m, "rows": rows} for m, rows in sorted(flagged.items(), key=lambda x: (name(x[0]), x[0]))],
            "samples": shown(extras["samples"]), "flag_names": dict(FLAGS)}  # fmt: skip


TABLES = ("judge_flags", "judge_flagged", "judge_evidence")

__all__ = ["judge_extras", "flag_tables", "evidence_table", "samples", "segments", "page_section", "TABLES"]
