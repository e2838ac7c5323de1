"""Sampling conversations for the expert review: stratified per model × dataset, single-diagnosis cases first (as the
paper did), each with the grader's verdict."""

from __future__ import annotations

import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
from craftmd.scoring.judge import transcript

from craftmd import CraftMDError

from .records import GRADER_PREFERENCE


def _open_releases(paths) -> list:
    """The releases at ``paths`` (release folders or folders of them), one per id, each settled
    (:func:`craftmd.scoring.score.check_standing`: the key's grader verdicts are made here; claims are never a verdict)."""
    from craftmd.release import read_release
    from craftmd.scoring.score import check_standing

    from ...board import Board

    found = {}
    for p in paths:
        p = Path(p)
        rels = [read_release(p)] if (p / "manifest.json").exists() else list(Board.read(p))
        if not rels:
            raise CraftMDError(f"{p}: no release found")
        for r in rels:
            found.setdefault(r.id, r)
    check_standing(list(found.values()))
    return [found[k] for k in sorted(found)]


def _pick_grader(names: list[str], wanted: str | None) -> str | None:
    if wanted:
        return wanted if wanted in names else None
    for pref in GRADER_PREFERENCE:
        hits = sorted(n for n in names if n.startswith(pref)) if pref.endswith(":") else [n for n in names if n == pref]
        if hits:
            return hits[0]
    return None


def _stratum_rng(seed: int, *labels: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32("|".join(labels).encode())])


def sample_review_rows(releases, dataset_dir, n: int, seed: int, grader: str | None = None) -> tuple[list[dict], list[dict]]:
    """The sampled rows (sheet) and key rows: ``n`` conversations per release × dataset source."""
    import polars as pl

    from craftmd.dataset import load_config
    from craftmd.release import natural_key

    if n < 1:
        raise CraftMDError("--n must be at least 1")
    cases = load_config(dataset_dir, "all").select("case_id", "source", "vignette", "answer", "single_dx")
    by_case = {r["case_id"]: r for r in cases.iter_rows(named=True)}
    rows, keys, skipped = [], [], []
    for rel in releases:
        conv = pl.from_arrow(rel.table("conversations")).filter((pl.col("conversation") == "standard") & ~pl.col("with_image"))
        if conv.height == 0:
            skipped.append(rel.id)  # e.g. an image-only release
            continue
        ans = pl.from_arrow(rel.table("answers")).filter(
            (pl.col("setting") == "multiturn") & (pl.col("format") == "frq") & ~pl.col("with_image")
        )
        final = {(r["case_id"], r["trial"]): r for r in ans.iter_rows(named=True)}
        verdict, gname = _verdicts(rel, grader)
        trials: dict[str, list[int]] = defaultdict(list)
        msgs = {}
        for r in conv.iter_rows(named=True):
            if r["case_id"] not in by_case:
                raise CraftMDError(f"release {rel.id}: case {r['case_id']} is not in the dataset {dataset_dir}")
            trials[r["case_id"]].append(r["trial"])
            msgs[(r["case_id"], r["trial"])] = r["messages"]
        strata: dict[str, list[str]] = defaultdict(list)
        for cid in sorted(trials, key=natural_key):
            strata[by_case[cid]["source"]].append(cid)
        for source in sorted(strata):
            rng = _stratum_rng(seed, rel.id, source)
            ids = strata[source]
            single = [c for c in ids if by_case[c]["single_dx"] is True]
            other = [c for c in ids if by_case[c]["single_dx"] is not True]
            order = [single[i] for i in rng.permutation(len(single))] + [other[i] for i in rng.permutation(len(other))]
            chosen = order[:n]
            for cid in sorted(chosen, key=natural_key):
                trial = int(sorted(trials[cid])[int(rng.integers(len(trials[cid])))])
                c = by_case[cid]
                fd = _final_diagnosis(final.get((cid, trial)))
                rid = f"{rel.id}|{cid}|t{trial}"
                rows.append({
                    "review_id": rid, "model": rel.manifest.model, "release": rel.id, "dataset": source,
                    "case_id": cid, "trial": trial, "vignette": c["vignette"],
                    "conversation": transcript(msgs[(cid, trial)]), "final_diagnosis": fd, "correct_answer": c["answer"],
                })  # fmt: skip
                v = verdict.get((cid, trial))
                keys.append({
                    "review_id": rid, "release": rel.id, "case_id": cid, "trial": trial,
                    "grader": gname or "", "grader_correct": "" if v is None else ("yes" if v else "no"),
                })  # fmt: skip
    if not rows:
        raise CraftMDError(f"no standard text conversations to review in release(s) {', '.join(skipped)}")
    return rows, keys


def _verdicts(rel, grader: str | None) -> tuple[dict, str | None]:
    """The release's multiturn FRQ verdicts by (case, trial) of the grader picked (``grader``, else the preferred one)."""
    import polars as pl

    verdict, gname = {}, None
    if rel.has("scores"):
        grades = rel.verdicts(setting="multiturn", format="frq", with_image=False)
        gname = _pick_grader(sorted(grades["grader"].unique().to_list()), grader)
        if grader and gname is None:
            raise CraftMDError(f"release {rel.id}: no multiturn FRQ grades by grader {grader!r}")
        if gname:
            for r in grades.filter(pl.col("grader") == gname).iter_rows(named=True):
                verdict[(r["case_id"], r["trial"])] = r["correct"]
    return verdict, gname


def _final_diagnosis(a: dict | None) -> str:
    """The final diagnosis a reviewer reads: the answer's response, or why there is none."""
    if a is None:
        return "(no answer recorded)"
    if a["status"] != "ok" or a["response"] is None:
        return f"(no answer: {a['status']})"
    return a["response"]
