"""Submissions: a model's answers from outside the package, validated, graded and scored.

A submission is a JSON Lines file (one object per line) or a parquet file with the columns
``case_id, trial, setting, format, response`` (and optionally ``with_image``); the JSON
Schema is ``scoring/submission.schema.json`` (``craftmd submit --schema`` prints it).

:func:`validate_submission` reads the whole file and lists every problem (up to
:data:`MAX_PROBLEMS`) with its line: empty file, bytes that are not UTF-8, a line that is
not JSON or is cut off, a missing or mistyped field, an unknown case, setting or format, a
duplicate row, an oversized response. Nothing is graded or written unless it passes.

:func:`submit` turns a valid submission into a release of kind ``submission`` (the common
schema, its grades in ``scores.parquet``, so the leaderboard shows it next to the others);
``craftmd submit`` (:mod:`craftmd.submit`) adds the accuracy report beside it.
Every case of the chosen dataset config that the submission leaves unanswered, for each
(setting, format, trial) it answers, becomes an answer row with status ``missing``: it is
reported and scored as wrong, never skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jsonschema
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError
from craftmd.dataset import config_file, load_config
from craftmd.release import ANSWERS_SCHEMA, Manifest, write_release

MAX_PROBLEMS = 20
MAX_RESPONSE_CHARS = 20_000
MAX_LINE_BYTES = 1_000_000
KEY = ("case_id", "trial", "setting", "format", "with_image")


def schema() -> dict:
    """The submission row's JSON Schema, as shipped in the package."""
    return json.loads((resources.files("craftmd.scoring") / "submission.schema.json").read_text(encoding="utf-8"))


def schema_text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


class SubmissionError(CraftMDError):
    """A submission that does not pass validation; ``problems`` lists (line, message)."""

    def __init__(self, path: Path, problems: list[tuple[int | None, str]], total: int):
        self.path = path
        self.problems = problems
        self.total = total
        lines = [f"{path}: {total} problem(s); nothing was graded or written"]
        for line, msg in problems:
            lines.append(f"  {path.name}:{line}: {msg}" if line else f"  {path.name}: {msg}")
        if total > len(problems):
            lines.append(f"  ... and {total - len(problems)} more")
        super().__init__("\n".join(lines))


@dataclass
class Validated:
    """A submission that passed: its rows and what it covers."""

    path: Path
    rows: pl.DataFrame  # case_id, trial, setting, format, with_image, response
    cells: list[tuple[str, str, int, bool]] = field(default_factory=list)  # (setting, format, trial, with_image) answered
    missing: pl.DataFrame | None = None  # rows of the dataset not answered in those cells

    def summary(self) -> dict:
        miss = self.missing if self.missing is not None else pl.DataFrame()
        return {
            "file": self.path.name,
            "rows": self.rows.height,
            "cases": self.rows["case_id"].n_unique(),
            "cells": [{"setting": s, "format": f, "trial": t, "with_image": w} for s, f, t, w in self.cells],
            "missing_answers": miss.height,
            "missing_cases": 0 if miss.is_empty() else miss["case_id"].n_unique(),
        }


class _Problems:
    def __init__(self) -> None:
        self.items: list[tuple[int | None, str]] = []
        self.total = 0

    def add(self, line: int | None, msg: str) -> None:
        self.total += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append((line, msg))

    def __bool__(self) -> bool:
        return self.total > 0


def _describe_schema_error(err: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "required":
        return err.message.replace("is a required property", "is missing (required field)")
    if err.validator == "additionalProperties":
        return f"unexpected field(s): {err.message.split('(')[-1].rstrip(')')}"
    if err.validator == "type":
        return f"field {where!r} has the wrong type: {err.message}"
    if err.validator == "enum":
        return f"unknown {where} {err.instance!r}; allowed: {', '.join(map(str, err.validator_value))}"
    if err.validator == "maxLength":
        return f"{where} is too long ({len(err.instance):,} characters; at most {err.validator_value:,})"
    if err.validator == "pattern":
        return f"{where} {err.instance!r} is not a case id (case_<n>)"
    return f"{where or 'row'}: {err.message}"


def _read_jsonl(path: Path, problems: _Problems) -> list[tuple[int, dict]]:
    data = path.read_bytes()
    if not data.strip():
        problems.add(None, "empty file (no rows)")
        return []
    rows = []
    lines = data.split(b"\n")
    last = len(lines)
    if lines and lines[-1] == b"":
        lines = lines[:-1]
        last = len(lines) + 1  # the file ends with a newline: no line is cut off
    for n, raw in enumerate(lines, 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            problems.add(n, "empty line")
            continue
        if len(raw) > MAX_LINE_BYTES:
            problems.add(n, f"line too long ({len(raw):,} bytes; at most {MAX_LINE_BYTES:,})")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.add(n, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            cut = n == last and (exc.msg.startswith("Unterminated") or exc.pos >= len(text.rstrip()) - 1)
            if cut:
                problems.add(n, "truncated line (the JSON object is cut off; was the file written completely?)")
            else:
                problems.add(n, f"not JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            problems.add(n, f"expected a JSON object, found {type(obj).__name__}")
            continue
        rows.append((n, obj))
    return rows


def _read_parquet(path: Path, problems: _Problems) -> list[tuple[int, dict]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        problems.add(None, f"not a readable parquet file ({exc})")
        return []
    if table.num_rows == 0:
        problems.add(None, "empty file (no rows)")
        return []
    return [(i + 1, row) for i, row in enumerate(table.to_pylist())]


def read_rows(path: Path | str) -> tuple[list[tuple[int, dict]], _Problems]:
    path = Path(path)
    problems = _Problems()
    if not path.is_file():
        raise CraftMDError(f"no submission file at {path}")
    if path.suffix == ".parquet":
        rows = _read_parquet(path, problems)
    elif path.suffix in (".jsonl", ".ndjson", ".json"):
        rows = _read_jsonl(path, problems)
    else:
        raise CraftMDError(f"{path}: a submission is a .jsonl or .parquet file")
    return rows, problems


def dataset_cases(dataset_dir: Path | str, config: str = "all") -> dict[bool, pl.DataFrame]:
    """The cases a submission may answer: text cases (with_image false) and NEJM image cases (true)."""
    out = {False: load_config(dataset_dir, config).select("case_id", "source", "specialty")}
    if config == "all" and config_file(dataset_dir, "nejm_image").exists():
        out[True] = pl.read_parquet(config_file(dataset_dir, "nejm_image"), columns=["case_id", "source", "specialty"])
    return out


def validate_submission(path: Path | str, dataset_dir: Path | str, *, config: str = "all") -> Validated:
    """Check a submission completely; raise :class:`SubmissionError` listing its problems."""
    path = Path(path)
    rows, problems = read_rows(path)
    cases = dataset_cases(dataset_dir, config)
    known = {w: set(df["case_id"].to_list()) for w, df in cases.items()}
    validator = jsonschema.Draft202012Validator(schema())
    seen: dict[tuple, int] = {}
    good: list[dict] = []
    for n, obj in rows:
        errs = sorted(validator.iter_errors(obj), key=lambda e: (list(e.absolute_path), e.validator))
        if errs:
            for e in errs:
                problems.add(n, _describe_schema_error(e))
            continue
        w = bool(obj.get("with_image", False))
        if obj["case_id"] not in known.get(w, set()):
            what = "NEJM image case" if w else f"case of the {config!r} config"
            problems.add(n, f"unknown case {obj['case_id']!r} (not a {what} of the dataset)")
            continue
        key = (obj["case_id"], obj["trial"], obj["setting"], obj["format"], w)
        if key in seen:
            problems.add(n, f"duplicate row: {obj['case_id']} trial {obj['trial']} {obj['setting']}/{obj['format']} already on line {seen[key]}")
            continue
        seen[key] = n
        good.append({"case_id": obj["case_id"], "trial": obj["trial"], "setting": obj["setting"], "format": obj["format"], "with_image": w, "response": obj["response"]})
    if problems:
        raise SubmissionError(path, problems.items, problems.total)
    df = pl.DataFrame(good, schema={"case_id": pl.Utf8, "trial": pl.Int16, "setting": pl.Utf8, "format": pl.Utf8, "with_image": pl.Boolean, "response": pl.Utf8})
    cells = sorted({(s, f, t, w) for s, f, t, w in df.select("setting", "format", "trial", "with_image").iter_rows()})
    # Every case of the dataset, in every answered cell: what is not there is missing.
    cell_df = pl.DataFrame(cells, schema={"setting": pl.Utf8, "format": pl.Utf8, "trial": pl.Int16, "with_image": pl.Boolean}, orient="row")
    expected = pl.concat(
        [cell_df.filter(pl.col("with_image") == w).join(c.select("case_id"), how="cross") for w, c in cases.items()],
        how="vertical",
    ).select(list(KEY[:4]) + ["with_image"])
    missing = expected.join(df.select(list(KEY)), on=list(KEY), how="anti")
    return Validated(path, df, cells, missing)


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not s:
        raise CraftMDError(f"model name {name!r} gives an empty release id")
    return s


def answers_table(v: Validated) -> pa.Table:
    """The release's answers: submitted rows (ok, or missing when response is null/empty) + unanswered rows."""
    sub = v.rows.with_columns(
        status=pl.when(pl.col("response").is_null() | (pl.col("response").str.strip_chars() == "")).then(pl.lit("missing")).otherwise(pl.lit("ok")),
    ).with_columns(response=pl.when(pl.col("status") == "ok").then(pl.col("response")).otherwise(None), error=pl.lit(None, pl.Utf8))
    miss = v.missing.with_columns(response=pl.lit(None, pl.Utf8), status=pl.lit("missing"), error=pl.lit(None, pl.Utf8))
    both = pl.concat([sub.select(ANSWERS_SCHEMA.names), miss.select(ANSWERS_SCHEMA.names)], how="vertical_relaxed")
    return both.to_arrow().cast(ANSWERS_SCHEMA)


def default_graders(v: Validated) -> list[str]:
    fmts = {f for _, f, _, _ in v.cells}
    out = []
    if fmts & {"mcq4", "mcq_many"}:
        out += ["paper", "strict"]
    if fmts & {"frq", "top3"}:
        out.append("offline")
    return out


def submit(
    path: Path | str,
    dataset_dir: Path | str,
    model: str,
    out_dir: Path | str,
    *,
    graders: list[str] | None = None,
    config: str = "all",
    base_url: str | None = None,
    cache=None,
    progress: bool = True,
) -> tuple[Path, Validated, dict]:
    """Validate and grade a submission into the release ``OUT/submission-<model>/`` (answers and scores).

    Returns the release's path, the validated submission and each grader's record.
    Nothing is written unless the submission is valid.
    """
    from craftmd.scoring.grade import dataset_inputs, grade_answers
    from craftmd.scoring.scorers import check_scorers

    v = validate_submission(path, dataset_dir, config=config)
    graders = check_scorers(graders or default_graders(v))
    if not graders:
        raise CraftMDError("nothing to grade: the submission has no mcq4, mcq_many or frq answers")
    release_id = f"submission-{_slug(model)}"
    answers = answers_table(v)
    scores, records = grade_answers(pl.from_arrow(answers), dataset_dir, graders, base_url=base_url, cache=cache, progress=progress)
    status = pl.from_arrow(answers)["status"].value_counts().sort("status")
    ds_sha = None
    from craftmd.release import sha256_file

    if config_file(dataset_dir, config).exists():
        ds_sha = sha256_file(config_file(dataset_dir, config))
    manifest = Manifest(
        release=release_id,
        kind="submission",
        model=model,
        display_name=f"{model} (submission)",
        dataset={"name": "craftmd", "config": config, "sha256": ds_sha},
        source={"dataset_config": config, "dataset_sha256": ds_sha, "submission_file": Path(path).name},
        roles={"doctor": {"model": model, "base_url": None}},
        producer={"name": "submission", "submission": v.summary()},
        counts={
            "answers": answers.num_rows,
            "answers_by_status": dict(status.iter_rows()),
            "missing_answers": v.missing.height,
        },
        notes={
            "answers": "Cases the submission did not answer (for each setting, format and trial it answered) are "
            "rows with status missing and a null response; every grader counts them wrong.",
        },
    )
    inputs = dataset_inputs(dataset_dir)
    records = {g: dict(r, inputs=inputs) for g, r in records.items()}
    rel_path = write_release(Path(out_dir) / release_id, manifest, {"answers": answers}, scores=(scores, records))
    return rel_path, v, records


def validate_cli(args) -> int:
    v = validate_submission(args.submission, args.dataset, config=args.config)
    s = v.summary()
    print(json.dumps(s, indent=2))
    if s["missing_answers"]:
        print(f"note: {s['missing_answers']} answer(s) over {s['missing_cases']} case(s) are not in the submission; "
              "they will be scored as wrong", file=__import__("sys").stderr)  # fmt: skip
    return 0


__all__ = ["validate_submission", "submit", "default_graders", "schema", "schema_text", "SubmissionError", "Validated", "MAX_PROBLEMS", "MAX_RESPONSE_CHARS"]
