"""``craftmd generate --task agentclinic``: AgentClinic's OSCE protocol on the one runner (prompt set ``agentclinic-v1``).

One job per (case, trial). The doctor under test is told the case's objective and its message budget (``budget``,
default 20) and, after every reply, how many messages it has used. A message with ``REQUEST TEST: <test>`` is answered
by the **measurement** agent, which holds the case's examination findings and test results (and reports findings
within normal limits for what it does not hold); any other message is answered by the **patient**, which holds the
patient's facts and never names the diagnosis. ``DIAGNOSIS READY: <diagnosis>`` ends the conversation (the markers are
read in any case); the **moderator** then says whether that diagnosis names the case's reference diagnosis (Yes/No). A
doctor that has not given one when its budget is spent ran out of budget: no diagnosis, not correct. Each bias
(``doctor_bias``, ``patient_bias``) is added to that role's system prompt only. An NEJM case's image is shown to the
doctor with its first message; a case whose image cannot be had is refused before any call (:func:`.cases.fetch_image`).

The release holds ``conversations`` (one ``osce`` conversation per job: the doctor's view, the doctor as
``assistant``) and ``osce`` (per job: questions used, tests requested, the diagnosis, the moderator's verdict and reply).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from craftmd import CraftMDError
from craftmd.generation.protocol import image_url, text_of
from craftmd.generation.runner import Estimate, Runner, case_ids_sha256, tally, tokens
from craftmd.release import RunRecord

from .cases import ATTRIBUTION, COMMIT, Case, fetch_image, load_cases, own_file

#: How the doctor asks the measurement agent, and how it ends (read in any case; the rest of the line is the value).
TEST_MARK = re.compile(r"REQUEST\s+TEST\s*:[ \t]*(.*)", re.I)
DIAGNOSIS_MARK = re.compile(r"DIAGNOSIS\s+READY\s*:[ \t]*(.*)", re.I)
#: The moderator's verdict: its reply's first word when that is Yes or No, else the one of them it says as a word.
VERDICT = re.compile(r"^\W*(yes|no)\b", re.I)
VERDICT_WORD = re.compile(r"\b(yes|no)\b", re.I)
#: The moderator's part of an ``osce`` row when it was not asked (no diagnosis, or an empty one).
NOT_ASKED = {"moderator_status": "not_asked", "moderator_verdict": None, "moderator_reply": None, "error": None}
PROTOCOL_NOTE = (
    "AgentClinic's OSCE protocol (Schmidgall et al. 2024, arXiv 2405.07960) as this package runs it: its own prompts "
    "(prompt set agentclinic-v1, in the package's words), message budget, marker reading and moderator rule; a protocol "
    "of its own, not comparable with AgentClinic's published numbers"
)


def marked(pattern: re.Pattern, text: str) -> str | None:
    """The value after a marker in ``text`` (its first line, without brackets or a closing full stop), or None when the
    marker is not there; ``""`` when it is there with nothing after it."""
    m = pattern.search(text)
    if m is None:
        return None
    value = m.group(1).strip().strip("[]").strip()
    return value.rstrip(".").strip()


def verdict_of(reply: str) -> str | None:
    """``yes`` or ``no`` from the moderator's reply: its first word when that is one of them, else the one of them it
    says as a word ("The correct answer is Yes."); None when it says neither, or both after another first word."""
    m = VERDICT.match(reply or "")
    if m:
        return m.group(1).lower()
    said = {w.lower() for w in VERDICT_WORD.findall(reply or "")}
    return said.pop() if len(said) == 1 else None


class AgentClinic(Runner):
    default_prompt_set = "agentclinic-v1"
    prompts_root = Path(__file__).parent / "prompts"
    unit = "conversations"

    def __init__(self, spec, *, calls=None):
        if spec.config != "all":  # the dataset configs are CRAFT-MD's; a case set is an option of this task
            raise CraftMDError(
                f"--config {spec.config}: the agentclinic task's cases are chosen with -T case_set=NAME, not --config"
            )
        super().__init__(spec, calls=calls)
        o = self.options
        biases = json.loads(self.prompts.text("biases.json"))
        self.bias = {}
        for role, name in (("doctor", o.doctor_bias), ("patient", o.patient_bias)):
            if name == "none":
                self.bias[role] = ""
                continue
            text = biases.get(role, {}).get(name)
            if not text:
                raise CraftMDError(f"prompt set {self.prompts.name!r} has no {role} bias {name!r}")
            self.bias[role] = "\n\n" + text.strip()
        self.cases, self.origin = load_cases(spec.dataset, o.case_set, spec.cases)
        self.images = bool(self.cases) and self.cases[0].with_image
        if self.images:  # never posed without the image: every selected case's image had before any call
            folder = Path(o.image_dir).expanduser() if o.image_dir else None
            if folder is not None and not folder.is_dir():
                raise CraftMDError(f"-T image_dir={o.image_dir}: not a folder")
            self.cases = [Case(**{**c.__dict__, "image": fetch_image(c, folder)}) for c in self.cases]
        self.dataset_sha = self.origin["sha256"]

    def jobs(self) -> list[tuple[Case, int]]:
        return [(c, t) for c in self.cases for t in range(self.spec.trials)]

    def no_jobs_message(self) -> str:
        return f"no cases selected from case set {self.options.case_set!r}"

    def shows_images(self) -> bool:
        return self.images

    def note(self, used: int) -> str:
        """What the doctor is told of its budget after ``used`` messages (and, before its last, that it is the last)."""
        budget, P = self.options.budget, self.prompts
        note = P.text("budget_note.txt", used=used, budget=budget, left=budget - used).strip()
        return note + ("\n" + P.text("last_turn.txt").strip() if budget - used == 1 else "")

    async def run_job(self, job) -> dict[str, list[dict]]:
        case, trial = job
        P, o, sampling = self.prompts, self.options, self.sampling(trial)
        key = {"case_id": case.case_id, "trial": trial}
        objective = case.objective or P.text("nejm_objective.txt").strip()
        system = P.text("doctor_system.txt", objective=objective, budget=o.budget, bias=self.bias["doctor"]).strip()
        opening = P.text("doctor_opening.txt").strip() + "\n\n" + self.note(0)
        first: str | list = opening
        if case.image is not None:
            caption = P.text("image_caption.txt").strip()
            first = [{"type": "text", "text": opening + "\n\n" + caption}, {"type": "image_url", "image_url": {"url": image_url(case.image)}}]  # fmt: skip
        view = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        patient = [
            {"role": "system", "content": P.text("patient_system.txt", patient=case.patient, bias=self.bias["patient"]).strip()}
        ]
        measurement = [{"role": "system", "content": P.text("measurement_system.txt", exam=case.exam).strip()}]
        tests: list[str] = []
        used, ended, error, diagnosis = 0, None, None, None
        while ended is None:
            c = await self.call("doctor")(view, sampling)
            if c.status != "ok":
                ended, error = c.status, f"the doctor failed: {c.error or c.status}"
                break
            said = (c.text or "").strip()
            used += 1
            view.append({"role": "assistant", "content": said})
            diagnosis = marked(DIAGNOSIS_MARK, said)
            if diagnosis is not None:
                ended = "diagnosis"
                break
            if used >= o.budget:
                ended = "out_of_budget"
                break
            test = marked(TEST_MARK, said)
            if test is not None:
                tests.append(test)
                measurement.append({"role": "user", "content": P.text("measurement_request.txt", test=test).strip()})
                r = await self.call("measurement")(measurement, sampling)
                who = "measurement agent"
            else:
                patient.append({"role": "user", "content": said})
                r = await self.call("patient")(patient, sampling)
                who = "patient"
            if r.status != "ok":
                ended, error = r.status, f"the {who} failed: {r.error or r.status}"
                break
            answer = (r.text or "").strip()
            (measurement if test is not None else patient).append({"role": "assistant", "content": answer})
            shown = P.text("result_to_doctor.txt", test=test, result=answer).strip() if test is not None else answer
            view.append({"role": "user", "content": shown + "\n\n" + self.note(used)})
        verdict = await self.moderate(case, diagnosis, sampling) if ended == "diagnosis" else dict(NOT_ASKED)
        conversation = {
            **key,
            "conversation": "osce",
            "with_image": case.with_image,
            "messages": [{"role": m["role"], "content": text_of(m["content"])} for m in view[1:]],
            "summary": None,
            "n_turns": used,
            "ended": ended,
            "error": error,
        }
        osce = {
            **key,
            "case_set": case.case_set,
            "with_image": case.with_image,
            "budget": o.budget,
            "questions_used": used,
            "tests_requested": len(tests),
            "tests": tests,
            "diagnosis": diagnosis,
            "reference": case.answer,
            "ended": ended,
            **verdict,
            "error": error if ended in ("refusal", "error") else verdict.get("error"),
        }
        return {"conversations": [conversation], "osce": [osce]}

    async def moderate(self, case: Case, diagnosis: str, sampling) -> dict:
        """The moderator's verdict on ``diagnosis`` (an empty one is not asked: not correct)."""
        if not diagnosis:
            return dict(NOT_ASKED)
        P = self.prompts
        user = P.text("moderator_user.txt", correct=case.answer, diagnosis=diagnosis).strip()
        c = await self.ask("moderator", P.text("moderator_system.txt").strip(), user, sampling)
        if c.status != "ok":
            return {"moderator_status": c.status, "moderator_verdict": None, "moderator_reply": None,
                    "error": f"the moderator failed: {c.error or c.status}"}  # fmt: skip
        reply = (c.text or "").strip()
        v = verdict_of(reply)
        if v is None:
            return {"moderator_status": "invalid", "moderator_verdict": None, "moderator_reply": reply,
                    "error": f"the moderator said neither Yes nor No: {reply[:120]!r}"}  # fmt: skip
        return {"moderator_status": "ok", "moderator_verdict": v, "moderator_reply": reply, "error": None}

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
        osce = rows.get("osce", [])
        return [
            f"{len(osce)} conversations (ended: {fmt(tally(osce, 'ended'))})",
            f"moderator: {fmt(tally(osce, 'moderator_status'))}; verdicts: {fmt(tally([r for r in osce if r['moderator_verdict']], 'moderator_verdict'))}",
        ]

    #: For estimates: a typical conversation's doctor messages and reply tokens.
    EXPECTED_TURNS = 10
    EXPECTED_REPLY = 60

    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        case = job[0]
        cap = self.options.budget
        turns, reply = min(self.EXPECTED_TURNS, cap), min(self.EXPECTED_REPLY, self.spec.max_tokens)
        grown = reply * turns * (turns - 1)
        est["doctor"].add(turns, (300 + tokens(case.objective)) * turns + grown, reply * turns, cap)
        est["patient"].add(turns * 0.7, (250 + tokens(case.patient)) * turns * 0.7 + grown * 0.35, reply * turns * 0.7, cap - 1)
        est["measurement"].add(turns * 0.3, (200 + tokens(case.exam)) * turns * 0.3, reply * turns * 0.3, cap - 1)
        est["moderator"].add(1, 150, 5, 1)
        self.note_call("doctor", "message", 300 + tokens(case.objective) + 2 * reply * cap, self.spec.max_tokens)
        self.note_call("patient", "reply", 250 + tokens(case.patient) + 2 * reply * cap, self.spec.max_tokens)
        self.note_call("measurement", "result", 200 + tokens(case.exam) + 2 * reply * cap, self.spec.max_tokens)

    def record_extra(self, record: RunRecord, jobs) -> RunRecord:
        o = self.options
        record.dataset = {
            "name": "agentclinic",
            "config": o.case_set if not own_file(o.case_set) else "own",
            "sha256": self.dataset_sha,
        }
        record.source = {
            **self.origin,
            "case_set": o.case_set if not own_file(o.case_set) else Path(o.case_set).name,
            "case_ids_sha256": case_ids_sha256(c.case_id for c in self.cases),
            "cases": len(self.cases),
        }
        record.counts = {"cases": len(self.cases), **record.counts}
        record.notes = {
            **record.notes,
            "options": o.model_dump(mode="json") | ({"case_set": Path(o.case_set).name} if own_file(o.case_set) else {}),
            "protocol": PROTOCOL_NOTE,
            "comparable_with_published": False,
            "attribution": ATTRIBUTION,
            "upstream_commit": COMMIT,
            "markers": "REQUEST TEST: <test> (the measurement agent answers) and DIAGNOSIS READY: <diagnosis> (the end), in any case",
            "budget_rule": "every doctor message uses one of the budget's messages; a doctor with no diagnosis when it is spent ran out of budget",
        }
        if o.image_dir:
            record.notes["options"]["image_dir"] = Path(o.image_dir).name  # a local folder: its name, never its path
        if own_file(o.case_set) and record.protocol is not None:  # a case file: named by its name and content, not its path
            named = f"{Path(o.case_set).name}@sha256:{self.dataset_sha[:16]}"
            record.protocol = record.protocol.model_copy(update={"options": {**record.protocol.options, "case_set": named}})
        return record


__all__ = ["AgentClinic", "marked", "verdict_of", "TEST_MARK", "DIAGNOSIS_MARK", "PROTOCOL_NOTE"]
