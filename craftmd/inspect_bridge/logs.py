"""Inspect logs in and out of releases: :func:`ingest_logs` (``craftmd ingest --inspect LOG… --out RELEASE``: logs of a
craftmd task → a release, the log's scores kept as claims that ``craftmd score`` checks) and :func:`export_release`
(``craftmd export RELEASE --inspect DIR``: one log per setting and format, for ``inspect view``; ingest gives it back).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from craftmd import CraftMDError, __version__
from craftmd.atomic import MAX_READ_BYTES, inside, open_regular
from craftmd.samples import CRAFTMD
from craftmd.release import (
    ANSWERS_SCHEMA,
    CLAIM_PREFIX,
    CONVERSATIONS_SCHEMA,
    KEYS,
    SCORE_COLUMNS,
    RunRecord,
    conform_scores,
    dependency_versions,
    read_release,
    release_task,
    write_release,
)

from . import STORE_KEY, TASKS, require_inspect

MANIFEST = "craftmd.manifest"  # an exported log's metadata: the release's run record
RECORDS = "craftmd.scorers"  # ... its scorers' records
EXTRA = "craftmd.extra"  # ... rows no exported answer carries (first log only)
SCORE_ORDER = "craftmd.score_columns"  # ... the scores table's column order
CONV_KEY = KEYS["conversations"]
ANSWER_KEY = KEYS["answers"]
#: The deepest nesting of JSON a log may hold (inspect's own logs are a dozen levels deep): deeper is refused before
#: inspect parses it (its reader's memory grows with depth times length: 400 KB of brackets took 20 GB).
MAX_JSON_DEPTH = 100
#: What ingest never reads from a sample (the events hold every model call: most of a log's bytes).
SKIP = {"events", "attachments", "model_usage", "role_usage", "timelines", "output"}


# --- logs -> release ----------------------------------------------------------------------------
def _known_task(log) -> bool:
    """Whether a log is of a task file's task craftmd knows ($CRAFTMD_TASKS): its inspect task is the craftmd task it names."""
    from craftmd.tasks import get_task

    name = ((log.eval.metadata or {}).get(STORE_KEY) or {}).get("task")
    if not isinstance(name, str) or name != log.eval.task or "/" in name or name.endswith(".py"):
        return False
    try:
        get_task(name)
    except CraftMDError:
        return False
    return True


def _check_header(path: Path, log) -> str:
    task = log.eval.task
    if task not in TASKS and not _known_task(log):
        raise CraftMDError(
            f"{path}: a log of task {task!r}, not one of {', '.join(TASKS)} (nor a task file's listed in $CRAFTMD_TASKS)"
        )
    if log.status != "success":
        raise CraftMDError(f"{path}: an unfinished log (status {log.status}); only a finished run becomes a release")
    return task


def _json_depth(f, where: str) -> None:
    """Refuse JSON read from ``f`` (a binary stream) nested deeper than :data:`MAX_JSON_DEPTH`, streaming (nothing
    built); JSON that does not parse is left for inspect's reader to name."""
    import ijson

    depth = 0
    try:
        for event, _ in ijson.basic_parse(f, use_float=True):
            if event in ("start_map", "start_array"):
                depth += 1
                if depth > MAX_JSON_DEPTH:
                    raise CraftMDError(
                        f"{where}: not an inspect log (JSON nested more than {MAX_JSON_DEPTH} levels deep; not read)"
                    )
            elif event in ("end_map", "end_array"):
                depth -= 1
    except ijson.JSONError:
        return


def check_log_bounds(p: Path) -> None:
    """A log read only when bounded: a regular file of at most :data:`~craftmd.atomic.MAX_READ_BYTES` (an ``.eval``
    zip's members too, as they inflate), its JSON at most :data:`MAX_JSON_DEPTH` deep; else one line, before inspect
    reads a byte of it."""
    import zipfile

    with open_regular(p) as f:
        if not zipfile.is_zipfile(f):
            f.seek(0)
            return _json_depth(f, str(p))
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as z:
                members = z.infolist()
                if sum(m.file_size for m in members) > MAX_READ_BYTES:
                    raise CraftMDError(f"{p}: too large as it inflates (more than {MAX_READ_BYTES:,} bytes; not read)")
                for m in members:
                    with z.open(m) as member:
                        _json_depth(member, f"{p} ({m.filename})")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError):
            return  # a damaged zip: inspect's reader names it


def read_logs(paths: list[Path | str]) -> list:
    """The logs, each checked from its header before its samples are read."""
    require_inspect()
    from inspect_ai.log import read_eval_log

    logs, task = [], None
    for p in map(Path, paths):
        if not p.exists():
            raise CraftMDError(f"{p}: no such log")
        check_log_bounds(p)
        try:
            head = read_eval_log(str(p), header_only=True)
        except Exception as exc:  # noqa: BLE001 - an unreadable file, whatever inspect raised
            raise CraftMDError(f"{p}: not an inspect log ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        t = _check_header(p, head)
        if task is not None and t != task:
            raise CraftMDError(f"{p}: a log of {t}, the others are of {task}; one release holds one task")
        task = t
        try:
            logs.append(read_eval_log(str(p), exclude_fields=SKIP))
        except Exception as exc:  # noqa: BLE001 - a sample that is not inspect's EvalSample, whatever inspect raised
            raise CraftMDError(
                f"{p}: a sample is unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None
    if not logs:
        raise CraftMDError("no log given")
    return logs


def _text_messages(messages) -> list[dict]:
    """inspect chat messages as a release's text messages (role, content; images as ``<image>``)."""
    from craftmd.generation.protocol import IMAGE_MARK

    out = []
    for m in messages:
        c = m.content
        if not isinstance(c, str):
            c = "\n".join(p.text if p.type == "text" else IMAGE_MARK for p in c)
        out.append({"role": m.role, "content": c})
    return out


def _rows(logs) -> tuple[list[dict], list[dict], list[dict], dict]:
    """(conversations, answers, score rows, scorer records) of the logs; rows repeated across samples kept once."""
    convs: dict[tuple, dict] = {}
    answers: list[dict] = []
    others: dict[str, dict[str, dict]] = {}  # a task's own tables (the encounters' patient states, ...): rows kept once
    scores: dict[tuple, dict] = {}
    records: dict[str, dict] = {}
    counts: dict[str, dict] = {}

    def add_score(r: dict) -> None:
        key = tuple(sorted((k, v) for k, v in r.items() if k not in ("value", "label", "detail", "status")))
        scores.setdefault(key, r)

    for log in logs:
        meta = log.eval.metadata or {}
        extra = meta.get(EXTRA) or {}
        for c in extra.get("conversations", []):
            convs.setdefault(tuple(c[k] for k in CONV_KEY), c)
        for r in extra.get("scores", []):
            add_score(r)
        records.update(meta.get(RECORDS) or {})
        for s in log.samples or []:
            rows = s.store.get(STORE_KEY)
            if rows is None:
                raise CraftMDError(
                    f"{log.location}: sample {s.id} epoch {s.epoch} has no craftmd rows (not written by craftmd's task)"
                )
            for c in rows.get("conversations", []):
                if "messages" not in c:  # an exported sample: the conversation is the sample's messages, less the answer
                    c = dict(c, messages=_text_messages(s.messages[:-1]))
                convs.setdefault(tuple(c[k] for k in CONV_KEY), c)
            answers += rows.get("answers", [])
            for name, table_rows in rows.items():
                if name not in ("conversations", "answers"):
                    seen = others.setdefault(name, {})
                    for r in table_rows:
                        seen.setdefault(json.dumps(r, sort_keys=True), r)
            for name, sc in (s.scores or {}).items():
                data = (sc.metadata or {}).get(STORE_KEY)
                if not data:
                    continue
                for r in data.get("rows", []):
                    add_score(r)
                if data.get("record") is not None:
                    g = data["rows"][0]["scorer"] if data.get("rows") else None
                    if g:
                        records.setdefault(g, data["record"])
                        c = counts.setdefault(g, {})
                        for k, v in (data.get("counts") or {}).items():
                            c[k] = c.get(k, 0) + v
    for g, c in counts.items():
        if g in records and not any(k in records[g] for k in c):
            records[g] = dict(records[g], **c)
    return list(convs.values()), answers, list(scores.values()), records, {n: list(t.values()) for n, t in others.items()}


def _scores_table(rows: list[dict], columns: list | None) -> pa.Table | None:
    """The score rows as a table: the columns (and types) an exported release recorded, else in the rows' order
    (the answer scorers' variant keys, then the history scorer's ``conversation``, as grade then history write them)."""
    if not rows:
        return None
    if columns:
        schema = pa.schema([pa.field(n, pa.type_for_alias(t)) for n, t in columns])
    else:
        names: list[str] = []
        for r in rows:
            names += [k for k in r if k not in names]
        types = {"with_image": pa.bool_(), "trial": pa.int16()}
        fields = []
        for n in names:
            if n in SCORE_COLUMNS.names:
                fields.append(SCORE_COLUMNS.field(n))
            else:
                v = next((r[n] for r in rows if r.get(n) is not None), None)
                fields.append(
                    pa.field(
                        n,
                        types.get(n)
                        or (pa.bool_() if isinstance(v, bool) else pa.int64() if isinstance(v, int) else pa.string()),
                    )
                )
        schema = pa.schema(fields)
    cols = {n: [r.get(n) for r in rows] for n in schema.names}
    cols["value"] = [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in cols["value"]]
    return pa.table(cols, schema=schema)


def _role(cfg) -> dict:
    """A role's inspect model config as a run record's role (its model and server; never a key)."""
    if isinstance(cfg, list):
        cfg = cfg[0]
    from craftmd.models.openai import public_url

    url = getattr(cfg, "base_url", None)
    return {"model": cfg.model, "base_url": public_url(url) if url else None}


def _roles(spec, desc: dict) -> dict:
    """The run's roles (model, server): as the task run recorded them (its ``roles``), else (older logs) from inspect's
    model roles and the built-in tasks' defaults; the ``grader`` from inspect's model roles."""
    roles_cfg = spec.model_roles or {}
    doctor = {"model": spec.model, "base_url": spec.model_base_url or desc.get("doctor_base_url")}
    if isinstance(desc.get("roles"), dict):
        roles = {a: dict(r) for a, r in desc["roles"].items()}
        roles["doctor"] = doctor
        if "grader" in roles_cfg:
            roles["grader"] = _role(roles_cfg["grader"])
        return roles
    roles = {"doctor": doctor}
    for agent in ("patient", "summarizer", "solver", "grader", "closer"):
        if agent in roles_cfg:
            roles[agent] = _role(roles_cfg[agent])
    roles.setdefault("patient", dict(doctor))
    task = _registered(desc.get("task"))
    if task is not None:  # a role the run did not bind has its default's model, as the runner binds it, where it ran
        active = _active_roles(task, desc)
        for r in task.roles:
            if r.default and r.name in active and r.default in roles:
                roles.setdefault(r.name, dict(roles[r.default]))
    return roles


def _registered(name):
    """The registered task called ``name`` (None for another name: the log's own word is never code that runs)."""
    from craftmd.tasks import BUILTIN, TASKS, get_task

    return get_task(name) if isinstance(name, str) and (name in TASKS or name in BUILTIN) else None


def _active_roles(task, desc: dict) -> tuple[str, ...]:
    """The roles ``task``'s protocol calls with the options the log records (its ``active_roles``: the encounters' tagger
    only with memory tags)."""
    from types import SimpleNamespace

    try:
        options = task.parse_options({k: desc[k] for k in task.options.model_fields if k in desc})
    except CraftMDError:
        options = task.parse_options()
    if task.protocol is None:
        return tuple(r.name for r in task.roles)
    return task.protocol.active_roles(SimpleNamespace(task=task, options=options))


def _protocol(desc: dict, roles: dict, trials: int) -> dict | None:
    """The protocol the logged run ran (:class:`craftmd.release.Protocol`, checked with the rest of the record): its
    task's version as the log records it (a log written before versions were records none), its prompt set, the models
    of its task's roles but the doctor's, whether it showed the doctor images, the MCQ rules, trials; None when the log
    names no task or prompt set."""
    from craftmd.release import UNDER_TEST
    from craftmd.scoring.mcq import answer_rules
    from craftmd.tasks import TASKS as REGISTERED

    name, prompts = desc.get("task"), desc.get("prompt_set")
    if not isinstance(name, str) or name not in REGISTERED or not isinstance(prompts, dict):
        return None
    task = REGISTERED[name]
    names = {r.name for r in task.roles} - {UNDER_TEST}
    return {
        "task": task.name,
        "version": desc.get("version"),
        "prompt_set": {"name": prompts.get("name"), "sha256": prompts.get("sha256")},
        "roles": {a: r.get("model") for a, r in sorted(roles.items()) if a in names and isinstance(r, dict)},
        "images": desc.get("images", False),  # (checked as a bool with the rest of the record)
        "answer_rules": answer_rules(task),
        "trials": trials or None,
    }


def _run_record(log, out: Path, conversations: list[dict], answers: list[dict], where: Path) -> RunRecord:
    """The run record of a release made by ``inspect eval`` of one of the package's tasks."""
    spec = log.eval
    desc = (spec.metadata or {}).get(STORE_KEY) or {}
    roles = _roles(spec, desc)
    sampling = {**(desc.get("sampling") or {}), "seed_rule": "seed + trial"}
    for agent, r in roles.items():
        if agent != "grader":
            r["sampling"] = dict(sampling)
    packages = dict(spec.packages or {})
    keyed = answers or conversations  # an encounters release has conversations and no answers
    trials = max((a["trial"] for a in keyed), default=-1) + 1
    return RunRecord.from_dict(
        dict(
            release=out.name,
            kind="generated",
            task=desc.get("task") or spec.task.split("/", 1)[1],
            model=spec.model,
            **(
                {"task_sha256": desc["task_sha256"]} if desc.get("task_sha256") else {}
            ),  # checked against the file the user names
            source={
                "dataset_config": desc.get("config"),
                "dataset_sha256": desc.get("dataset_sha256"),
                "cases": len({a["case_id"] for a in keyed}),
            },
            prompt_set=desc.get("prompt_set"),
            protocol=_protocol(desc, roles, trials),
            sampling={a: r["sampling"] for a, r in roles.items() if "sampling" in r},
            seed=(desc.get("sampling") or {}).get("seed"),
            models={a: r["model"] for a, r in roles.items()},
            roles=roles,
            producer={
                "inspect": {
                    "task": spec.task,
                    "eval_id": spec.eval_id,
                    "run_id": spec.run_id,
                    "epochs": spec.config.epochs,
                    "inspect_ai": packages.get("inspect_ai"),
                }
            },
            dependencies={
                **dependency_versions(),
                **({"inspect_ai": packages["inspect_ai"]} if "inspect_ai" in packages else {}),
            },
            counts={
                "cases": len({a["case_id"] for a in keyed}),
                "trials": trials,
                "conversations": len(conversations),
                "answers": len(answers),
            },
            notes={
                "settings": desc.get("settings"),
                "formats": desc.get("formats"),
                "max_turns": desc.get("max_turns"),
                "protocol": f"run by inspect eval {spec.task} (inspect_ai {packages.get('inspect_ai')})",
            },
        ),
        f"{where}: not a run of one of craftmd's tasks",
    )  # what the log says (its task, ...) makes no run record: one line


def _claims(rows: list, records: dict) -> tuple[list[dict], dict]:
    """A log's score rows and scorer records as claims: each scorer ``g`` becomes ``claimed:g``
    (:data:`craftmd.release.CLAIM_PREFIX`), its record marked as reported by the log. A log says what it likes about
    its own answers, so its scores are never taken as scores: ``craftmd score`` computes the scorers again and reports a
    claim that disagrees. Every value is checked here, before anything is written: a number (or null), finite."""
    out = []
    for r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("scorer"), str) or not r["scorer"]:
            raise CraftMDError(f"a score of the log is not a score row (a JSON object naming its scorer): {_short(r)}")
        v = r.get("value")
        if isinstance(v, float) and math.isnan(v):
            v = None  # inspect's own null score
        if v is not None and (type(v) not in (int, float) or not math.isfinite(v)):
            raise CraftMDError(
                f"a score of the log is not a finite number: {r['scorer']} {r.get('metric')} of {r.get('case_id')} "
                f"trial {r.get('trial')}: {_short(v)}; nothing was written"
            )
        g = r["scorer"] if r["scorer"].startswith(CLAIM_PREFIX) else CLAIM_PREFIX + r["scorer"]
        out.append(dict(r, scorer=g, value=None if v is None else float(v)))
    if not isinstance(records, dict) or not all(isinstance(rec, dict) for rec in records.values()):
        raise CraftMDError("the log's scorer records are not a JSON object of records")
    claimed = {
        (g if g.startswith(CLAIM_PREFIX) else CLAIM_PREFIX + g): dict(rec, claimed=True, reported_by="an inspect log")
        for g, rec in records.items()
    }
    return out, claimed


def _short(x: object) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:79] + "…"


def _claimed_record(raw, path: Path) -> RunRecord:
    """An exported log's run record, checked (one line for a malformed one). It is the log's claim: only the package's
    own ingest of the pinned source makes an upstream release, so one claimed by a log is ingested as generated."""
    manifest = RunRecord.from_dict(dict(raw, files={}) if isinstance(raw, dict) else raw, f"{path}: the run record it carries")
    if manifest.kind == "upstream":
        manifest.kind = "generated"
        manifest.notes = {
            **manifest.notes,
            "ingested_from": f"inspect logs of the upstream release {manifest.release} "
            "(an upstream release is made only by craftmd ingest of the pinned source)",
        }
    return manifest


def _check_cases(task, dataset: Path | str, conversations: list[dict], answers: list[dict], path: Path) -> None:
    """Refuse (one line, naming them) case ids the dataset does not hold: nothing is dropped without a word."""
    rows = [*answers, *conversations]
    if task.dataset == CRAFTMD.name:  # the scorers' own check, by (case, image flag)
        import polars as pl

        from craftmd.scoring.scorers import Context, check_answer_cases

        keys = pl.DataFrame(
            {"case_id": [r["case_id"] for r in rows], "with_image": [bool(r["with_image"]) for r in rows]},
            schema={"case_id": pl.Utf8, "with_image": pl.Boolean},
        )
        try:
            check_answer_cases(keys, Context(Path(dataset)))
        except CraftMDError as exc:
            raise CraftMDError(f"{path}: {exc}") from None
        return
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file

    f = config_file(dataset, "packets")
    if not f.exists():
        raise CraftMDError(f"{dataset}: no packets config to check the log's cases against (expected {f})")
    unknown = sorted({r["case_id"] for r in rows} - set(pq.read_table(f, columns=["case_id"]).column("case_id").to_pylist()))
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CraftMDError(f"{path}: case {unknown[0]}{more} not in the dataset at {dataset}")


def ingest_logs(paths: list[Path | str], out: Path | str, *, overwrite: bool = False, dataset: Path | str | None = None) -> Path:
    """Inspect logs of one of the package's tasks → the release ``out``. With ``dataset``, every case must be one of it."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    logs = read_logs(paths)
    try:  # what the log's rows hold is the log's word: a row of the wrong shape or type is one line, nothing written
        manifest, tables, scores, records = _release_of(logs, out, Path(paths[0]), dataset)
    except (pa.ArrowException, TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:  # a trial of 2**70
        raise CraftMDError(
            f"{paths[0] if len(paths) == 1 else 'the logs'}: rows that do not fit a release "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); nothing was written"
        ) from None
    write_release(out, manifest, tables, overwrite=overwrite, scores=None if scores is None else (scores, records))
    return out


def _release_of(logs: list, out: Path, where: Path, dataset: Path | str | None) -> tuple[RunRecord, dict, pa.Table | None, dict]:
    """The run record, tables, scores (claims, :func:`_claims`) and scorer records of the release the logs make."""
    conversations, answers, score_rows, records, others = _rows(logs)
    first = logs[0].eval
    meta = first.metadata or {}
    if MANIFEST in meta:  # an exported release: its own run record, its id kept (the same run: the board refuses two of one id)
        manifest = _claimed_record(meta[MANIFEST], where)
    else:
        manifest = _run_record(logs[0], out, conversations, answers, where)
    from craftmd.scoring.submission import check_model_name

    for what, name in (("model", manifest.model), ("display name", manifest.display_name)):
        if name is not None:
            try:
                check_model_name(name)
            except CraftMDError as exc:
                raise CraftMDError(f"{where}: the log's {what}: {str(exc).removeprefix('--model: ')}") from None
    task = release_task(manifest)  # a registered task (or the file the user named), never a file the log names
    if dataset is not None:
        _check_cases(task, dataset, conversations, answers, where)
    tables = {}
    if answers or "answers" in task.required_tables:
        tables["answers"] = pa.Table.from_pylist(answers, ANSWERS_SCHEMA)
    if (
        conversations
        or MANIFEST not in meta
        and (task.conversations or "conversations" in task.required_tables)
        or MANIFEST in meta
        and "conversations.parquet" in (meta[MANIFEST].get("files") or {})
    ):
        tables["conversations"] = pa.Table.from_pylist(conversations, CONVERSATIONS_SCHEMA)
    for t in task.extra_tables:
        if t.name in others or t.name in task.required_tables:
            tables[t.name] = pa.Table.from_pylist(others.get(t.name, []), t.schema)
    score_rows, records = _claims(score_rows, records)
    scores = _scores_table(score_rows, meta.get(SCORE_ORDER))
    if scores is not None:  # a score out of its metric's range: one line, before anything is written
        try:
            scores = conform_scores(scores)
        except CraftMDError as exc:
            raise CraftMDError(f"{logs[0].location}: the log's {exc}; nothing was written") from None
    return manifest, tables, scores, records


# --- release -> logs ----------------------------------------------------------------------------
def _score_value(rows: list[dict]):
    """A sample's score for one scorer: the ``correct`` value (or the one metric's), else a dict by metric; NaN for none."""
    vals = {r["metric"]: (math.nan if r["value"] is None else r["value"]) for r in rows}
    if len(vals) == 1:
        return next(iter(vals.values()))
    return vals


def _message(m: dict) -> dict:
    return {"role": m["role"], "content": m["content"], "source": "generate" if m["role"] == "assistant" else "input"}


def _write_log(path: Path, header, samples: list[tuple[str, bytes]], summaries: list[dict]) -> None:
    """An ``.eval`` log (inspect's zip layout: a sample per member, the summaries, the header), written atomically.

    The header is inspect's own :class:`EvalLog` (less its samples); each sample is the JSON of an
    :class:`EvalSample`, serialized straight from plain values (the whole of an upstream release in seconds,
    where building and condensing 80,000 pydantic samples takes minutes)."""
    import zipfile

    from pydantic_core import to_json

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # deflate, as inspect's logs were before zstd (every reader reads both): inspect's zstd starts a pool of
        # compression threads per member, most of the time for 80,000 small samples
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            for name, data in samples:
                z.writestr(name, data)
            z.writestr("summaries.json", to_json(summaries))
            z.writestr("header.json", header.model_dump_json(exclude={"samples"}, exclude_none=True))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def export_release(release: Path | str, out: Path | str, *, progress: bool = True) -> list[Path]:
    """Write ``release`` as inspect logs into ``out``: one ``.eval`` log per (setting, format)."""
    import gc

    gc.disable()  # millions of small rows, none cyclic: the collector's passes would be a third of the time
    try:
        return _export(release, out, progress)
    finally:
        gc.enable()


def _index_scores(score_rows: list[dict]) -> tuple[dict, dict, list[dict]]:
    """A release's score rows by answer, by conversation, and the rest (case-level scores)."""
    by_answer: dict[tuple, list[dict]] = {}
    by_conv: dict[tuple, list[dict]] = {}
    extra: list[dict] = []
    for r in score_rows:
        if r.get("setting") is not None and r.get("format") is not None:
            by_answer.setdefault((r["case_id"], r["trial"], r["setting"], r["format"], r["with_image"]), []).append(r)
        elif r.get("conversation") is not None:
            by_conv.setdefault((r["case_id"], r["trial"], r["conversation"], r["with_image"]), []).append(r)
        else:
            extra.append(r)
    return by_answer, by_conv, extra


def _sample_scores(mine: list[dict], totals: dict[str, list[float]]) -> tuple[dict, dict]:
    """One sample's scores (full, and the summary's brief form) by scorer; each value added to ``totals``."""
    by_scorer: dict[str, list[dict]] = {}
    for r in mine:
        by_scorer.setdefault(r["scorer"], []).append(r)
    scores, brief = {}, {}
    for g, rs in by_scorer.items():
        value = _score_value(rs)
        if isinstance(value, float) and not math.isnan(value):
            totals.setdefault(g, []).append(value)
        label = next((r["label"] for r in rs if r["label"] is not None), None)
        brief[g] = {"value": value, "answer": label}
        scores[g] = {"value": value, "answer": label, "metadata": {STORE_KEY: {"rows": rs}}}
    return scores, brief


class _Export:
    """A release as inspect logs: its rows indexed once, then one log per (setting, format) (:func:`export_release`)."""

    def __init__(self, rel, model: str):
        self.rel, self.task, self.model = rel, rel.task, model
        self.answers = rel.table("answers").to_pylist()
        conv_rows = rel.table("conversations").to_pylist() if rel.has("conversations") else []
        score_table, self.records = rel.scores_with_records()
        self.order = [[f.name, str(f.type)] for f in score_table.schema] if score_table is not None else []
        self.convs = {tuple(c[k] for k in CONV_KEY): c for c in conv_rows}
        score_rows = score_table.to_pylist() if score_table is not None else []
        self.by_answer, self.by_conv, self.extra_scores = _index_scores(score_rows)
        self.used_convs: set[tuple] = set()
        self.used_answers: set[tuple] = set()
        self.msgs: dict[tuple, list] = {}
        self.bare: dict[tuple, dict] = {}

    def messages(self, key: tuple) -> list:
        """A conversation's messages as inspect's (made once), and the conversation without them (:attr:`bare`)."""
        if key not in self.msgs:
            self.msgs[key] = [_message(x) for x in self.convs[key]["messages"]]
            self.bare[key] = {k: v for k, v in self.convs[key].items() if k != "messages"}
        return self.msgs[key]

    def sample(self, a: dict, kind: str | None, totals: dict) -> tuple[tuple[str, bytes], dict]:
        """One answer as an inspect sample (its member of the log) and its summary."""
        from pydantic_core import to_json

        akey = (a["case_id"], a["trial"], a["setting"], a["format"], a["with_image"])
        ckey = (a["case_id"], a["trial"], kind, a["with_image"]) if kind else None
        has_conv = ckey in self.convs
        mine = list(self.by_answer.get(akey, ()))
        if has_conv:
            mine += self.by_conv.get(ckey, ())
            self.used_convs.add(ckey)
        self.used_answers.add(akey)
        scores, brief = _sample_scores(mine, totals)
        text = (a["response"] if a["status"] == "ok" else f"({a['status']}: {a['error'] or 'no answer'})") or ""
        convo = self.messages(ckey) if has_conv else []
        answer = {"role": "assistant", "content": text, "source": "generate", "model": self.model}
        sid, epoch = a["case_id"] + ("+image" if a["with_image"] else ""), int(a["trial"]) + 1
        ended = {"ended": self.convs[ckey]["ended"], "n_turns": self.convs[ckey]["n_turns"]} if has_conv else {}
        meta = {
            "case_id": a["case_id"],
            "trial": a["trial"],
            "setting": a["setting"],
            "format": a["format"],
            "with_image": a["with_image"],
            "status": a["status"],
            **ended,
        }
        sample = {
            "id": sid,
            "epoch": epoch,
            "input": convo[:1] or a["case_id"],
            "target": "",
            "messages": [*convo, answer],
            "output": {"model": self.model, "choices": [{"message": answer, "stop_reason": "stop"}], "completion": text},
            "scores": scores,
            "metadata": meta,
            "store": {STORE_KEY: {"conversations": [self.bare[ckey]] if has_conv else [], "answers": [a]}},
            "events": [],
            "model_usage": {},
            "role_usage": {},
            "attachments": {},
        }
        first = convo[0]["content"][:200] if convo else a["case_id"]
        summary = {
            "id": sid,
            "epoch": epoch,
            "input": first,
            "target": "",
            "metadata": meta,
            "scores": brief,
            "model_usage": {},
            "role_usage": {},
            "completed": True,
            "message_count": len(convo) + 1,
        }
        return (f"samples/{sid}_epoch_{epoch}.json", to_json(sample)), summary

    def header(self, setting: str, fmt: str, rows: list[dict], totals: dict, created: str):
        """The log's header: inspect's :class:`EvalLog` (its samples apart), the release's run record in its metadata."""
        import inspect_ai
        from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalScore, EvalSpec

        rel, m = self.rel, self.rel.manifest
        meta = {
            MANIFEST: m.model_dump(mode="json"),
            RECORDS: self.records,
            SCORE_ORDER: self.order,
            "setting": setting,
            "format": fmt,
        }
        spec = EvalSpec(
            created=created,
            task=f"craftmd/{m.task}",
            task_id=f"{rel.id}-{setting}-{fmt}",
            run_id=rel.id,
            task_args={"experiments": f"{setting},{fmt}"},
            task_args_passed={"experiments": f"{setting},{fmt}"},  # what inspect view shows
            task_display_name=f"{rel.display} · {setting} · {fmt}",
            dataset=EvalDataset(name=f"{rel.id}/{setting}/{fmt}", samples=len(rows)),
            model=self.model,
            config=EvalConfig(epochs=max(int(a["trial"]) for a in rows) + 1),
            packages={"craftmd": __version__, "inspect_ai": inspect_ai.__version__},
            metadata=meta,
        )
        results = EvalResults(
            total_samples=len(rows),
            completed_samples=len(rows),
            scores=[
                EvalScore(
                    name=g, scorer=g, scored_samples=len(v), metrics={"mean": EvalMetric(name="mean", value=sum(v) / len(v))}
                )
                for g, v in sorted(totals.items())
            ],
        )
        return EvalLog(status="success", eval=spec, results=results)

    def extra(self) -> dict:
        """The rows no exported answer carries (the first log's metadata)."""
        return {
            "conversations": [c for k, c in self.convs.items() if k not in self.used_convs],
            "scores": self.extra_scores
            + [r for k, rs in self.by_answer.items() if k not in self.used_answers for r in rs]
            + [r for k, rs in self.by_conv.items() if k not in self.used_convs for r in rs],
        }


def _export(release, out, progress: bool) -> list[Path]:
    require_inspect()
    from tqdm import tqdm

    rel = read_release(release)
    m = rel.manifest
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ex = _Export(rel, m.model if "/" in m.model else f"{m.kind}/{m.model}")
    groups: dict[tuple[str, str], list[dict]] = {}
    for a in ex.answers:
        groups.setdefault((a["setting"], a["format"]), []).append(a)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    written: list[tuple] = []
    bar = tqdm(total=len(ex.answers), desc=f"export {rel.id}", unit="answer", disable=not progress, dynamic_ncols=True)
    for (setting, fmt), rows in sorted(groups.items()):
        exp = rel.task.experiment(setting, fmt)
        kind = exp.conversation if exp is not None else None
        samples, summaries, totals = [], [], {}
        for a in rows:
            member, summary = ex.sample(a, kind, totals)
            samples.append(member)
            summaries.append(summary)
            bar.update(1)
        path = inside(out, f"{rel.id}_{setting}_{fmt}.eval", "log name")  # names read from the release stay inside --out
        written.append((path, ex.header(setting, fmt, rows, totals, created), samples, summaries))
        if len(written) > 1:  # the first waits for the rows no answer carries
            _write_log(*written[-1])
            written[-1] = (path,)
    bar.close()
    if written:
        written[0][1].eval.metadata[EXTRA] = ex.extra()
        _write_log(*written[0])
    return [w[0] for w in written]


__all__ = ["ingest_logs", "export_release", "read_logs"]
