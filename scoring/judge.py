"""The rubric judge: a committee of LLM judges scores whole conversations on MedPI's dimensions.

For each conversation, judge (a model, or a model with a seed) and rubric category with dimensions
that apply to the encounter's objective (:mod:`craftmd.scoring.rubric`), two stages, as MedPI:

1. **discussion** (``scoring/prompts/judge_discussion_v1.txt``): a committee of three viewpoints
   (clinician, patient advocate, safety reviewer) discusses the category's dimensions, quoting
   the transcript; free text.
2. **scoring**, conditioned on that discussion: ``mode="dimension"`` (the method's: one call per
   dimension, ``judge_dimension_v1.txt``) or ``mode="category"`` (cheaper: one call for all of the
   category's dimensions, ``judge_category_v1.txt``). A reply is one JSON object: per dimension a
   ``score`` 1–4, a short ``rationale`` and ``evidence`` quotes.

The reply's JSON schema is requested as the OpenAI ``response_format`` (``json_schema``; or llama.cpp's
``json_object`` with a schema; or none). A server that refuses the field (an HTTP 4xx) is asked again
without it, and the judge's record says so. Every reply is parsed and validated (``jsonschema``)
whatever the server promised. A reply that does not validate is answered with what was wrong and
asked again, at most ``max_invalid`` times; a dimension still without a valid score is recorded as a
failed score (``status = error``, null value, the reason in ``detail``), never as a 1 or a 4. A failed
call, a refusal, a failed discussion or a failed conversation fail the scores they would have given.

Each judge's scores go to the release's ``scores.parquet`` as scorer ``judge:PROVIDER/MODEL`` (with
``#seedK`` for a committee of seeds), metric ``rubric_score``, variant keys ``conversation``,
``with_image`` and ``dimension``. With several judges, scorer ``judge-committee`` holds the median
of the valid scores of each dimension (the lower middle one for an even count: an ordinal score
stays a level), and its record the judges' agreement (:mod:`craftmd.scoring.rubric_agreement`).

Bias controls: a judge of the doctor's own model family is refused unless ``force``; the order of a
category's dimensions in every prompt is shuffled by a generator seeded with ``seed`` and the
conversation's key (recorded); the judges' names, servers and sampling are pinned in the record, with the model
names the server's replies gave (``served_models``; a judge named by an undated alias that the server answered as
another name is warned about on stderr). :func:`stale` says whether a re-run could change a release's scores (its
records' inputs, catalog, prompts or settings differ from now, or a transient failure would be asked again).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import statistics
import sys
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError
from craftmd.replies import reply_json
from craftmd.scoring.rubric import Catalog, Dimension, applicable, case_objectives, load_catalog

METHOD_VERSION = 1
PROMPT_SET = "judge-v1"
PROMPT_FILES = {"discussion": "judge_discussion_v1.txt", "dimension": "judge_dimension_v1.txt",
                "category": "judge_category_v1.txt", "retry": "judge_retry_v1.txt"}  # fmt: skip
MODES = ("dimension", "category")
RESPONSE_FORMATS = ("json_schema", "json_object", "none")
METRIC = "rubric_score"
COMMITTEE = "judge-committee"
#: Default generation settings: deterministic; the scoring budget is per dimension asked.
DISCUSSION_TOKENS = 1024
SCORE_TOKENS = 384
#: A rough prompt-token count for ``--estimate``: characters per token.
CHARS_PER_TOKEN = 4
SCHEMA = pa.schema(
    [
        ("case_id", pa.string()), ("trial", pa.int16()), ("conversation", pa.string()), ("with_image", pa.bool_()),
        ("dimension", pa.string()), ("scorer", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
        ("label", pa.string()), ("detail", pa.string()), ("status", pa.string()),
    ]
)  # fmt: skip


def load_prompts() -> dict[str, str]:
    base = resources.files("craftmd.scoring") / "prompts"
    return {k: (base / f).read_text(encoding="utf-8") for k, f in PROMPT_FILES.items()}


def prompt_set_record() -> dict:
    prompts = load_prompts()
    return {"name": PROMPT_SET, "files": {k: f"scoring/prompts/{f}" for k, f in sorted(PROMPT_FILES.items())},
            "sha256": {k: hashlib.sha256(prompts[k].encode()).hexdigest() for k in sorted(prompts)}}  # fmt: skip


def fill(template: str, **fields: str) -> str:
    """``{name}`` placeholders filled in one pass (a transcript holding ``{category}`` stays as written)."""
    return re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), m.group(0)), template)


# -- the replies: schema, parsing, validation ------------------------------------------------------


def item_schema(ids: list[str]) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["dimension", "score", "rationale", "evidence"],
            "properties": {"dimension": {"type": "string", "enum": list(ids)}, "score": {"type": "integer", "minimum": 1, "maximum": 4},
                           "rationale": {"type": "string"}, "evidence": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip


def reply_schema(ids: list[str], mode: str) -> dict:
    if mode == "dimension":
        return item_schema(ids)
    return {"type": "object", "additionalProperties": False, "required": ["scores"],
            "properties": {"scores": {"type": "array", "minItems": len(ids), "maxItems": len(ids), "items": item_schema(ids)}}}  # fmt: skip


def response_format(kind: str, schema: dict) -> str | None:
    """The ``response_format`` to request, as JSON text (None for ``none``)."""
    if kind == "none":
        return None
    if kind == "json_object":  # llama.cpp's server: a JSON object constrained by a schema
        return json.dumps({"type": "json_object", "schema": schema}, sort_keys=True)
    return json.dumps({"type": "json_schema", "json_schema": {"name": "rubric_scores", "strict": True, "schema": schema}}, sort_keys=True)


def validate_reply(text: str | None, ids: list[str], mode: str) -> tuple[dict[str, dict], dict[str, str]]:
    """A reply -> (valid items by dimension id, problem by dimension id without a valid item)."""
    from jsonschema import Draft202012Validator

    try:
        value = reply_json(text)
    except ValueError:
        return {}, dict.fromkeys(ids, "the reply is not JSON")
    if mode == "dimension":
        items = [value]
    else:
        if not isinstance(value, dict) or not isinstance(value.get("scores"), list):
            return {}, dict.fromkeys(ids, "the reply has no 'scores' list")
        items = value["scores"]
    check = Draft202012Validator(item_schema(ids))
    valid: dict[str, dict] = {}
    problems: dict[str, str] = {}
    seen: dict[str, int] = {}
    for it in items:
        dim = it.get("dimension") if isinstance(it, dict) else None
        if isinstance(dim, str):
            seen[dim] = seen.get(dim, 0) + 1
        errors = sorted(check.iter_errors(it), key=lambda e: list(e.path))
        if errors:
            if dim in ids:
                problems.setdefault(dim, f"{'.'.join(map(str, errors[0].path)) or 'item'}: {errors[0].message}"[:200])
            continue
        if isinstance(it["score"], bool) or not float(it["score"]).is_integer():
            problems.setdefault(dim, "score is not a whole number")
            continue
        valid.setdefault(dim, it)
    for d in ids:
        if seen.get(d, 0) > 1:
            valid.pop(d, None)
            problems[d] = "the dimension is scored more than once"
        elif d not in valid:
            problems.setdefault(d, "the dimension is missing from the reply")
    return {d: v for d, v in valid.items() if d not in problems}, {d: p for d, p in problems.items() if d in ids}


def evidence_found(quotes: list[str], transcript: str) -> int:
    """How many quotes occur in the transcript (case and spacing folded)."""
    fold = " ".join(transcript.lower().split())
    return sum(1 for q in quotes if q.strip() and " ".join(q.lower().strip().strip('"').split()) in fold)


# -- what is judged ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One conversation to judge."""

    case_id: str
    trial: int
    conversation: str
    with_image: bool
    transcript: str
    objective: str
    failed: bool  # ended = error

    @property
    def key(self) -> str:
        return f"{self.case_id}|{self.trial}|{self.conversation}|{self.with_image}"


@dataclass(frozen=True)
class Member:
    """One judge of the committee: a model, and the seed of its sampling."""

    model: str
    seed: int
    name: str  # the scorer name: judge:MODEL, or judge:MODEL#seedK in a committee of seeds


def members(models: list[str], seeds: int = 1) -> list[Member]:
    if not models:
        raise CraftMDError("no judge given (--judge PROVIDER/MODEL)")
    if seeds < 1:
        raise CraftMDError("--seeds must be at least 1")
    from craftmd.models import parse_name

    out = []
    for m in dict.fromkeys(models):
        parse_name(m)
        for s in range(seeds):
            out.append(Member(m, s, f"judge:{m}" + (f"#seed{s}" if seeds > 1 else "")))
    return out


#: Excel holds 32,767 characters a cell: the raters' sheets and the judge read the same transcript.
MAX_CELL = 32000


def transcript(messages) -> str:
    """The conversation as the rater reads it (doctor's view: assistant = doctor, user = patient)."""
    lines = []
    for m in messages or []:
        role = m.get("role")
        who = {"assistant": "Doctor-AI", "user": "Patient-AI"}.get(role)
        if who is None:
            continue
        lines.append(f"{who}: {(m.get('content') or '').strip()}")
    text = "\n".join(lines)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 20] + " … [truncated]"


def read_units(release, dataset_dir, *, conversations: list[str] | None = None, cases: list[str] | None = None) -> list[Unit]:
    """The release's conversations to judge, with their objectives."""
    if not release.has("conversations"):
        raise CraftMDError(f"release {release.id}: no conversations.parquet, nothing to judge")
    t = pq.read_table(release.path / "conversations.parquet", columns=["case_id", "trial", "conversation", "with_image", "messages", "ended"])
    rows = t.to_pylist()
    if conversations:
        known = sorted({r["conversation"] for r in rows})
        bad = [c for c in conversations if c not in known]
        if bad:
            raise CraftMDError(f"release {release.id}: no conversation kind {bad}; it has {known}")
        rows = [r for r in rows if r["conversation"] in conversations]
    if cases:
        missing = sorted(set(cases) - {r["case_id"] for r in rows})
        if missing:
            raise CraftMDError(f"release {release.id}: no conversations of case(s) {missing}")
        rows = [r for r in rows if r["case_id"] in set(cases)]
    objectives = case_objectives(release.manifest.task, sorted({r["case_id"] for r in rows}), dataset_dir)
    return [Unit(r["case_id"], r["trial"], r["conversation"], r["with_image"], transcript(r["messages"]), objectives[r["case_id"]],
                 r["ended"] == "error") for r in rows]  # fmt: skip


def order(dims: list[Dimension], seed: int, unit: Unit, category: str) -> list[Dimension]:
    """The category's dimensions in the order one prompt shows them: shuffled by ``seed`` and the unit."""
    rng = random.Random(zlib.crc32(f"{seed}|{unit.key}|{category}".encode()))
    out = list(dims)
    rng.shuffle(out)
    return out


def dimension_block(d: Dimension) -> str:
    anchors = "; ".join(f"{i} = {a}" for i, a in enumerate(d.anchors, 1))
    return f"- {d.id} ({d.dimension}): {d.description} Scores: {anchors}"


@dataclass
class Plan:
    """What a run sends, per member: (unit, category, its applicable dimensions in prompt order)."""

    units: list[Unit]
    jobs: list[tuple[Unit, str, list[Dimension]]]
    failed_units: list[tuple[Unit, list[Dimension]]]

    def calls(self, mode: str) -> int:
        return sum(1 + (len(ds) if mode == "dimension" else 1) for _, _, ds in self.jobs)


def plan(units: list[Unit], dims: tuple[Dimension, ...], seed: int) -> Plan:
    jobs, failed = [], []
    for u in units:
        ds = applicable(dims, u.objective)
        if u.failed:
            failed.append((u, ds))
            continue
        by_cat: dict[str, list[Dimension]] = {}
        for d in ds:
            by_cat.setdefault(d.category, []).append(d)
        for cat, cds in by_cat.items():
            jobs.append((u, cat, order(cds, seed, u, cat)))
    return Plan(units, jobs, failed)


# -- the judge ----------------------------------------------------------------------------------------


@dataclass
class JudgeSpec:
    models: list[str]
    mode: str = "dimension"
    seeds: int = 1
    seed: int = 0  # the dimension order's seed, and the judges' sampling seed (+ the member's seed)
    dimensions: list[str] | None = None
    response_format: str = "json_schema"
    temperature: float = 0.0
    discussion_tokens: int = DISCUSSION_TOKENS
    score_tokens: int = SCORE_TOKENS
    max_invalid: int = 2
    base_url: str | None = None
    api_key: str | None = None
    cache: Path | str | None = None
    concurrency: int = 8  # requests in flight per server
    server_concurrency: dict = field(default_factory=dict)  # per service ('openai' for openai/ models)
    max_retries: int = 6
    timeout: float = 120.0
    force: bool = False
    progress: bool = True
    price: tuple[float, float] | None = None

    def check(self) -> None:
        if self.mode not in MODES:
            raise CraftMDError(f"--mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.response_format not in RESPONSE_FORMATS:
            raise CraftMDError(f"--response-format {self.response_format!r}: one of {', '.join(RESPONSE_FORMATS)}")
        if self.max_invalid < 0:
            raise CraftMDError("--max-invalid must be 0 or more")


@dataclass
class Outcome:
    """One member's result for one dimension of one unit."""

    score: int | None
    detail: dict


@dataclass
class MemberState:
    member: Member
    format_used: str
    format_refused: str | None = None  # the server's reason, when it refused response_format
    outcomes: dict = field(default_factory=dict)  # (unit key, dim id) -> Outcome
    served: set = field(default_factory=set)  # the model names the server's replies gave
    transient: int = 0  # calls that failed transiently (not cached: a re-run asks again)

    def saw(self, c) -> None:
        if c.model:
            self.served.add(c.model)
        self.transient += bool(c.transient)


class Judge:
    def __init__(self, spec: JudgeSpec, catalog: Catalog | None = None):
        spec.check()
        self.spec = spec
        self.catalog = catalog or load_catalog()
        self.dims = self.catalog.select(spec.dimensions)
        self.members = members(spec.models, spec.seeds)
        self.prompts = load_prompts()

    # prompts
    def discussion_messages(self, u: Unit, cat: str, ds: list[Dimension]) -> list[dict]:
        text = fill(self.prompts["discussion"], objective=u.objective.replace("_", " "), category=cat,
                    dimensions="\n".join(dimension_block(d) for d in ds), transcript=u.transcript)  # fmt: skip
        return [{"role": "user", "content": text}]

    def score_messages(self, u: Unit, cat: str, ds: list[Dimension], discussion: str) -> list[dict]:
        common = dict(objective=u.objective.replace("_", " "), category=cat, transcript=u.transcript, discussion=discussion)
        if self.spec.mode == "category":
            text = fill(self.prompts["category"], dimensions="\n".join(dimension_block(d) for d in ds), **common)
        else:
            d = ds[0]
            text = fill(self.prompts["dimension"], dimension_id=d.id, dimension=d.dimension, description=d.description,
                        **{f"anchor_{i}": a for i, a in enumerate(d.anchors, 1)}, **common)  # fmt: skip
        return [{"role": "user", "content": text}]

    def sampling(self, member: Member, tokens: int, fmt: str | None = None):
        from craftmd.models import Sampling

        return Sampling(temperature=self.spec.temperature, top_p=1.0, max_tokens=tokens, seed=self.spec.seed + member.seed,
                        response_format=fmt)  # fmt: skip

    # estimate
    def estimate(self, units: list[Unit]) -> dict:
        """Calls and tokens a run would need, before anything is sent (prompt tokens ~ characters / 4; replies at their cap)."""
        p = plan(units, self.dims, self.spec.seed)
        calls = tin = tout = again = 0
        filler = "x" * (self.spec.discussion_tokens * CHARS_PER_TOKEN)
        for u, cat, ds in p.jobs:
            calls += 1
            tin += len(self.discussion_messages(u, cat, ds)[0]["content"]) // CHARS_PER_TOKEN
            tout += self.spec.discussion_tokens
            groups = [[d] for d in ds] if self.spec.mode == "dimension" else [ds]
            for g in groups:
                calls += 1
                again += self.spec.max_invalid  # a reply that does not validate is asked again, at most max_invalid times
                tin += len(self.score_messages(u, cat, g, filler)[0]["content"]) // CHARS_PER_TOKEN
                tout += self.spec.score_tokens * len(g)
        n = len(self.members)
        out = {"conversations": len(units), "failed_conversations": len(p.failed_units), "judges": n, "mode": self.spec.mode,
               "calls": calls * n, "calls_at_most": (calls + again) * n, "models": list(dict.fromkeys(m.model for m in self.members)),
               "tokens_in": tin * n, "tokens_out_at_most": tout * n,
               "dimension_scores": sum(len(ds) for _, _, ds in p.jobs) * n}  # fmt: skip
        if self.spec.price:
            out["cost_usd_at_most"] = round((out["tokens_in"] * self.spec.price[0] + out["tokens_out_at_most"] * self.spec.price[1]) / 1e6, 2)
        return out

    # run
    async def _call(self, caller, state: MemberState, messages, tokens: int, schema: dict | None, counts):
        fmt = response_format(state.format_used, schema) if schema is not None else None
        c = await caller(messages, self.sampling(state.member, tokens, fmt), counts=counts)
        if fmt is not None and c.status == "error" and not c.transient and (c.reason or "").startswith("HTTP 4") \
                and "context_length" not in (c.reason or ""):
            # the server does not take this response_format: ask without it from now on, and record why
            state.format_refused = state.format_refused or c.error
            state.format_used = "none"
            c = await caller(messages, self.sampling(state.member, tokens, None), counts=counts)
        state.saw(c)
        return c

    async def _job(self, caller, state: MemberState, u: Unit, cat: str, ds: list[Dimension], counts, bar) -> None:
        def fail(dims, reason, **extra):
            for d in dims:
                state.outcomes[(u.key, d.id)] = Outcome(None, {"error": reason, "category": cat, **extra})

        disc = await self._call(caller, state, self.discussion_messages(u, cat, ds), self.spec.discussion_tokens, None, counts)
        bar()
        if disc.status != "ok" or not (disc.text or "").strip():
            fail(ds, f"the committee discussion failed: {disc.error or disc.status or 'empty reply'}")
            return
        groups = [[d] for d in ds] if self.spec.mode == "dimension" else [ds]

        async def score(group: list[Dimension]) -> None:
            ids = [d.id for d in group]
            base = self.score_messages(u, cat, group, disc.text)
            schema = reply_schema(ids, self.spec.mode)
            tokens = self.spec.score_tokens * len(group)
            messages, got, problems, attempts = base, {}, {}, 0
            while True:
                attempts += 1
                c = await self._call(caller, state, messages, tokens, schema, counts)
                bar(again=attempts > 1)
                if c.status != "ok":
                    problems = {i: f"{c.status}: {c.error or 'no reason given'}" for i in ids if i not in got}
                    break
                valid, problems = validate_reply(c.text, [i for i in ids if i not in got], self.spec.mode)
                got.update(valid)
                if not problems or attempts > self.spec.max_invalid:
                    break
                problem = "; ".join(f"{k}: {v}" for k, v in sorted(problems.items()))[:600]
                messages = base + [{"role": "assistant", "content": c.text or ""},
                                   {"role": "user", "content": fill(self.prompts["retry"], problem=problem)}]  # fmt: skip
            for d in group:
                if d.id in got:
                    it = got[d.id]
                    ev = [str(q) for q in it["evidence"]]
                    state.outcomes[(u.key, d.id)] = Outcome(int(it["score"]), {
                        "category": cat, "rationale": it["rationale"], "evidence": ev,
                        "evidence_found": evidence_found(ev, u.transcript), "attempts": attempts})  # fmt: skip
                else:
                    fail([d], problems.get(d.id, "no valid score"), attempts=attempts)

        await asyncio.gather(*(score(g) for g in groups))

    def call_settings(self):
        from craftmd.models.connect import CallSettings

        s = self.spec
        return CallSettings(base_url=s.base_url, api_key=s.api_key, timeout=s.timeout, max_retries=s.max_retries,
                            concurrency=s.concurrency, server_concurrency=s.server_concurrency, cache=s.cache)

    async def _run_member(self, state: MemberState, p: Plan, tick, counts, conn) -> None:
        caller = conn.caller(state.member.model)
        await asyncio.gather(*(self._job(caller, state, u, cat, ds, counts, tick) for u, cat, ds in p.jobs))
        for u, ds in p.failed_units:
            for d in ds:
                state.outcomes[(u.key, d.id)] = Outcome(None, {"error": "the conversation failed (ended = error)", "category": d.category})

    def run(self, units: list[Unit]) -> tuple[list[MemberState], object]:
        """Judge ``units`` with every member (side by side); returns each member's outcomes and the run's counts."""
        from tqdm import tqdm

        from craftmd.models.calls import Counts

        p = plan(units, self.dims, self.spec.seed)
        states = [MemberState(m, self.spec.response_format) for m in self.members]
        tallies = [Counts() for _ in states]
        bar = tqdm(total=p.calls(self.spec.mode) * len(states), desc="judge", unit="call", disable=not self.spec.progress,
                   file=sys.stderr, dynamic_ncols=True)  # fmt: skip

        def tick(again: bool = False) -> None:
            if again:  # a reply asked again: one call more than planned, so the bar keeps its total
                bar.total += 1
            bar.update(1)
            c = Counts.total(tallies)
            price = self.spec.price
            cost = f" ${(c.tokens_in * price[0] + c.tokens_out * price[1]) / 1e6:,.2f}" if price else ""
            bar.set_postfix_str(f"sent={c.calls} cached={c.cache_hits} fail={c.failures} tok_in={c.tokens_in:,} "
                                f"tok_out={c.tokens_out:,}{cost}", refresh=False)  # fmt: skip

        async def go() -> None:
            from craftmd.models.connect import Connections

            # One connection per judge model and one slot pool per server, shared by its members (seeds).
            async with Connections(self.call_settings(), [st.member.model for st in states]) as conn:
                await asyncio.gather(*(self._run_member(st, p, tick, c, conn) for st, c in zip(states, tallies)))

        try:
            asyncio.run(go())
        finally:
            bar.close()
        for st in states:
            warning = alias_warning(st.member.model, st.served)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        return states, Counts.total(tallies)

    # record
    def identity(self, state: MemberState) -> dict:
        s = self.spec
        return {
            "method": "medpi-committee", "version": METHOD_VERSION, "catalog": self.catalog.record(),
            "prompt_set": prompt_set_record(), "mode": s.mode, "shuffle_seed": s.seed, "model": state.member.model,
            "member_seed": state.member.seed, **member_server(state.member.model, s.base_url),
            "sampling": {"temperature": s.temperature, "top_p": 1.0, "seed": s.seed + state.member.seed,
                         "discussion_max_tokens": s.discussion_tokens, "score_max_tokens_per_dimension": s.score_tokens},
            "response_format": {"requested": s.response_format, "used": state.format_used, "refused": state.format_refused},
            "max_invalid": s.max_invalid, "dimensions": [d.id for d in self.dims] if s.dimensions else "all",
            "served_models": sorted(state.served), "transient_failures": state.transient,
        }  # fmt: skip


def member_server(model: str, base_url: str | None) -> dict:
    """Where a judge is called, as its record says: ``base_url`` (openai/: the ``--base-url`` given, else None) and, for
    ``openai-api/<service>/`` judges, the service and its server (never a key)."""
    from craftmd.models import endpoint_of, parse_name
    from craftmd.models.openai import public_url

    n = parse_name(model)
    if n.service:
        return {"base_url": public_url(endpoint_of(n)[0]), "service": n.service}
    return {"base_url": public_url(base_url) if base_url else None}


#: The record's keys that say what happened rather than what was asked: left out when a record is compared with a re-run's.
OUTCOME_KEYS = ("served_models", "transient_failures", "inputs", "self_judge", "scored", "failed", "reasons")
#: A model name that carries its version: a date (2024-08-06, 20240806) or a four-digit MMDD suffix (gpt-4-0613).
DATED = re.compile(r"(?:\d{4}-\d{2}-\d{2}|(?<!\d)\d{8}(?!\d)|-\d{4}(?![\d.]))")


def alias_warning(model: str, served: set[str]) -> str | None:
    """One line when ``model`` (PROVIDER/NAME) is an undated alias the server answered as another name, else None."""
    name = model.split("/", 1)[1] if "/" in model else model
    other = sorted(m for m in served if m != name)
    if DATED.search(name) or not other:
        return None
    return (f"judge {model} is an undated alias the server answered as {', '.join(other)}; name that model to pin the judge "
            "(recorded as served_models)")  # fmt: skip


def pinned(record: dict) -> dict:
    """What of a judge's record a re-run must match: everything asked, nothing that happened."""
    out = {k: v for k, v in record.items() if k not in OUTCOME_KEYS}
    if isinstance(out.get("response_format"), dict):
        out["response_format"] = out["response_format"].get("requested")
    return out


def run_inputs(rel, units: list[Unit], conversations: list[str] | None, cases: list[str] | None) -> dict:
    """The inputs a judge's scores were made from: the conversations file, the objectives judged by, the selection."""
    objectives = json.dumps(sorted({(u.case_id, u.objective) for u in units}))
    return {"conversations_sha256": rel.manifest.files["conversations.parquet"]["sha256"],
            "objectives_sha256": hashlib.sha256(objectives.encode()).hexdigest(),
            "conversations": sorted(conversations) if conversations else "all", "cases": sorted(cases) if cases else "all"}  # fmt: skip


# -- scores ------------------------------------------------------------------------------------------


def score_rows(units: list[Unit], states: list[MemberState], dims: tuple[Dimension, ...]) -> tuple[pa.Table, dict[str, dict]]:
    """Every member's scores, and the committee's medians when there are several members; per scorer, its counts."""
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    counts: dict[str, dict] = {}

    def add(u: Unit, dim: str, scorer: str, value, detail: dict) -> None:
        for k, v in (("case_id", u.case_id), ("trial", u.trial), ("conversation", u.conversation), ("with_image", u.with_image),
                     ("dimension", dim), ("scorer", scorer), ("metric", METRIC), ("value", None if value is None else float(value)),
                     ("label", None), ("detail", json.dumps(detail, sort_keys=True, ensure_ascii=False)),
                     ("status", "error" if value is None else "ok")):  # fmt: skip
            cols[k].append(v)
        c = counts.setdefault(scorer, {"scored": 0, "failed": 0, "reasons": {}})
        if value is None:
            c["failed"] += 1
            r = str(detail.get("error", "unknown"))[:120]
            c["reasons"][r] = c["reasons"].get(r, 0) + 1
        else:
            c["scored"] += 1

    for u in units:
        for d in applicable(dims, u.objective):
            got = []
            for st in states:
                o = st.outcomes[(u.key, d.id)]
                add(u, d.id, st.member.name, o.score, o.detail)
                got.append((st.member.name, o.score))
            if len(states) > 1:
                valid = [s for _, s in got if s is not None]
                detail = {"judges": {n: s for n, s in got}, "category": d.category}
                if valid:
                    detail["median"] = statistics.median(valid)
                    add(u, d.id, COMMITTEE, statistics.median_low(valid), detail)
                else:
                    add(u, d.id, COMMITTEE, None, dict(detail, error="no judge produced a valid score"))
    return pa.table(cols, schema=SCHEMA), counts


def pick_scorer(scorers: list[str]) -> str | None:
    """Whose rubric scores stand for a release: the committee where there is one, else the first judge by name."""
    judges = sorted(s for s in scorers if s.startswith("judge:"))
    return COMMITTEE if COMMITTEE in scorers else (judges[0] if judges else None)


def check_own_family(rel, spec: JudgeSpec) -> str:
    """Refuse a judge of the doctor's own model family unless ``spec.force``; returns the doctor's model."""
    from craftmd.scoring.families import family, grades_itself

    doctor = (rel.manifest.roles.get("doctor") or {}).get("model") or rel.manifest.models.get("doctor") or rel.manifest.model
    if not spec.force:
        own = [m for m in dict.fromkeys(spec.models)
               if grades_itself(f"llm:{m}", rel.manifest.model, family(doctor)) or grades_itself(f"llm:{m}", doctor, family(doctor))]
        if own:
            raise CraftMDError(f"judge {own[0]} is of the doctor's own model family ({family(doctor)}: {doctor}); "
                               "pick another judge or pass --allow-self (the record marks it)")  # fmt: skip
    return doctor


def judge_release(release_dir: Path | str, spec: JudgeSpec, *, dataset_dir: Path | str | None = None,
                  conversations: list[str] | None = None, cases: list[str] | None = None) -> dict:
    """Judge a release's conversations and add the scores to its ``scores.parquet``; returns a summary."""
    from craftmd.release import read_release, write_scores
    from craftmd.scoring.rubric_agreement import committee_agreement
    from craftmd.scoring.families import family, grades_itself

    rel = read_release(release_dir)
    doctor = check_own_family(rel, spec)
    judge = Judge(spec)
    units = read_units(rel, dataset_dir, conversations=conversations, cases=cases)
    states, total = judge.run(units)
    table, counts = score_rows(units, states, judge.dims)
    inputs = run_inputs(rel, units, conversations, cases)
    records = {}
    for st in states:
        own = grades_itself(f"llm:{st.member.model}", doctor, family(doctor))
        records[st.member.name] = dict(judge.identity(st), inputs=inputs, self_judge=own, **counts.get(st.member.name, {}))
    if len(states) > 1:
        records[COMMITTEE] = {"method": "median_low", "version": METHOD_VERSION, "members": [s.member.name for s in states],
                              "catalog": judge.catalog.record(), "inputs": inputs, **counts.get(COMMITTEE, {}),
                              "agreement": committee_agreement(table, [s.member.name for s in states])}  # fmt: skip
    write_scores(rel, table, records)
    out = {"release": rel.id, "conversations": len(units), "judges": [s.member.name for s in states], "mode": spec.mode,
           "requests": total.requests, "sent": total.calls, "cached": total.cache_hits, "failures": total.failures,
           "tokens_in": total.tokens_in, "tokens_out": total.tokens_out,
           "scores": {k: {"scored": v["scored"], "failed": v["failed"]} for k, v in sorted(counts.items())}}  # fmt: skip
    if spec.price:
        out["cost_usd"] = round((total.tokens_in * spec.price[0] + total.tokens_out * spec.price[1]) / 1e6, 4)
    if len(states) > 1:
        out["agreement"] = records[COMMITTEE]["agreement"]["overall"]
    return out


def estimate_release(release_dir: Path | str, spec: JudgeSpec, *, dataset_dir=None, conversations=None, cases=None) -> dict:
    from craftmd.release import read_release

    rel = read_release(release_dir)
    judge = Judge(spec)
    units = read_units(rel, dataset_dir, conversations=conversations, cases=cases)
    return {"release": rel.id, **judge.estimate(units)}


__all__ = ["Judge", "JudgeSpec", "judge_release", "estimate_release", "check_own_family", "alias_warning", "validate_reply", "transcript", "reply_schema", "score_rows",
           "members", "read_units", "pick_scorer", "plan", "Unit", "METRIC", "COMMITTEE", "SCHEMA", "MODES", "RESPONSE_FORMATS"]
