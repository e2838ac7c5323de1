"""Submissions: a model's answers from outside the package, validated, graded and scored.

A submission is a JSON Lines or parquet file of ``case_id, trial, setting, format, response`` rows (JSON Schema:
``scoring/submission.schema.json``); :func:`validate_submission` checks it, :func:`submit` makes it a release.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jsonschema_rs
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from craftmd import CraftMDError
from craftmd.dataset import config_file, load_config
from craftmd.registry import slug
from craftmd.release import ANSWERS_SCHEMA, Protocol, RunRecord, write_release

MAX_PROBLEMS = 20
MAX_RESPONSE_CHARS = 20_000
MAX_LINE_BYTES = 1_000_000
#: The longest problem message listed: a hostile value is shown cut, never whole.
MAX_MESSAGE_CHARS = 240
#: Rows read and checked at a time; besides the rows it keeps, the validator holds no more than this.
BATCH_ROWS = 8_192
KEY = ("case_id", "trial", "setting", "format", "with_image")
#: The longest model name a submission may carry (it becomes a release id, a table cell and a figure label).
MAX_MODEL_CHARS = 120


def schema() -> dict:
    """The submission row's JSON Schema, as shipped in the package (its trial limit is :data:`craftmd.release.MAX_TRIALS`)."""
    from craftmd.release import MAX_TRIALS

    rules = json.loads((resources.files("craftmd.scoring") / "submission.schema.json").read_text(encoding="utf-8"))
    rules["properties"]["trial"]["maximum"] = MAX_TRIALS - 1  # the one trial limit (the file says the same)
    return rules


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


def _one_line(msg: str) -> str:
    """A problem's message as one printable line of at most MAX_MESSAGE_CHARS characters."""
    msg = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in " ".join(msg.split()))
    return msg if len(msg) <= MAX_MESSAGE_CHARS else msg[: MAX_MESSAGE_CHARS - 1] + "…"


class _Problems:
    """Every problem counted; the first MAX_PROBLEMS by line kept (file-level problems first)."""

    def __init__(self) -> None:
        self.items: list[tuple[int | None, str]] = []
        self.total = 0

    def add(self, line: int | None, msg: str) -> None:
        self.total += 1
        self.items.append((line, _one_line(msg)))
        if len(self.items) > MAX_PROBLEMS:
            self.items.sort(key=lambda p: p[0] or 0)  # stable: a line's problems keep their order
            del self.items[MAX_PROBLEMS:]

    def listed(self) -> list[tuple[int | None, str]]:
        return sorted(self.items, key=lambda p: p[0] or 0)

    def __bool__(self) -> bool:
        return self.total > 0


def _short(x: object) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:59] + "…"


def _schema_problems(validator: jsonschema_rs.Validator, rules: dict, obj: dict) -> list[str]:
    """What is wrong with a row by the schema, one line each, ordered by field then keyword; ``[]`` for a good row."""
    try:
        if validator.is_valid(obj):
            return []
        errs = validator.iter_errors(obj)
    except ValueError:  # a field nested past the validator's recursion limit: every field of a row is a scalar, so an
        # empty container of the same kind in its place has the same errors (the messages show the row's own values)
        errs = validator.iter_errors({k: type(v)() if isinstance(v, (dict, list)) else v for k, v in obj.items()})
    found = sorted(
        ((list(map(str, e.instance_path)), list(e.schema_path), e.kind.as_dict()) for e in errs),
        key=lambda e: (e[0], str(e[1][-1])),
    )
    try:
        return [_describe_schema_error(rules, obj, *e) for e in found]
    except RecursionError:
        return ["nested too deeply (a row's fields are text, numbers and true/false)"]


def _describe_schema_error(rules: dict, obj: dict, path: list[str], schema_path: list, kind: dict) -> str:
    """One schema error in words: the field, what it holds (the row's own value, cut short) and what the schema asks."""
    where = ".".join(path)
    keyword = schema_path[-1]
    wanted = rules
    for part in schema_path:
        wanted = wanted[part]
    value = obj
    for part in path:
        value = value[part]
    if keyword == "required":
        return f"{kind['property']!r} is missing (required field)"
    if keyword == "additionalProperties":
        extra = sorted(set(value) - set(rules.get("properties", {})))
        return f"unexpected field(s): {', '.join(_short(k) for k in extra)}"
    if keyword == "type":
        return f"field {where!r} has the wrong type: {_short(value)} is not of type {wanted!r}"
    if keyword == "enum":
        return f"unknown {where} {_short(value)}; allowed: {', '.join(map(str, wanted))}"
    if keyword == "maxLength":
        return f"{where} is too long ({len(value):,} characters; at most {wanted:,})"
    if keyword == "pattern":
        return f"{where} {_short(value)} is not a case id (case_<n>)"
    if keyword in ("minimum", "maximum"):
        return f"{where}: {value!r} is {'less' if keyword == 'minimum' else 'greater'} than the {keyword} of {wanted!r}"
    return f"{where or 'row'}: {_short(value)} fails the schema's {keyword!r} ({_short(wanted)})"


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' object hook: an object naming a key twice is refused, never silently the last one."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return obj


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_line(text: str) -> object:
    """One JSON Lines line as a Python value; ``ValueError`` with the reason when it is not one a submission may hold.

    Refused besides malformed JSON: a key given twice in an object, a number too long to read,
    nesting deeper than Python's parser goes, and a lone surrogate (``"\\ud800"``: no character
    of Unicode, so no text that could be stored).
    """
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError:
        raise
    except _DuplicateKey as exc:
        raise ValueError(f"the key {_short(exc.args[0])} is given twice in one object") from None
    except RecursionError:
        raise ValueError("nested too deeply (a row's fields are text, numbers and true/false)") from None
    except ValueError as exc:  # a number of more digits than Python converts (sys.get_int_max_str_digits)
        if "digits" in str(exc):
            raise ValueError("a number too long to read (a row's numbers are small)") from None
        raise ValueError(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a lone surrogate escape (such as \\ud800) is no Unicode character") from None
        except RecursionError:
            raise ValueError("nested too deeply (a row's fields are text, numbers and true/false)") from None
    return obj


def _read_line(f, limit: int) -> tuple[bytes, bool, int]:
    """The next line of ``f`` (at most ``limit`` bytes kept), whether it ended with a newline, its full length."""
    raw = f.readline(limit + 1)
    size = len(raw)
    if len(raw) > limit and not raw.endswith(b"\n"):  # too long: skip the rest without holding it
        while True:
            chunk = f.readline(1 << 20)
            size += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                raw = raw + (b"\n" if chunk.endswith(b"\n") else b"")
                break
    return raw, raw.endswith(b"\n"), size


def _iter_jsonl(path: Path, problems: _Problems) -> Iterator[tuple[int, object]]:
    """(line, value) of every line that is JSON, line by line; the others are problems."""
    blank: list[int] = []  # blank lines before the first that is not: an all-blank file is one problem
    blank_total = 0
    content = False
    with path.open("rb") as f:
        n = 0
        while True:
            raw, ended, size = _read_line(f, MAX_LINE_BYTES + 2)
            if not raw:
                break
            n += 1
            if ended:
                raw = raw[:-1]
                size -= 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
                size -= 1
            if not raw.strip():
                if content:
                    problems.add(n, "empty line")
                else:
                    blank_total += 1
                    if len(blank) < MAX_PROBLEMS:
                        blank.append(n)
                continue
            if not content:
                content = True
                for b in blank:
                    problems.add(b, "empty line")
                problems.total += blank_total - len(blank)
            if size > MAX_LINE_BYTES:
                problems.add(n, f"line too long ({size:,} bytes; at most {MAX_LINE_BYTES:,})")
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.add(n, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
                continue
            try:
                obj = parse_line(text)
            except json.JSONDecodeError as exc:
                cut = not ended and (exc.msg.startswith("Unterminated") or exc.pos >= len(text.rstrip()) - 1)
                if cut:
                    problems.add(n, "truncated line (the JSON object is cut off; was the file written completely?)")
                else:
                    problems.add(n, f"not JSON ({exc.msg} at column {exc.colno})")
                continue
            except ValueError as exc:
                problems.add(n, f"not a row: {exc}")
                continue
            yield n, obj
    if not content:
        problems.total = 0
        problems.items.clear()
        problems.add(None, "empty file (no rows)")


def _iter_parquet(path: Path, problems: _Problems) -> Iterator[tuple[int, object]]:
    """(row number, row) of a parquet file, one batch of rows at a time."""
    try:
        f = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        problems.add(None, f"not a readable parquet file ({exc})")
        return
    names = f.schema_arrow.names
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        problems.add(None, f"column(s) {', '.join(_short(c) for c in dup)} appear more than once")
        return
    if f.metadata.num_rows == 0:
        problems.add(None, "empty file (no rows)")
        return
    first = 1
    batches = f.iter_batches(batch_size=BATCH_ROWS)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            problems.add(first, f"not a readable parquet file from this row on ({exc})")
            return
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:
            rows = _rows_of_bad_batch(batch, first, problems)
        for i, row in enumerate(rows):
            if row is not None:
                yield first + i, row
        first += batch.num_rows


def _rows_of_bad_batch(batch: pa.RecordBatch, first: int, problems: _Problems) -> list[dict | None]:
    """A batch whose text is not all UTF-8: the rows that are, and a problem for each that is not."""
    bad: dict[int, str] = {}
    for name, col in zip(batch.schema.names, batch.columns):
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            for i, v in enumerate(col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary()).to_pylist()):
                if v is not None and i not in bad:
                    try:
                        v.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        bad[i] = f"{name} is not UTF-8 (byte 0x{v[exc.start]:02x} at character {exc.start + 1})"
    rows: list[dict | None] = []
    for i in range(batch.num_rows):
        if i in bad:
            problems.add(first + i, bad[i])
            rows.append(None)
        else:
            try:
                rows.append(batch.slice(i, 1).to_pylist()[0])
            except UnicodeDecodeError as exc:  # text nested in a list or struct column
                problems.add(first + i, f"text that is not UTF-8 ({exc.reason})")
                rows.append(None)
    return rows


def iter_rows(path: Path | str, problems: _Problems) -> Iterator[tuple[int, object]]:
    """A submission's rows, read a line (JSON Lines) or a batch of rows (parquet) at a time."""
    path = Path(path)
    if not path.is_file():
        raise CraftMDError(f"no submission file at {path}")
    if path.suffix == ".parquet":
        return _iter_parquet(path, problems)
    if path.suffix in (".jsonl", ".ndjson", ".json"):
        return _iter_jsonl(path, problems)
    raise CraftMDError(f"{path}: a submission is a .jsonl or .parquet file")


def dataset_cases(dataset_dir: Path | str, config: str = "all") -> dict[bool, pl.DataFrame]:
    """The cases a submission may answer: text cases (with_image false) and NEJM image cases (true)."""
    out = {False: load_config(dataset_dir, config).select("case_id", "source", "specialty")}
    if config == "all" and config_file(dataset_dir, "nejm_image").exists():
        out[True] = pl.read_parquet(config_file(dataset_dir, "nejm_image"), columns=["case_id", "source", "specialty"])
    return out


JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true/false", type(None): "null"}
#: What the validator reads off each good row: its line, its key as one integer, its response.
ROW_SCHEMA = {"line": pl.Int64, "key": pl.Int64, "response": pl.Utf8}


class _Keys:
    """An answer's key (with_image, case, trial, setting, format) as one integer, and back.

    ``key = (((with_image * cases + case) * trials + trial) * settings + setting) * formats + format``
    where case, setting and format are positions in the dataset's case list and the schema's enums.
    """

    def __init__(self, cases: dict[bool, pl.DataFrame], rules: dict):
        self.index = {w: {c: i for i, c in enumerate(df["case_id"].to_list())} for w, df in cases.items()}
        self.settings = {x: i for i, x in enumerate(rules["properties"]["setting"]["enum"])}
        self.formats = {x: i for i, x in enumerate(rules["properties"]["format"]["enum"])}
        self.trials = rules["properties"]["trial"]["maximum"] + 1
        self.n_cases = max((len(ix) for ix in self.index.values()), default=0) or 1
        self.cell_size = len(self.formats) * len(self.settings) * self.trials  # keys per case
        # Every case id (text cases, then image cases), setting and format, as categoricals a key's parts index.
        self.ids = pl.concat([df.get_column("case_id") for df in cases.values()]).cast(pl.Categorical)
        self.offset = len(self.index.get(False, ()))  # where the image cases start in ids
        self._settings = pl.Series(list(self.settings), dtype=pl.Categorical)
        self._formats = pl.Series(list(self.formats), dtype=pl.Categorical)

    def of(self, ci, trial, si, fi, w):
        """The key of those parts (integers or polars expressions)."""
        return (((w * self.n_cases + ci) * self.trials + trial) * len(self.settings) + si) * len(self.formats) + fi

    def cell(self) -> pl.Expr:
        """A key with its case taken out: the cell (setting, format, trial, image flag) it answers."""
        k = pl.col("key")
        return k % self.cell_size + k // (self.cell_size * self.n_cases) * (self.cell_size * self.n_cases)

    def decode(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` with its key's parts (case_id, trial, setting, format, with_image) as columns, in its order."""
        k = pl.col("key")
        fi, si = k % len(self.formats), k // len(self.formats) % len(self.settings)
        trial = k // (len(self.formats) * len(self.settings)) % self.trials
        ci, w = k // self.cell_size % self.n_cases, k // (self.cell_size * self.n_cases)
        return frame.with_columns(
            case_id=pl.lit(self.ids).gather(ci + w * self.offset), trial=trial.cast(pl.Int16),
            setting=pl.lit(self._settings).gather(si), format=pl.lit(self._formats).gather(fi), with_image=w.cast(pl.Boolean),
        )  # fmt: skip


def validate_submission(path: Path | str, dataset_dir: Path | str, *, config: str = "all") -> Validated:
    """Check a submission completely; raise :class:`SubmissionError` listing its problems.

    A submission is a JSON Lines file (one object per line) or a parquet file with the columns ``case_id, trial, setting,
    format, response`` (and optionally ``with_image``); the JSON Schema is ``scoring/submission.schema.json`` (``craftmd
    submit --schema`` prints it). Every problem is listed (the first :data:`MAX_PROBLEMS` by line, and how many more) with
    its line: empty file, bytes that are not UTF-8, a line that is not JSON or is cut off or too long, a key given twice,
    nesting too deep, a number too long, a lone surrogate, a missing or mistyped field, an unknown case, setting or format,
    a duplicate row, an oversized response. Each message is one printable line, a hostile value in it cut short. Nothing is
    graded or written unless it passes.

    The file is read a line (or a parquet batch) at a time: what the check holds besides the rows it keeps is one batch,
    whatever the file's size. A good row is kept as its response, its line and its key as one integer (:class:`_Keys`) with
    the key's parts as categoricals, so finding repeated rows and unanswered cases costs a few bytes a row.
    """
    path = Path(path)
    problems = _Problems()
    rows = iter_rows(path, problems)
    cases = dataset_cases(dataset_dir, config)
    rules = schema()
    keys = _Keys(cases, rules)
    validator = jsonschema_rs.validator_for(rules)  # accepts a good row in a microsecond, says what is wrong with the others
    frames: list[pl.DataFrame] = []
    cols: dict[str, list] = {c: [] for c in ROW_SCHEMA}

    def flush() -> None:
        if cols["line"]:
            frames.append(keys.decode(pl.DataFrame(cols, schema=ROW_SCHEMA)))
            for v in cols.values():
                v.clear()

    for n, obj in rows:
        if not isinstance(obj, dict):
            problems.add(n, f"expected a JSON object, found {JSON_TYPES.get(type(obj), type(obj).__name__)}")
            continue
        described = _schema_problems(validator, rules, obj)
        if described:
            for d in described:
                problems.add(n, d)
            continue
        w = bool(obj.get("with_image", False))
        ci = keys.index.get(w, {}).get(obj["case_id"])
        if ci is None:
            what = "NEJM image case" if w else f"case of the {config!r} config"
            problems.add(n, f"unknown case {_short(obj['case_id'])} (not a {what} of the dataset)")
            continue
        cols["line"].append(n)
        cols["key"].append(keys.of(ci, int(obj["trial"]), keys.settings[obj["setting"]], keys.formats[obj["format"]], int(w)))
        cols["response"].append(obj["response"])
        if len(cols["line"]) >= BATCH_ROWS:
            flush()
    flush()
    kept = pl.concat(frames, how="vertical", rechunk=False) if frames else keys.decode(pl.DataFrame(schema=ROW_SCHEMA))
    frames.clear()
    _duplicates(kept, problems)
    if problems:
        raise SubmissionError(path, problems.listed(), problems.total)
    cells, missing = _unanswered(kept, keys)
    return Validated(path, kept.select(*KEY, "response"), cells, missing)


def _duplicates(kept: pl.DataFrame, problems: _Problems) -> None:
    """A key given on several lines: each repeat is a problem naming the line that gave it first (sorting the keys
    finds them)."""
    if kept.height and (kept.get_column("key").sort().diff() == 0).any():
        dup = kept.filter(pl.col("key").is_duplicated()).with_columns(first=pl.col("line").min().over("key"))
        for r in dup.filter(pl.col("line") != pl.col("first")).sort("line").iter_rows(named=True):
            problems.add(
                r["line"],
                f"duplicate row: {r['case_id']} trial {r['trial']} {r['setting']}/{r['format']} already on line {r['first']}",
            )


def _unanswered(kept: pl.DataFrame, keys: _Keys) -> tuple[list[tuple], pl.DataFrame]:
    """The cells answered (setting, format, trial, with_image) and the cases each leaves unanswered: a cell short of the
    dataset's cases has missing ones."""
    answered = kept.group_by(key=keys.cell()).agg(n=pl.len())
    cell_rows = keys.decode(answered).with_columns(pl.col("setting", "format").cast(pl.Utf8))
    cells = sorted(cell_rows.select("setting", "format", "trial", "with_image").iter_rows())
    short = cell_rows.filter(
        pl.col("n") < pl.when(pl.col("with_image")).then(len(keys.index.get(True, ()))).otherwise(len(keys.index[False]))
    )
    missing = []
    for (w,), part in short.group_by("with_image"):
        expected = part.select("key").join(
            pl.DataFrame({"ci": pl.int_range(len(keys.index[w]), dtype=pl.Int64, eager=True)}), how="cross"
        )
        gone = expected.select(key=pl.col("key") + pl.col("ci") * keys.cell_size).join(kept.select("key"), on="key", how="anti")
        missing.append(keys.decode(gone))
    empty = keys.decode(pl.DataFrame(schema={"key": pl.Int64}))
    missing = (
        pl.concat([empty, *missing], how="vertical")
        .sort("key")
        .with_columns(pl.col("case_id", "setting", "format").cast(pl.Utf8))
    )
    missing = missing.sort("setting", "format", "trial", "with_image", maintain_order=True).select(*KEY)
    return cells, missing


def check_model_name(model: str) -> str:
    """A submitted model's name, refused with one line when it holds control characters or is absurdly long.

    It may hold anything printable up to :data:`MAX_MODEL_CHARS` characters; what it may hold otherwise (``$``, ``|``,
    ``<``, a leading ``=``) is escaped where it is shown:
    the figures draw it as plain text, the markdown and CSV tables escape it.
    """
    if not model or not model.strip():
        raise CraftMDError("--model: the model name is empty")
    if len(model) > MAX_MODEL_CHARS:
        raise CraftMDError(f"--model: the model name is {len(model):,} characters long (at most {MAX_MODEL_CHARS})")
    bad = next((c for c in model if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")), None)
    if bad is not None:
        raise CraftMDError(f"--model: the model name holds the control character {ascii(bad)}; use printable characters")
    return model


def _slug(name: str) -> str:
    check_model_name(name)
    s = slug(name, "-")
    if not s:
        raise CraftMDError(f"model name {name!r} gives an empty release id")
    return s


def submission_id(model: str) -> str:
    """A submission's release id: ``submission-<slug of the name>-<8 hex of the name's sha256>``. The slug keeps it
    readable; the hash of the exact name keeps two names with one slug (``acme/med-7b``, ``acme med 7b``) apart."""
    import hashlib

    return f"submission-{_slug(model)}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def answers_table(v: Validated) -> pa.Table:
    """The release's answers: submitted rows (ok, or missing when response is null/empty) + unanswered rows."""
    sub = (
        v.rows.with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
        .with_columns(
            status=pl.when(pl.col("response").is_null() | (pl.col("response").str.strip_chars() == ""))
            .then(pl.lit("missing"))
            .otherwise(pl.lit("ok")),
        )
        .with_columns(
            response=pl.when(pl.col("status") == "ok").then(pl.col("response")).otherwise(None), error=pl.lit(None, pl.Utf8)
        )
    )
    miss = v.missing.with_columns(response=pl.lit(None, pl.Utf8), status=pl.lit("missing"), error=pl.lit(None, pl.Utf8))
    both = pl.concat([sub.select(ANSWERS_SCHEMA.names), miss.select(ANSWERS_SCHEMA.names)], how="vertical_relaxed")
    return both.to_arrow().cast(ANSWERS_SCHEMA)


def read_conversations(path: Path | str, answers: pa.Table, dataset_dir: Path | str, config: str = "all") -> pa.Table:
    """A submission's conversations (a parquet file in the release's conversations schema), checked as a release's are.

    Beside the release contract (columns, types, conversation kinds and endings, one row per key), every answer
    given in a conversational setting (multi-turn, single-turn, summarized, ...) must have the conversation it
    was asked about, and every conversation must be of a case of the dataset. One line says what is wrong.
    """
    from craftmd.release import conform
    from craftmd.tasks import declaring

    TASK = declaring("submissions")

    path = Path(path)
    if path.suffix != ".parquet" or not path.is_file():
        raise CraftMDError(f"--conversations {path}: no such parquet file (the release's conversations.parquet schema)")
    try:
        table = pq.read_table(path)
        table.validate(full=True)  # text that is not UTF-8, offsets out of range
    except (pa.ArrowException, OSError) as exc:
        raise CraftMDError(f"{path}: not a readable parquet file ({_one_line(str(exc))})") from None
    try:
        table = conform("conversations", table, TASK)
    except CraftMDError as exc:
        raise CraftMDError(f"{path}: {_one_line(str(exc))}") from None
    conv = pl.from_arrow(table).select("case_id", "trial", "conversation", "with_image")
    known = pl.concat([df.select("case_id", with_image=pl.lit(w)) for w, df in dataset_cases(dataset_dir, config).items()])
    stray = conv.join(known, on=["case_id", "with_image"], how="anti")
    if stray.height:
        r = stray.row(0, named=True)
        raise CraftMDError(
            f"{path}: {stray.height} conversation(s) of cases not in the dataset, e.g. {_short(r['case_id'])} trial {r['trial']}"
        )
    kinds = pl.DataFrame(
        [(e.setting, e.format, e.conversation) for e in TASK.experiments if e.conversation],
        schema={"setting": pl.Utf8, "format": pl.Utf8, "conversation": pl.Utf8},
        orient="row",
    )
    needed = pl.from_arrow(answers).filter(pl.col("status") == "ok").join(kinds, on=["setting", "format"])
    lacking = needed.join(conv, on=["case_id", "trial", "conversation", "with_image"], how="anti")
    if lacking.height:
        r = lacking.sort("case_id", "trial", "setting").row(0, named=True)
        raise CraftMDError(
            f"{path}: {lacking.height} answer(s) in conversational settings have no conversation, e.g. {r['case_id']} "
            f"trial {r['trial']} {r['setting']}/{r['format']} (needs its {r['conversation']} conversation)"
        )
    return table


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
    conversations: Path | str | None = None,
    protocol: Path | str | None = None,
) -> tuple[Path, Validated, dict]:
    """Validate and grade a submission into the release ``OUT/submission-<model>-<hash>/`` (answers and scores).

    Returns the release's path, the validated submission and each grader's record.
    The release is of kind ``submission`` (the common schema, its grades in ``scores.parquet``, so the leaderboard
    shows it next to the others); ``craftmd submit`` (:mod:`craftmd.commands.submit`) adds the accuracy report beside
    it. Every case of the chosen dataset config that the submission leaves unanswered, for each (setting, format,
    trial) it answers, becomes an answer row with status ``missing``: it is reported and scored as wrong, never skipped.
    Nothing is written unless the submission is valid. ``conversations`` (a parquet file of the
    release's conversations schema) puts the conversations behind its conversational answers in
    the release, checked (:func:`read_conversations`); without them, a submission's answers in
    conversational settings are listed on the leaderboard as self-reported, never ranked. ``protocol`` (a JSON file of
    :class:`craftmd.release.Protocol`) states the protocol its answers were made by; without it the submission's
    protocol is unknown, and the board lists it apart from the paper's runs.
    """
    from craftmd.scoring.grade import grade_answers
    from craftmd.scoring.scorers import dataset_inputs
    from craftmd.scoring.scorers import check_scorers

    stated = read_protocol(protocol) if protocol is not None else None
    v = validate_submission(path, dataset_dir, config=config)
    graders = check_scorers(graders or default_graders(v))
    if not graders:
        raise CraftMDError("nothing to grade: the submission has no mcq4, mcq_many or frq answers")
    release_id = submission_id(model)
    answers = answers_table(v)
    tables = {"answers": answers}
    if conversations is not None:
        tables["conversations"] = read_conversations(conversations, answers, dataset_dir, config)
    scores, records = grade_answers(
        pl.from_arrow(answers), dataset_dir, graders, base_url=base_url, cache=cache, progress=progress
    )
    ds_sha = None
    from craftmd.release import sha256_file

    if config_file(dataset_dir, config).exists():
        ds_sha = sha256_file(config_file(dataset_dir, config))
    manifest = _submission_record(release_id, model, config, ds_sha, path, conversations, v, answers)
    manifest.protocol = stated
    inputs = dataset_inputs(dataset_dir)
    records = {g: dict(r, inputs=inputs) for g, r in records.items()}
    rel_path = write_release(Path(out_dir) / release_id, manifest, tables, scores=(scores, records))
    return rel_path, v, records


def read_protocol(path: Path | str) -> Protocol:
    """The protocol a submission states (``--protocol FILE``: a JSON object of :class:`craftmd.release.Protocol`);
    anything else is one line naming the file."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise CraftMDError(f"--protocol {path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CraftMDError(f"--protocol {path}: not a JSON object (a protocol: task, version, prompt_set, roles, ...)") from None
    if not isinstance(data, dict):
        raise CraftMDError(f"--protocol {path}: not a JSON object (a protocol: task, version, prompt_set, roles, ...)")
    try:
        return Protocol.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise CraftMDError(f"--protocol {path}: {'.'.join(str(x) for x in e['loc']) or 'protocol'}: {e['msg']}") from None


def _submission_record(release_id, model, config, ds_sha, path, conversations, v: Validated, answers: pa.Table) -> RunRecord:
    """A submission release's run record: its task (the one that takes submissions, CRAFT-MD's), dataset, files, the
    model in the doctor's role, its answers' counts."""
    from craftmd.tasks import declaring

    task = declaring("submissions")
    status = pl.from_arrow(answers)["status"].value_counts().sort("status")
    return RunRecord(
        release=release_id,
        kind="submission",
        task=task.name,
        model=model,
        display_name=f"{model} (submission)",
        dataset={"name": task.dataset, "config": config, "sha256": ds_sha},
        source={
            "dataset_config": config,
            "dataset_sha256": ds_sha,
            "submission_file": Path(path).name,
            **({"conversations_file": Path(conversations).name} if conversations is not None else {}),
        },
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


def validate_cli(args) -> int:
    v = validate_submission(args.submission, args.dataset, config=args.config)
    s = v.summary()
    print(json.dumps(s, indent=2))
    if s["missing_answers"]:
        print(f"note: {s['missing_answers']} answer(s) over {s['missing_cases']} case(s) are not in the submission; "
              "they will be scored as wrong", file=__import__("sys").stderr)  # fmt: skip
    return 0


__all__ = [
    "validate_submission",
    "submit",
    "default_graders",
    "schema",
    "schema_text",
    "SubmissionError",
    "Validated",
    "MAX_PROBLEMS",
    "MAX_RESPONSE_CHARS",
    "check_model_name",
    "read_conversations",
    "parse_line",
    "iter_rows",
]
