"""CRAFT-MD's protocol on the one runner (:mod:`craftmd.generation.runner`): ``craftmd generate --task craftmd``.

One job per (case, trial, image flag): the standard conversation, the history-only
conversation where the exam set-ups ask for it, the summary, and every selected
(setting, format) question. Jobs run side by side under asyncio; inside a job the
turns of a conversation run in order and the questions that only need the case run
at once. Every request goes through a :class:`~craftmd.models.calls.Caller`
(cache, bounded concurrency, capped retries), so a killed run resumes without
repeating a finished call and a re-run over a full cache writes the same bytes.

Every failed request keeps its reason in the release (the ``error`` column of
conversations and answers; an answer that could not be asked because its conversation
or summary failed carries that failure's reason). The progress bar moves per request;
it, the end summary and the manifest read one set of counts (:class:`Counts`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa

from craftmd import CraftMDError
from craftmd.atomic import sha256_file
from craftmd.dataset import config_file, load_config
from craftmd.release import ANSWERS_SCHEMA, CONVERSATIONS_SCHEMA, RunRecord
from craftmd.samples import Sample, load_samples
from craftmd.tasks import Task
from craftmd.tasks.diagnosis import TASK

from craftmd.generation.protocol import DEFAULT_PROMPT_SET, Conversation, Protocol
from craftmd.generation.runner import Estimate, Runner, case_ids_sha256, tally, tokens

#: The settings read from the standard conversation, and from the history-only one (the task's matrix says).
CONVERSATION_SETTINGS = tuple(dict.fromkeys(e.setting for e in TASK.experiments if e.conversation == "standard"))
NO_EXAM_SETTINGS = tuple(dict.fromkeys(e.setting for e in TASK.experiments if e.conversation == "no_exam"))
AGENTS = ("doctor", "patient", "summarizer")
#: For estimates: a typical conversation's doctor turns (upstream GPT-4's median is about this) and reply tokens.
EXPECTED_TURNS = 10
EXPECTED_REPLY = 60


# --- input ------------------------------------------------------------------------------
def parse_experiments(names: list[str] | None, task: Task = TASK) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``multiturn,frq`` → (settings, formats); a name may be a setting, a format or setting:format."""
    if not names:
        return task.settings, task.formats
    settings, formats = [], []
    for raw in names:
        for part in raw.split(":"):
            part = part.strip()
            if part in task.settings:
                settings.append(part)
            elif part in task.formats:
                formats.append(part)
            else:
                raise CraftMDError(f"unknown experiment {part!r}; settings: {', '.join(task.settings)}; formats: {', '.join(task.formats)}")
    keep = lambda xs, order: tuple(x for x in order if x in xs)  # noqa: E731
    return keep(settings, task.settings) or task.settings, keep(formats, task.formats) or task.formats


def load_cases(dataset: Path, config: str, ids: list[str] | None) -> tuple[list[Sample], str]:
    """The selected samples (natural id order) and a sha256 of the dataset file they come from."""
    return load_samples(dataset, config, ids), sha256_file(config_file(dataset, config))


def load_diagnoses(dataset: Path) -> list[str]:
    try:
        df = load_config(dataset, "diagnoses")
    except CraftMDError:
        return []
    return [d for d in df["diagnosis"].to_list() if d]


class CraftMD(Runner):
    """One job per (case, trial, image flag): the standard conversation, the history-only conversation where the
    exam set-ups ask for it, the summary, and every selected (setting, format) question."""

    task = TASK
    agents = AGENTS
    default_prompt_set = DEFAULT_PROMPT_SET
    unit = "answers"
    prompts_root = Path(__file__).parent / "prompts"

    def __init__(self, spec):
        self.settings, self.formats = parse_experiments(spec.experiments, self.task)
        if spec.max_turns < 1:
            raise CraftMDError("--max-turns must be at least 1")
        super().__init__(spec)
        self.protocol = Protocol(self.prompts, spec.max_turns)
        self.cases, self.dataset_sha = load_cases(Path(spec.dataset), spec.config, spec.cases)
        if not self.cases:
            raise CraftMDError(f"no cases selected from config {spec.config!r}")
        self.many = load_diagnoses(Path(spec.dataset)) if "mcq_many" in self.formats else []

    def roles(self) -> dict[str, str]:
        spec = self.spec
        patient = self.need("--patient", spec.patient)
        return {"doctor": spec.doctor, "patient": patient, "summarizer": spec.summarizer or patient}

    # which experiments a case allows: the cells of the task's matrix whose needs the case meets
    def plan(self, case: Sample, with_image: bool) -> list[tuple[str, str]]:
        image_case = case.source == "nejm_image"
        out = []
        for s in self.settings:
            for f in self.formats:
                e = self.task.experiment(s, f)
                if e is None or (image_case and not e.image):
                    continue
                if e.exam and not (case.has_exam and case.history):
                    continue
                if e.options == "choices4" and len(case.choices) != 4:
                    continue
                if e.options == "diagnoses" and not self.many:
                    continue
                out.append((s, f))
        return out

    def jobs(self) -> list[tuple[Sample, int, bool]]:
        out = []
        for case in self.cases:
            flags = (False, True) if case.source == "nejm_image" and case.image is not None else (False,)
            for trial in range(self.spec.trials):
                for flag in flags:
                    if self.plan(case, flag):
                        out.append((case, trial, flag))
        return out

    def job_id(self, job) -> str:
        case, trial, flag = job
        return f"{case.case_id}/{trial}" + ("/image" if flag else "")

    def planned(self, job) -> int:
        return len(self.plan(job[0], job[2]))

    def no_jobs_message(self) -> str:
        return f"none of the experiments {', '.join(self.settings)} × {', '.join(self.formats)} applies to the selected cases"

    async def run_job(self, job) -> dict[str, list[dict]]:
        case, trial, with_image = job
        plan = self.plan(case, with_image)
        need = {s for s, _ in plan}
        sampling = self.sampling(trial)
        doctor, patient, summarizer = (self.call(a) for a in AGENTS)
        answers: list[dict] = []
        conversations: list[dict] = []

        async def ask(setting: str, fmt: str, conv: Conversation | None = None, summary: str | None = None,
                      blocked: tuple[str, str | None] | None = None) -> None:
            """One question; ``blocked`` = (status, reason) of the conversation or summary it needs, when that failed."""
            row = {"case_id": case.case_id, "trial": trial, "setting": setting, "format": fmt, "with_image": with_image}
            if blocked:
                answers.append({**row, "response": None, "status": blocked[0], "error": blocked[1]})
            else:
                msgs = self.protocol.question_messages(case, setting, fmt, with_image, conv=conv, summary=summary, many_options=self.many)
                c = await doctor(msgs, sampling, 1)  # nothing waits on a question: turns go first
                ok = c.status == "ok"
                answers.append({**row, "response": c.text if ok else None, "status": c.status, "error": None if ok else c.error})
            self.unit_done()

        def record(kind: str, conv: Conversation, summary: str | None) -> None:
            conversations.append(conversation_row(case.case_id, trial, kind, with_image, conv, summary))

        async def standard() -> None:
            conv = await self.protocol.converse(case, case.vignette, with_image, doctor, patient, sampling, sampling)
            failed = failure(conv, "conversation")
            summary, summary_failed = None, failed
            if "summarized" in need and not failed:
                c = await summarizer(self.protocol.summarizer_messages(conv), sampling)
                summary = c.text.strip() if c.status == "ok" else None
                summary_failed = None if c.status == "ok" else (c.status, f"the summary failed: {c.error or c.status}")
            record("standard", conv, summary)
            tasks = []
            for s, f in plan:
                if s == "summarized":
                    tasks.append(ask(s, f, summary=summary, blocked=summary_failed))
                elif s == "singleturn":  # needs only the patient's first answer
                    tasks.append(ask(s, f, conv=conv, blocked=None if len(conv.turns) >= 2 else failed))
                elif s in ("multiturn", "multiturn_plus_exam"):
                    tasks.append(ask(s, f, conv=conv, blocked=failed))
            await asyncio.gather(*tasks)

        async def no_exam() -> None:
            conv = await self.protocol.converse(case, case.history, with_image, doctor, patient, sampling, sampling)
            record("no_exam", conv, None)
            failed = failure(conv, "history-only conversation")
            await asyncio.gather(*(ask(s, f, conv=conv, blocked=failed) for s, f in plan if s in NO_EXAM_SETTINGS))

        work = [ask(s, f) for s, f in plan if TASK.experiment(s, f).conversation is None]
        if need & set(CONVERSATION_SETTINGS):
            work.append(standard())
        if need & set(NO_EXAM_SETTINGS):
            work.append(no_exam())
        await asyncio.gather(*work)
        return {"conversations": conversations, "answers": answers}

    def tables(self, rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
        return {"conversations": pa.Table.from_pylist(rows.get("conversations", []), CONVERSATIONS_SCHEMA),
                "answers": pa.Table.from_pylist(rows.get("answers", []), ANSWERS_SCHEMA)}

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        convs, answers = rows.get("conversations", []), rows.get("answers", [])
        failed = sum(c["ended"] in ("refusal", "error") for c in convs)
        status = ", ".join(f"{k} {v}" for k, v in tally(answers, "status").items())
        return [f"{len(convs)} conversations ({failed} failed), {len(answers)} answers ({status})"]

    # --- estimates --------------------------------------------------------------------------
    def conversation_estimate(self, est: dict[str, Estimate], doctor: str, patient: str, knowledge: str) -> int:
        """A conversation of the expected length; returns the tokens of its transcript."""
        turns, cap, reply = min(EXPECTED_TURNS, self.spec.max_turns), self.spec.max_turns, min(EXPECTED_REPLY, self.spec.max_tokens)
        base = 150 + tokens(knowledge)
        grown = reply * turns * (turns - 1)  # each turn re-sends the turns before it
        est[doctor].add(turns, 150 * turns + grown, reply * turns, cap)
        est[patient].add(turns, base * turns + grown, reply * turns, cap)
        return 2 * turns * reply

    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        case, _, with_image = job
        plan = self.plan(case, with_image)
        need = {s for s, _ in plan}
        reply = min(EXPECTED_REPLY, self.spec.max_tokens)
        transcript = {}
        if need & set(CONVERSATION_SETTINGS):
            transcript["standard"] = self.conversation_estimate(est, "doctor", "patient", case.vignette)
            if "summarized" in need:
                est["summarizer"].add(1, 100 + transcript["standard"], 4 * reply)
                self.note_call("summarizer", "summary", 100 + transcript["standard"], self.spec.max_tokens)
        if need & set(NO_EXAM_SETTINGS):
            transcript["no_exam"] = self.conversation_estimate(est, "doctor", "patient", case.history)
        many = tokens(", ".join(self.many))
        for s, f in plan:
            e = self.task.experiment(s, f)
            context = transcript.get(e.conversation or "", tokens(case.vignette)) if s != "summarized" else 4 * reply
            options = many if e.options == "diagnoses" else 40
            est["doctor"].add(1, 150 + context + options, reply)
            self.note_call("doctor", f"{s}:{f}", 150 + context + options, self.spec.max_tokens)

    # --- the run record -----------------------------------------------------------------------
    def record_extra(self, record: RunRecord, jobs) -> RunRecord:
        spec = self.spec
        record.source = {"dataset_config": spec.config, "dataset_sha256": self.dataset_sha,
                         "case_ids_sha256": case_ids_sha256(c.case_id for c in self.cases), "cases": len(self.cases)}
        record.counts = {"cases": len(self.cases), **record.counts}
        record.notes = {
            "settings": list(self.settings),
            "formats": list(self.formats),
            "max_turns": spec.max_turns,
            **record.notes,
            "protocol": "CRAFT-MD (Johri et al., Nature Medicine 2025); see the prompt set's README for verbatim vs reconstructed prompts",
        }
        return record


def failure(conv: Conversation, what: str) -> tuple[str, str] | None:
    """(status, reason) of a conversation that failed, for the answers it blocks; None when it did not."""
    if conv.ended not in ("refusal", "error"):
        return None
    return conv.ended, f"the {what} failed: {conv.error or conv.ended}"


def conversation_row(case_id: str, trial: int, kind: str, with_image: bool, conv: Conversation, summary: str | None) -> dict:
    """A ``conversations`` row of the release."""
    return {"case_id": case_id, "trial": trial, "conversation": kind, "with_image": with_image, "messages": conv.record(),
            "summary": summary, "n_turns": conv.n_turns, "ended": conv.ended,
            "error": conv.error if conv.ended in ("refusal", "error") else None}


__all__ = ["CraftMD", "parse_experiments", "load_cases", "load_diagnoses", "conversation_row", "failure"]
