"""Grade a release's answers: add or replace graders' rows in its ``grades.parquet``.

Graders (names as in ``grades.grader``):

* ``paper``, ``strict``: the two MCQ rules of :func:`craftmd.scoring.mcq.grade_mcq`, on
  ``mcq4`` (the case's four choices) and ``mcq_many`` (every diagnosis of the dataset's
  ``diagnoses`` config). ``paper`` matches the dataset's ``paper_answer`` (the key the
  published rule used, verbatim), ``strict`` its ``answer``; ingest grades the same way, so
  a resubmitted upstream release scores exactly as the ingested one. NEJM image cases have
  no choices and are not graded by rule.
* ``offline``: the offline FRQ grader (:mod:`craftmd.scoring.offline`), on ``frq``, and on
  ``top3`` (correct when one of the three diagnoses listed names the answer).
* ``llm:<provider/model>``: the paper's two-step grader-AI (:mod:`craftmd.scoring.llm_grader`), on ``frq``.

Every answer row of a graded format gets a grade row; a missing or non-text answer
grades as wrong (``resolved_kind`` none). The release is rewritten atomically
(:func:`craftmd.release.write_release`), its manifest recording each grader: its identity
(rule version, or table and rules hashes) and the inputs it graded (the answers file's and
the dataset's hashes). With ``only_stale=True`` a grader whose record matches both is not
run again (``make leaderboard`` re-grades only what changed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from craftmd import CraftMDError
from craftmd.dataset import config_file, load_config
from craftmd.atomic import sha256_file
from craftmd.release import GRADES_SCHEMA, read_release, write_release

MCQ_RULES = ("paper", "strict")
MCQ_FORMATS = ("mcq4", "mcq_many")
FRQ_FORMATS = ("frq",)
TOP3 = "top3"  # graded by the offline grader: correct when one of the three names the answer
RESERVED = ("upstream-gpt4",)


def check_graders(graders: list[str]) -> list[str]:
    """Validate grader names; returns them de-duplicated, in order."""
    if not graders:
        raise CraftMDError("no grader given (paper, strict, offline, llm:PROVIDER/MODEL)")
    out = []
    for g in graders:
        if g in RESERVED:
            raise CraftMDError(f"grader {g!r} is the recorded upstream label; it cannot be re-run")
        if g in MCQ_RULES or g == "offline":
            pass
        elif g.startswith("llm:"):
            from craftmd.scoring.llm_grader import parse_grader_name

            parse_grader_name(g)
        else:
            raise CraftMDError(f"unknown grader {g!r}; known: paper, strict, offline, llm:PROVIDER/MODEL")
        if g not in out:
            out.append(g)
    return out


def load_cases(dataset_dir: Path | str) -> tuple[dict[tuple[str, bool], tuple[list[str], str, str | None]], list[str]]:
    """``{(case_id, with_image): (choices, answer, paper_answer)}`` and the many-choice option list.

    ``paper_answer`` is the key the ``paper`` MCQ rule matches (upstream's recorded
    ``correct_ans``, verbatim); ``strict`` and the FRQ graders use ``answer``. NEJM image
    cases have no choices and no paper key.
    """
    cases: dict[tuple[str, bool], tuple[list[str], str, str | None]] = {}
    ds = load_config(dataset_dir, "all")
    if "paper_answer" not in ds.columns:
        raise CraftMDError(f"{dataset_dir}: the dataset has no paper_answer column (built by an older craftmd); rebuild it with craftmd build")
    for cid, ch, ans, key in ds.select("case_id", "choices", "answer", "paper_answer").iter_rows():
        cases[(cid, False)] = (list(ch or []), ans, key)
    if config_file(dataset_dir, "nejm_image").exists():
        nj = pl.read_parquet(config_file(dataset_dir, "nejm_image"), columns=["case_id", "answer"])
        for cid, ans in nj.iter_rows():
            cases[(cid, True)] = ([], ans, None)
    many: list[str] = []
    if config_file(dataset_dir, "diagnoses").exists():
        many = load_config(dataset_dir, "diagnoses")["diagnosis"].to_list()
    return cases, many


def grade_answers(
    answers: pl.DataFrame,
    dataset_dir: Path | str,
    graders: list[str],
    *,
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
) -> tuple[pa.Table, dict]:
    """Grade answer rows (the release's answers schema) -> (grades table, per-grader record)."""
    graders = check_graders(graders)
    cases, many = load_cases(dataset_dir)
    unknown = sorted({c for c, w in answers.select("case_id", "with_image").iter_rows() if (c, w) not in cases})
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CraftMDError(f"answer for case {unknown[0]}{more} not in the dataset at {dataset_dir}")
    cols = {f.name: [] for f in GRADES_SCHEMA}
    records: dict[str, dict] = {}

    def emit(row: dict, grader: str, resolved, kind: str, correct: bool, detail: str | None) -> None:
        for k in ("case_id", "trial", "setting", "format", "with_image"):
            cols[k].append(row[k])
        cols["grader"].append(grader)
        cols["resolved"].append(resolved)
        cols["resolved_kind"].append(kind)
        cols["correct"].append(bool(correct))
        cols["detail"].append(detail)

    mcq = answers.filter(pl.col("format").is_in(MCQ_FORMATS)).to_dicts()
    frq = answers.filter(pl.col("format").is_in(FRQ_FORMATS)).to_dicts()
    top3 = answers.filter(pl.col("format") == TOP3).to_dicts()
    for g in graders:
        if g in MCQ_RULES:
            from craftmd.scoring.mcq import grade_mcq

            n = 0
            for row in tqdm(mcq, desc=f"grade {g}", unit="answer", disable=not progress or not mcq):
                choices, answer, paper_answer = cases[(row["case_id"], row["with_image"])]
                if g == "paper":  # the key the published rule matched, verbatim (see load_cases)
                    answer = paper_answer
                if row["format"] == "mcq_many":
                    if not many:
                        raise CraftMDError(f"{dataset_dir}: no 'diagnoses' config, needed to grade mcq_many answers")
                    choices = many
                if not choices:  # NEJM image cases: no options, not gradable by rule
                    continue
                resolved, kind, correct = grade_mcq(row["response"], choices, answer, g)
                emit(row, g, resolved, kind, correct, None)
                n += 1
            records[g] = dict(grader_identity(g), graded=n)
        elif g == "offline":
            from craftmd.scoring.offline import default_grader

            og = default_grader()
            for row in tqdm(frq, desc="grade offline", unit="answer", disable=not progress or not frq):
                answer = cases[(row["case_id"], row["with_image"])][1]
                r = og.grade(row["response"], answer)
                emit(row, g, r.resolved, r.resolved_kind, r.correct, r.detail)
            for row in top3:
                answer = cases[(row["case_id"], row["with_image"])][1]
                r = og.grade_top3(row["response"], answer)
                emit(row, g, r.resolved, r.resolved_kind, r.correct, r.detail)
            records[g] = dict(grader_identity(g), graded=len(frq) + len(top3))
        else:
            from craftmd.scoring.llm_grader import LLMGrader, parse_grader_name

            lg = LLMGrader(parse_grader_name(g), base_url=base_url, cache=cache)
            pairs = [(row["response"], cases[(row["case_id"], row["with_image"])][1]) for row in frq]
            results = lg.grade_many(pairs, progress=progress)
            for row, r in zip(frq, results):
                emit(row, g, r.resolved, r.resolved_kind, r.correct, r.detail)
            records[g] = dict(lg.record(), graded=len(frq), failures=sum(r.failed for r in results))
    return pa.table(cols, schema=GRADES_SCHEMA), records


def grader_identity(grader: str) -> dict | None:
    """What a release records about a deterministic grader (None for an LLM grader)."""
    if grader in MCQ_RULES:
        from craftmd.scoring.mcq import RULES_VERSION

        return {"rule": grader, "rules_version": RULES_VERSION}
    if grader == "offline":
        from craftmd.scoring.offline import default_grader

        return default_grader().version
    return None


def dataset_fingerprint(dataset_dir: Path | str) -> str:
    """sha256 over the dataset files grading reads (``all``, ``nejm_image``, ``diagnoses``)."""
    parts = []
    for config in ("all", "nejm_image", "diagnoses"):
        f = config_file(dataset_dir, config)
        parts.append(f"{config}:{sha256_file(f) if f.exists() else '-'}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def grading_inputs(manifest, dataset_dir: Path | str) -> dict:
    """What a grade depends on besides the grader: the release's answers file and the dataset."""
    return {"answers_sha256": manifest.files["answers.parquet"]["sha256"], "dataset_sha256": dataset_fingerprint(dataset_dir)}


def stale_graders(release_dir: Path | str, dataset_dir: Path | str, graders: list[str]) -> list[str]:
    """Those of ``graders`` whose recorded identity or inputs differ from now (LLM graders: always)."""
    manifest = read_release(release_dir).manifest
    recorded = manifest.notes.get("graders", {})
    inputs = grading_inputs(manifest, dataset_dir)
    stale = []
    for g in check_graders(graders):
        ident, rec = grader_identity(g), recorded.get(g) or {}
        if ident is None or rec.get("inputs") != inputs or any(rec.get(k) != v for k, v in ident.items()):
            stale.append(g)
    return stale


def grade_release(
    release_dir: Path | str,
    dataset_dir: Path | str,
    graders: list[str],
    *,
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
    only_stale: bool = False,
) -> Path:
    """Add (or replace) ``graders``' rows in the release's grades; rewrite it atomically.

    With ``only_stale``, graders whose recorded identity and inputs are current are
    skipped; when none is left the release is not touched.
    """
    release_dir = Path(release_dir)
    graders = check_graders(graders)
    if only_stale:
        graders = stale_graders(release_dir, dataset_dir, graders)
        if not graders:
            return release_dir
    rel = read_release(release_dir)
    answers = pl.from_arrow(rel.table("answers"))
    new, records = grade_answers(answers, dataset_dir, graders, base_url=base_url, cache=cache, progress=progress)
    tables = {"answers": rel.table("answers")}
    if rel.has("conversations"):
        tables["conversations"] = rel.table("conversations")
    if rel.has("grades"):
        old = rel.table("grades")
        keep = old.filter(pc.invert(pc.is_in(old.column("grader"), pa.array(graders))))
        new = pa.concat_tables([keep.cast(GRADES_SCHEMA), new])
    tables["grades"] = new
    m = rel.manifest
    notes = dict(m.notes)
    recorded = dict(notes.get("graders", {}))
    inputs = grading_inputs(m, dataset_dir)
    for g, info in records.items():
        recorded[g] = dict(info, inputs=inputs)
    notes["graders"] = dict(sorted(recorded.items()))
    m.notes = notes
    per: dict[str, dict] = {}
    for g, ok in zip(new.column("grader").to_pylist(), new.column("correct").to_pylist()):
        e = per.setdefault(g, {"rows": 0, "correct": 0})
        e["rows"] += 1
        e["correct"] += bool(ok)
    m.counts = dict(m.counts, grades=dict(sorted(per.items())))
    return write_release(release_dir, m, tables, overwrite=True)


def grade_cli(args) -> int:
    out = grade_release(args.release, args.data, args.grader, base_url=args.base_url, cache=args.cache, progress=not args.quiet)
    print(json.dumps({"release": str(out), "graders": args.grader}))
    return 0


__all__ = ["grade_release", "grade_answers", "check_graders", "load_cases", "stale_graders", "grader_identity", "MCQ_RULES"]
