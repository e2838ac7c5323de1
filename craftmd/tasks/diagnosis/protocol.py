"""CRAFT-MD's protocol on the one runner (:mod:`craftmd.generation.runner`): ``craftmd generate --task craftmd``.

One job per (case, trial, image flag): the standard conversation, the history-only conversation where
the exam set-ups ask for it, the summary, and every selected (setting, format) question; inside a job
the turns run in order and the questions that need only the case at once. An answer that could not be
asked because its conversation or summary failed carries that failure's reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from craftmd.answer_order import ORDERED_FORMATS, permutation
from craftmd.generation.protocol import Conversation, Protocol
from craftmd.generation.questions import (
    EXPECTED_REPLY,
    conversation_estimate,
    conversation_row,
    failure,
    load_diagnoses,
    no_jobs_message,
    parse_experiments,
    plan_cells,
    produced,
)
from craftmd.generation.runner import Estimate, Runner, answer_row, tokens
from craftmd.release import RunRecord
from craftmd.samples import Sample

#: The default prompt set: upstream's own prompts, read from its pinned code (``craftmd-v1`` is the package's wording).
UPSTREAM_PROMPT_SET = "craftmd-upstream-3bb2737"
#: The settings that read the whole standard conversation (singleturn reads its first turn, summarized its summary).
MULTITURN = ("multiturn", "multiturn_plus_exam")


@dataclass
class Job:
    """One job's inputs and what it has made so far."""

    case: Sample
    trial: int
    with_image: bool
    plan: list[tuple[str, str]]
    sampling: object
    answers: list[dict] = field(default_factory=list)
    conversations: list[dict] = field(default_factory=list)


class CraftMD(Runner):
    """One job per (case, trial, image flag): the standard conversation, the history-only conversation where the
    exam set-ups ask for it, the summary, and every selected (setting, format) question."""

    default_prompt_set = UPSTREAM_PROMPT_SET
    prompts_root = Path(__file__).parent / "prompts"
    unit = "answers"

    def __init__(self, spec, *, calls=None):
        super().__init__(spec, calls=calls)
        self.settings, self.formats = parse_experiments(spec.experiments, self.task)
        self.protocol = Protocol(self.prompts, self.options.max_turns, self.options.message_roles)
        self.cases  # noqa: B018  (the selected cases, loaded now: a bad selection is said before anything runs)
        self.many = load_diagnoses(Path(spec.dataset)) if "mcq_many" in self.formats else []
        if any(c.source == "nejm_image" for c in self.cases):
            self.protocol.image_cases  # noqa: B018  (upstream's inputs of the NEJM cases, read now, once)

    def plan(self, case: Sample, with_image: bool) -> list[tuple[str, str]]:
        """The experiments a case is posed in: the cells of the task's matrix whose needs the case meets."""
        return plan_cells(self.task, self.settings, self.formats, case, with_image, self.many)

    def reads(self, kind: str) -> set[str]:
        """The settings whose questions read conversation ``kind`` (standard, no_exam)."""
        return {e.setting for e in self.task.experiments if e.conversation == kind}

    def flags(self, case: Sample) -> tuple[bool, ...]:
        """The image flags a case is posed with: an NEJM case with its image both without and with it."""
        return (False, True) if case.source == "nejm_image" and case.image is not None else (False,)

    def jobs(self) -> list[tuple[Sample, int, bool]]:
        out = []
        for case in self.cases:
            for trial in range(self.spec.trials):
                for flag in self.flags(case):
                    if self.plan(case, flag):
                        out.append((case, trial, flag))
        return out

    def shows_images(self) -> bool:
        return any(flag and self.plan(case, flag) for case in self.cases for flag in self.flags(case))

    def job_id(self, job) -> str:
        case, trial, flag = job
        return f"{case.case_id}/{trial}" + ("/image" if flag else "")

    def planned(self, job) -> int:
        return len(self.plan(job[0], job[2]))

    def no_jobs_message(self) -> str:
        return no_jobs_message(self.settings, self.formats)

    async def run_job(self, job) -> dict[str, list[dict]]:
        case, trial, with_image = job
        j = Job(case, trial, with_image, self.plan(case, with_image), self.sampling(trial))
        need = {s for s, _ in j.plan}
        work = [self.ask(j, s, f) for s, f in j.plan if self.task.experiment(s, f).conversation is None]
        if need & self.reads("standard"):
            work.append(self.standard(j, need))
        if need & self.reads("no_exam"):
            work.append(self.no_exam(j))
        await asyncio.gather(*work)
        return {"conversations": j.conversations, "answers": j.answers}

    async def ask(
        self,
        j: Job,
        setting: str,
        fmt: str,
        conv: Conversation | None = None,
        summary: str | None = None,
        blocked: tuple[str, str | None] | None = None,
    ) -> None:
        """One question; ``blocked`` = (status, reason) of the conversation or summary it needs, when that failed."""
        key = {"case_id": j.case.case_id, "trial": j.trial, "setting": setting, "format": fmt, "with_image": j.with_image}
        if blocked:
            j.answers.append(answer_row(key, blocked=blocked))
            return
        msgs = self.protocol.question_messages(
            j.case, setting, fmt, j.with_image, conv=conv, summary=summary, many_options=self.many, order=self.order(j, fmt)
        )
        # priority 1: nothing waits on a question, the conversations' turns go first
        j.answers.append(answer_row(key, await self.call("doctor")(msgs, j.sampling, 1)))

    def order(self, j: Job, fmt: str) -> list[int] | None:
        """The order the question's options are shown in (``-T answer_order``; :mod:`craftmd.answer_order`): None, as given."""
        o = self.options
        if o.answer_order == "upstream" or fmt not in ORDERED_FORMATS:
            return None
        n = len(j.case.choices) if fmt == "mcq4" else len(self.many)
        return permutation(n, j.case.case_id, j.trial, fmt, o.order_seed)

    async def standard(self, j: Job, need: set[str]) -> None:
        """The standard conversation, its summary, and the questions that read them."""
        p = self.protocol
        upstream = p.upstream(j.case, j.with_image) is not None
        knowledge = p.knowledge(j.case, j.with_image)
        conv = await p.converse(
            j.case, knowledge, j.with_image, self.call("doctor"), self.call("patient"), j.sampling, j.sampling
        )
        failed = failure(conv, "conversation")
        summary, summary_failed = None, failed
        if "summarized" in need and not failed:
            c = await self.call("summarizer")(p.summarizer_messages(conv, upstream), j.sampling)
            summary = p.summary_text(c.text, upstream) if c.status == "ok" else None
            summary_failed = None if c.status == "ok" else (c.status, f"the summary failed: {c.error or c.status}")
        j.conversations.append(conversation_row(j.case.case_id, j.trial, "standard", j.with_image, conv, summary))
        tasks = []
        for s, f in j.plan:
            if s == "summarized":
                tasks.append(self.ask(j, s, f, summary=summary, blocked=summary_failed))
            elif s == "singleturn":  # needs only the patient's first answer
                tasks.append(self.ask(j, s, f, conv=conv, blocked=None if len(conv.turns) >= 2 else failed))
            elif s in MULTITURN:
                tasks.append(self.ask(j, s, f, conv=conv, blocked=failed))
        await asyncio.gather(*tasks)

    async def no_exam(self, j: Job) -> None:
        """The history-only conversation and the questions that read it."""
        conv = await self.protocol.converse(
            j.case, j.case.history, j.with_image, self.call("doctor"), self.call("patient"), j.sampling, j.sampling
        )
        j.conversations.append(conversation_row(j.case.case_id, j.trial, "no_exam", j.with_image, conv, None))
        failed = failure(conv, "history-only conversation")
        await asyncio.gather(*(self.ask(j, s, f, conv=conv, blocked=failed) for s, f in j.plan if s in self.reads("no_exam")))

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        return produced(rows)

    # --- estimates --------------------------------------------------------------------------
    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        case, _, with_image = job
        plan = self.plan(case, with_image)
        need = {s for s, _ in plan}
        max_turns, max_tokens = self.options.max_turns, self.spec.max_tokens
        reply = min(EXPECTED_REPLY, max_tokens)
        transcript = {}
        if need & self.reads("standard"):
            transcript["standard"] = conversation_estimate(est, max_turns, max_tokens, case.vignette)
            if "summarized" in need:
                est["summarizer"].add(1, 100 + transcript["standard"], 4 * reply)
                self.note_call("summarizer", "summary", 100 + transcript["standard"], max_tokens)
        if need & self.reads("no_exam"):
            transcript["no_exam"] = conversation_estimate(est, max_turns, max_tokens, case.history)
        many = tokens(", ".join(self.many))
        for s, f in plan:
            e = self.task.experiment(s, f)
            context = transcript.get(e.conversation or "", tokens(case.vignette)) if s != "summarized" else 4 * reply
            options = many if e.options == "diagnoses" else 40
            est["doctor"].add(1, 150 + context + options, reply)
            self.note_call("doctor", f"{s}:{f}", 150 + context + options, max_tokens)

    # --- the run record -----------------------------------------------------------------------
    def record_extra(self, record: RunRecord, jobs) -> RunRecord:
        record = self.record_source(record)
        record.notes = {
            "settings": list(self.settings),
            "formats": list(self.formats),
            "max_turns": self.options.max_turns,
            "message_roles": self.options.message_roles,
            **self.task.protocol_options(self.options),  # -T answer_order, where it is not upstream's
            **record.notes,
            "protocol": "CRAFT-MD (Johri et al., Nature Medicine 2025); see the prompt set's README for whose wording each prompt is",
        }
        return record


__all__ = ["CraftMD", "UPSTREAM_PROMPT_SET"]
