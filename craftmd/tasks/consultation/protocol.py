"""``craftmd generate --task consultation``: the consultation protocol on the one runner (prompt set ``consult-v1``).

Per (case, trial): the ``consult`` conversation (the patient opens with the case's initial request from the
``keyinfo`` config; the doctor under test asks; the lazy patient answers), the scripted oracle doctors
(``oracle_direct``/``_random``/``_reverse``: one question per key, in the extracted, a seeded shuffled or the reversed
order), and the solver's answer to each setting's question from what the conversation gathered (``upper``: the whole
vignette; ``lower``: the request alone; ``<kind>_<p>``: the first ⌈p·K/100⌉ of its K rounds). A case without
key-value information is posed in ``upper`` only; a failed conversation blocks its answers, which carry its reason.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from craftmd import CraftMDError
from craftmd.atomic import sha256_file
from craftmd.dataset import config_file
from craftmd.generation.protocol import Conversation, Protocol
from craftmd.generation.questions import (
    EXPECTED_REPLY,
    conversation_estimate,
    conversation_row,
    no_jobs_message,
    parse_experiments,
    plan_cells,
    produced,
)
from craftmd.generation.runner import Estimate, Runner, answer_row, tokens
from craftmd.keyinfo import CONFIG, load_keyinfo
from craftmd.models.base import Completion
from craftmd.samples import Sample

#: The conversation kinds, the consulting doctor's first.
CONVERSATIONS = ("consult", "oracle_direct", "oracle_random", "oracle_reverse")
#: The shares of rounds the solver answers after.
SHARES = (20, 40, 60, 80, 100)
#: The framework's two doctors (its §4.2) as prompt sets: the short one asks until it has no more questions, the long one
#: as many as it can, up to 10. A release's ``prompt_set`` names which; the page compares them.
DOCTOR_PROMPTS = {"consult-v1": "short", "consult-long-v1": "long"}
ORACLES = {"oracle_direct": "direct", "oracle_random": "random", "oracle_reverse": "reverse"}


def cut(setting: str) -> tuple[str | None, int | None]:
    """``consult_40`` -> (``consult``, 40); ``upper``/``lower`` -> (None, None)."""
    kind, _, share = setting.rpartition("_")
    return (kind, int(share)) if kind in CONVERSATIONS else (None, None)


def rounds(conv: Conversation) -> list[tuple[str, str]]:
    """(doctor question, patient answer) pairs after the patient's opening, in order."""
    t = conv.turns
    return [(t[i]["content"], t[i + 1]["content"]) for i in range(1, len(t) - 1, 2)
            if t[i]["role"] == "assistant" and t[i + 1]["role"] == "user"]  # fmt: skip


def oracle_keys(keys: list[str], order: str, seed: int, case_id: str) -> list[str]:
    """The keys in the oracle's ``order``: direct, random (seeded by the trial's seed and the case id) or reverse."""
    if order == "reverse":
        return keys[::-1]
    if order == "random":
        out = list(keys)
        random.Random(f"{seed}:{case_id}").shuffle(out)
        return out
    return list(keys)


class Consultation(Runner):
    default_prompt_set = "consult-v1"
    prompts_root = Path(__file__).parent / "prompts"
    unit = "answers"

    def __init__(self, spec, *, calls=None):
        if spec.config == "nejm_image":
            raise CraftMDError(
                "the consultation task poses text cases; pick a text config (all, medqa_usmle, derm_public, derm_private)"
            )
        super().__init__(spec, calls=calls)
        self.settings, self.formats = parse_experiments(spec.experiments, self.task)
        self.protocol = Protocol(self.prompts, self.options.max_turns)
        self.keyinfo = load_keyinfo(spec.dataset)
        self.keyinfo_sha = sha256_file(config_file(spec.dataset, CONFIG))
        self.no_keyinfo = [c.case_id for c in self.cases if c.case_id not in self.keyinfo]

    def plan(self, case: Sample, with_image: bool = False) -> list[tuple[str, str]]:
        """The selected experiments; a case without key-value information only in ``upper``."""
        out = plan_cells(self.task, self.settings, self.formats, case, with_image, [])
        return out if case.case_id in self.keyinfo else [(s, f) for s, f in out if s == "upper"]

    def jobs(self) -> list[tuple[Sample, int, bool]]:
        return [(case, trial, False) for case in self.cases for trial in range(self.spec.trials) if self.plan(case, False)]

    def planned(self, job) -> int:
        return len(self.plan(job[0], job[2]))

    def no_jobs_message(self) -> str:
        return no_jobs_message(self.settings, self.formats)

    def solver_messages(self, case: Sample, setting: str, fmt: str, conv: Conversation | None, request: str | None) -> list[dict]:
        p = self.prompts
        block = self.protocol.question_block(case, fmt, [])
        if setting == "upper":
            user = p.text("solver_information.txt", vignette=case.vignette.strip(), question_block=block)
        else:
            kind, share = cut(setting)
            shown = rounds(conv)[: -(-share * len(rounds(conv)) // 100)] if kind else []
            lines = [p.text("transcript_patient.txt", text=request)]
            for q, a in shown:
                lines += [p.text("transcript_doctor.txt", text=q), p.text("transcript_patient.txt", text=a)]
            user = p.text(
                "solver_conversation.txt", transcript="\n".join(" ".join(x.split()) for x in lines), question_block=block
            )
        return [{"role": "system", "content": p.text("solver_system.txt")}, {"role": "user", "content": user}]

    def scripted(self, keys: list[str]):
        """The oracle's doctor: one question per key, then the closing turn; no model, no request."""
        questions = [self.prompts.text("oracle_question.txt", key=k) for k in keys] + [self.prompts.text("oracle_closing.txt")]

        async def doctor(messages, sampling) -> Completion:
            asked = sum(m["role"] == "assistant" for m in messages)
            return Completion(questions[min(asked, len(questions) - 1)], "ok")

        return doctor

    async def run_job(self, job) -> dict[str, list[dict]]:
        case, trial, _ = job
        plan, sampling = self.plan(case), self.sampling(trial)
        info = self.keyinfo.get(case.case_id)
        answers: list[dict] = []
        conversations: list[dict] = []

        async def ask(setting: str, fmt: str, conv: Conversation | None, blocked: tuple[str, str] | None) -> None:
            key = {"case_id": case.case_id, "trial": trial, "setting": setting, "format": fmt, "with_image": False}
            if blocked:
                answers.append(answer_row(key, blocked=blocked))
            else:
                messages = self.solver_messages(case, setting, fmt, conv, info.initial_request if info else None)
                answers.append(answer_row(key, await self.call("solver")(messages, sampling, 1)))

        async def conversation(kind: str) -> None:
            who = (
                self.call("doctor")
                if kind == "consult"
                else self.scripted(oracle_keys(info.keys, ORACLES[kind], sampling.seed, case.case_id))
            )
            conv = await self.protocol.converse(
                case, case.vignette, False, who, self.call("patient"), sampling, sampling, opening=info.initial_request
            )
            conversations.append(conversation_row(case.case_id, trial, kind, False, conv, None))
            failed = (
                (conv.ended, f"the {kind} conversation failed: {conv.error or conv.ended}")
                if conv.ended in ("refusal", "error")
                else None
            )
            await asyncio.gather(*(ask(s, f, conv, failed) for s, f in plan if cut(s)[0] == kind))

        work = [ask(s, f, None, None) for s, f in plan if cut(s)[0] is None]
        work += [conversation(k) for k in CONVERSATIONS if any(cut(s)[0] == k for s, _ in plan)]
        await asyncio.gather(*work)
        return {"conversations": conversations, "answers": answers}

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        return produced(rows)

    def notes(self) -> tuple[str, ...]:
        if self.no_keyinfo:
            return (f"no keyinfo   {len(self.no_keyinfo)} cases posed in upper only: {', '.join(self.no_keyinfo)}",)
        return ()

    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        case = job[0]
        plan = self.plan(case)
        max_turns, max_tokens = self.options.max_turns, self.spec.max_tokens
        reply = min(EXPECTED_REPLY, max_tokens)
        for kind in CONVERSATIONS:
            if any(cut(s)[0] == kind for s, _ in plan):
                keys = len(self.keyinfo[case.case_id].keys) if case.case_id in self.keyinfo else 0
                if kind == "consult":
                    conversation_estimate(est, max_turns, max_tokens, case.vignette)
                else:  # the scripted oracle: no doctor model, the patient answers each key
                    turns = min(keys + 1, max_turns)
                    base = 150 + tokens(case.vignette)
                    est["patient"].add(turns, base * turns + reply * turns * (turns - 1), reply * turns)
        for s, f in plan:
            est["solver"].add(1, 200 + tokens(case.vignette), reply)
            self.note_call("solver", f"{s}:{f}", 200 + tokens(case.vignette), max_tokens)

    def record_extra(self, m, jobs):
        m = self.record_source(m)
        m.source = {**m.source, "keyinfo_sha256": self.keyinfo_sha}
        m.counts = {**m.counts, "no_keyinfo": list(self.no_keyinfo)}
        m.notes = {
            "settings": list(self.settings),
            "formats": list(self.formats),
            "max_turns": self.options.max_turns,
            **m.notes,
            "protocol": "the consultation protocol of the consultation-evaluation framework on CRAFT-MD's text cases: the patient opens "
            "with the keyinfo config's initial request and answers lazily; a fixed solver answers from the conversation",
            "oracle_random_seed": "random.Random(f'{seed + trial}:{case_id}').shuffle(keys)",
            "shares": "a <kind>_<p> setting shows the initial request and the first ceil(p*K/100) of the K rounds",
            "doctor_prompt": DOCTOR_PROMPTS.get(self.prompts.name, "other"),
        }
        return m


__all__ = ["Consultation", "rounds", "oracle_keys", "cut", "CONVERSATIONS", "SHARES", "DOCTOR_PROMPTS"]
