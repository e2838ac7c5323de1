"""How far a judged release's rubric profile moves when the judge does (what MedPI left unstudied, §6.1).

A sample of each judged release's conversations (``n`` per release, seeded) is judged again under one change at a
time: ``seed`` (the judges' sampling seed + 1), ``order`` (the dimension order's seed + 1), ``model`` (another judge,
``other``), ``prompts`` (the paraphrased set ``judge-v1-paraphrase``). Per model and variant, the drift of the overall
score and of each meta-category (0–100, variant minus own, per case then over cases, 95 % bootstrap CI over cases)
and, with two or more models, the rank agreement (Kendall's τ-b of the overall means); failed scores are counted and
left out. Written to ``RELEASES/judge-sensitivity/`` (``sensitivity.csv``, ``sensitivity.json``), never to the releases.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl

from craftmd import CraftMDError
from craftmd.agreement import kendall_tau

VARIANTS = ("seed", "order", "model", "prompts")
FOLDER = "judge-sensitivity"
#: What its folder holds: replaced whole by a new run, refused when anything else is in it (a file of the user's).
OWNS = ("sensitivity.json",)
HOLDS = ("sensitivity.json", "sensitivity.csv")
COLUMNS = ["model", "variant", "judge", "level", "group", "n_cases", "n_conversations", "n_failed", "baseline", "variant_mean", "drift",
           "ci_low", "ci_high"]  # fmt: skip


def base_spec(record: dict, *, base_url, cache, concurrency: int = 8):
    """The judge's settings as its record gives them (one judge model, its sampling and order seeds, mode, dimensions)."""
    from craftmd.scoring.judge import JudgeSpec

    sampling = record.get("sampling") or {}
    dims = record.get("dimensions")
    return JudgeSpec(models=[record["model"]], mode=record.get("mode", "dimension"), seed=int(sampling.get("seed", 0)) - int(record.get("member_seed", 0)),
                     order_seed=int(record.get("shuffle_seed", 0)), dimensions=None if dims in (None, "all") else list(dims),
                     response_format=(record.get("response_format") or {}).get("requested", "json_schema"),
                     temperature=float(sampling.get("temperature", 0.0)), discussion_tokens=int(sampling.get("discussion_max_tokens", 1024)),
                     score_tokens=int(sampling.get("score_max_tokens_per_dimension", 384)), max_invalid=int(record.get("max_invalid", 2)),
                     base_url=base_url, cache=cache, concurrency=concurrency, progress=False, force=True,
                     prompt_set=(record.get("prompt_set") or {}).get("name", "judge-v1"))  # fmt: skip


def variant_specs(spec, other: str) -> dict:
    return {"seed": replace(spec, seed=spec.seed + 1, order_seed=spec.shuffle_seed),
            "order": replace(spec, order_seed=spec.shuffle_seed + 1),
            "model": replace(spec, models=[other]),
            "prompts": replace(spec, prompt_set="judge-v1-paraphrase")}  # fmt: skip


def _frame(rows: list[dict], release: str, who: str) -> pl.DataFrame:
    from craftmd.scoring.rubric import load_catalog

    cat = load_catalog().by_id()
    return pl.DataFrame([{"model": release, "scorer": who, "case_id": r["case_id"], "trial": r["trial"], "conversation": r["conversation"],
                          "with_image": r["with_image"], "dimension": r["dimension"], "value": r["value"], "status": r["status"],
                          "category": cat[r["dimension"]].category, "meta_category": cat[r["dimension"]].meta_category} for r in rows],
                        schema={"model": pl.String, "scorer": pl.String, "case_id": pl.String, "trial": pl.Int64, "conversation": pl.String,
                                "with_image": pl.Boolean, "dimension": pl.String, "value": pl.Float64, "status": pl.String,
                                "category": pl.String, "meta_category": pl.String})  # fmt: skip


def _profiles(df: pl.DataFrame) -> pl.DataFrame:
    """Per conversation: its overall score and meta-category scores on 0–100 (level, group, value)."""
    from craftmd.analysis.rubric import CONVERSATION, conversation_scores

    meta = conversation_scores(df).filter(pl.col("level") == "meta_category")
    key = ["model", "scorer", *CONVERSATION]
    overall = (
        meta.group_by(key)
        .agg(pl.col("value").mean())
        .with_columns(pl.lit("overall").alias("level"), pl.lit("overall").alias("group"))
    )
    return pl.concat([overall.select(*key, "level", "group", "value"), meta.select(*key, "level", "group", "value")])


def drift_rows(base: pl.DataFrame, var: pl.DataFrame, variant: str, judge: str, B: int, seed: int) -> list[dict]:
    """Per level and group: the mean over cases of the per-case mean drift (variant − baseline, same conversations)."""
    from craftmd.analysis.rubric import CONVERSATION

    key = ["model", *CONVERSATION, "level", "group"]
    both = (_profiles(base).drop("scorer").rename({"value": "b"})
            .join(_profiles(var).drop("scorer").rename({"value": "v"}), on=key, how="inner"))  # fmt: skip
    failed = var.filter(pl.col("status") != "ok").height
    out = []
    for (model, level, group), g in both.sort(key).group_by(["model", "level", "group"], maintain_order=True):
        cases = g.group_by("case_id").agg((pl.col("v") - pl.col("b")).mean().alias("d"), pl.col("b").mean(), pl.col("v").mean(),
                                          pl.len().alias("n")).sort("case_id")  # fmt: skip
        d = cases["d"].to_numpy()
        rng = np.random.default_rng([seed, zlib.crc32(f"{model}|{variant}|{level}|{group}".encode())])
        boot = d[rng.integers(0, len(d), (B, len(d)))].mean(axis=1) if len(d) else np.array([])
        out.append({"model": model, "variant": variant, "judge": judge, "level": level, "group": group, "n_cases": len(d),
                    "n_conversations": int(cases["n"].sum()), "n_failed": failed, "baseline": round(float(cases["b"].mean()), 4),
                    "variant_mean": round(float(cases["v"].mean()), 4), "drift": round(float(d.mean()), 4),
                    "ci_low": round(float(np.percentile(boot, 2.5)), 4), "ci_high": round(float(np.percentile(boot, 97.5)), 4)})  # fmt: skip
    return out


def sensitivity(
    releases_dir,
    other: str,
    *,
    n: int = 10,
    seed: int = 0,
    B: int = 1000,
    base_url=None,
    cache=None,
    dataset_dir=None,
    variants: list[str] | None = None,
) -> dict:
    """Re-judge a sample of every judged release under ``releases_dir`` under each variant; write and return the drift."""
    from craftmd.atomic import atomic_dir, check_writable
    from craftmd.models import parse_name
    from craftmd.scoring.judge import METRIC, Judge, MemberState, score_rows

    parse_name(other)
    variants = list(variants or VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise CraftMDError(f"--variants: {bad[0]!r} is not one of {', '.join(VARIANTS)}")
    if n < 1:
        raise CraftMDError("--n must be at least 1")
    check_writable(Path(releases_dir) / FOLDER, owns=OWNS, holds=HOLDS)  # before a judge is asked anything
    plans = _plans(releases_dir, n, seed, dataset_dir)
    if not plans:
        raise CraftMDError(f"no judged release under {releases_dir} (craftmd score RELEASE --scorer judge:PROVIDER/MODEL first)")
    rows, records_out, overall = [], {}, {}
    for rel, scorer, record, sample, base_rows in plans:
        base = _frame(base_rows, rel.id, "baseline")
        spec = base_spec(record, base_url=base_url, cache=cache)
        overall.setdefault("baseline", {})[rel.id] = _overall(base)
        for name, vs in variant_specs(spec, other).items():
            if name not in variants:
                continue
            judge = Judge(vs)
            states, _ = judge.run(sample)
            table, _ = score_rows(sample, states, judge.dims)
            var = _frame([r for r in table.to_pylist() if r["metric"] == METRIC], rel.id, name)
            member = states[0].member
            records_out.setdefault(rel.id, {})[name] = judge.identity(MemberState(member, vs.response_format))
            rows += drift_rows(base, var, name, member.name, B, seed)
            overall.setdefault(name, {})[rel.id] = _overall(var)
    models = sorted(overall["baseline"])
    tau = _kendall(overall, models, variants)
    table = pl.DataFrame(rows, schema={c: (pl.Int64 if c.startswith("n_") else pl.Float64 if c in ("baseline", "variant_mean", "drift",
                                                                                                   "ci_low", "ci_high") else pl.String)
                                       for c in COLUMNS}).sort("model", "variant", "level", "group")  # fmt: skip
    result = {"format": "craftmd-judge-sensitivity", "version": 1, "n": n, "seed": seed, "B": B, "other_judge": other, "variants": variants,
              "kendall_tau": tau, "models": models, "judges": records_out, "rows": table.to_dicts()}  # fmt: skip
    out = Path(releases_dir) / FOLDER
    with atomic_dir(out, owns=OWNS, holds=HOLDS) as tmp:  # never a file of the user's in it
        table.write_csv(tmp / "sensitivity.csv")
        (tmp / "sensitivity.json").write_text(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False))
    return result


def _plans(releases_dir, n: int, seed: int, dataset_dir) -> list[tuple]:
    """Each judged release's (release, scorer, its record, the sampled units, their baseline score rows)."""
    from craftmd.scoring.judge import METRIC, pick_scorer, read_units
    from craftmd.scoring.score import check_standing

    from ..board import Board

    found = list(Board.read(releases_dir))
    check_standing(found)  # the baseline is the release's own judge scores: made here or a claim (never re-judged)
    plans = []
    for rel in found:
        t, records = rel.scores_with_records()
        rows = [] if t is None or "dimension" not in t.column_names else [r for r in t.to_pylist() if r["metric"] == METRIC]
        scorer = pick_scorer(sorted({r["scorer"] for r in rows}))
        if scorer is None:
            continue
        if scorer == "judge-committee":  # a committee: its first member stands for the judge
            scorer = records[scorer]["members"][0]
        record = records.get(scorer) or {}
        if "model" not in record:
            raise CraftMDError(f"release {rel.id}: the record of {scorer} does not say how it judged; judge it again first")
        mine = [r for r in rows if r["scorer"] == scorer]
        judged = sorted({(r["case_id"], r["trial"], r["conversation"], r["with_image"]) for r in mine if r["status"] == "ok"})
        units = [
            u
            for u in read_units(rel, dataset_dir)
            if (u.case_id, u.trial, u.conversation, u.with_image) in set(judged) and not u.failed
        ]
        pick = np.random.default_rng([seed, zlib.crc32(rel.id.encode())]).choice(
            len(units), size=min(n, len(units)), replace=False
        )
        sample = [units[i] for i in sorted(pick.tolist())]
        keys = {(u.case_id, u.trial, u.conversation, u.with_image) for u in sample}
        plans.append(
            (
                rel,
                scorer,
                record,
                sample,
                [r for r in mine if (r["case_id"], r["trial"], r["conversation"], r["with_image"]) in keys],
            )
        )
    return plans


def _kendall(overall: dict, models: list[str], variants: list[str]) -> dict:
    """Kendall's tau between the baseline's ranking of ``models`` and each variant's (None where there is none)."""
    tau = {}
    for name in variants:
        if len(models) < 2:
            tau[name] = None
            continue
        a = [overall["baseline"][m] for m in models]
        b = [overall[name].get(m) for m in models]
        if any(x is None for x in a + b):  # a model without a valid overall score on one side: no ranking to compare
            tau[name] = None
            continue
        t = kendall_tau(a, b)
        tau[name] = None if t is None else round(t, 4)
    return tau


def _overall(df: pl.DataFrame) -> float | None:
    p = _profiles(df).filter(pl.col("level") == "overall")
    if p.height == 0:
        return None
    return float(p.group_by("case_id").agg(pl.col("value").mean())["value"].mean())


def read_sensitivity(releases_dir) -> dict | None:
    """The sensitivity a releases folder holds (``judge-sensitivity/sensitivity.json``), or None."""
    path = Path(releases_dir) / FOLDER / "sensitivity.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise CraftMDError(f"{path}: damaged (craftmd judge-sensitivity writes it again)") from None


__all__ = ["sensitivity", "read_sensitivity", "variant_specs", "base_spec", "VARIANTS", "FOLDER"]
