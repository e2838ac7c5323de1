"""Patient-led encounters played by a script against the loopback server: the tiny MedPI packets dataset
(fixture ``medpi``), the scripted agents (:class:`Script`) and a run of :func:`~craftmd.generation.runner.generate` (task encounters) over them.
Shared by the encounters tests and the judge's tests on encounters."""

from __future__ import annotations

import json
import re

import pytest

from craftmd.dataset_builder.packets import build_packets
from craftmd.generation.runner import GenerateSpec, generate
from craftmd.tasks.encounters import EMOTIONS

CELLS = ["asthma:medication_advice", "depression:diagnosis"]


@pytest.fixture(scope="module")
def medpi(tmp_path_factory):
    out = tmp_path_factory.mktemp("medpi") / "medpi"
    build_packets(out, seed=1, scale=0.05, cells=CELLS, progress=False)
    return out


#: The scripted emotion step's feeling (the state after every valid step).
FEELING = {"anxiety": 6, "fear": 3, "interest": 4}


def emotion_json(turn_text: str, **over) -> str:
    scores = {e: 0 for e in EMOTIONS}
    scores.update(FEELING)
    body = {
        "emotions": scores,
        "valence": -3,
        "arousal": 6,
        "summary": "worried but hopeful",
        "reflection": f"The doctor asked about {turn_text[:30]}",
        "poignancy": 4,
    }
    body.update(over)
    return "Here you go: " + json.dumps(body)


class Script:
    """Plays every agent by the system prompt's role: the doctor asks ``doctor_turns`` questions then closes
    (or never, when None); the patient answers naming its first known condition; every second emotion step is
    malformed; the closure classifier says reasonable when the doctor said goodbye; the memory tagger as
    :meth:`tags` says."""

    def __init__(self, doctor_turns: int | None = 2, patient_closes_at: int | None = None, bad_tags: str = "depress"):
        self.doctor_turns, self.patient_closes_at, self.bad_tags = doctor_turns, patient_closes_at, bad_tags
        self.emotion_calls = 0

    def tags(self, prompt: str) -> str:
        """The memory tagger: not JSON for a patient whose visit reason contains ``bad_tags``; otherwise the oldest
        memory feels like :data:`FEELING`, the second gets importance 2, the last an out-of-range score (invalid),
        the rest calmness."""
        if self.bad_tags and re.search(rf"^Booked a visit for: .*{self.bad_tags}", prompt, re.M | re.I):
            return "I cannot put feelings into numbers."
        ids = re.findall(r"^- (m\d{3}):", prompt, re.M)
        tags = {i: {"emotions": {"calmness": 2}} for i in ids}
        tags[ids[0]] = {"emotions": dict(FEELING)}
        tags[ids[1]]["importance"] = 2
        tags[ids[-1]] = {"emotions": {"joy": 42}}
        return "Tags: " + json.dumps(tags)

    def __call__(self, req: dict) -> str:
        system = req["messages"][0]["content"]
        if system.startswith("You tag the memories"):
            return self.tags(req["messages"][1]["content"])
        if system.startswith("You are a doctor"):
            asked = sum(m["role"] == "assistant" for m in req["messages"])
            if self.doctor_turns is not None and asked >= self.doctor_turns:
                return "Thank you, that is all for today. Goodbye. [END]"
            return f"Question {asked + 1}: how have you been feeling, and what medicines do you take?"
        if system.startswith("You read a patient"):
            turn = len(re.findall(r"^Doctor:", req["messages"][1]["content"], re.M))
            return "not json at all" if turn % 2 else emotion_json(req["messages"][1]["content"][-40:])
        if system.startswith("You judge"):
            return json.dumps({"reasonable_end": "Goodbye" in req["messages"][1]["content"], "rationale": "scripted"})
        # the patient
        known = re.search(r"health problems you have been told about: ([^(;\n]+)", system)
        said = sum(m["role"] == "assistant" for m in req["messages"])
        text = f"I have {known.group(1).strip() if known else 'some worries'}. It has been hard."
        if self.patient_closes_at and said + 1 >= self.patient_closes_at:
            text += " Thank you, goodbye. [END]"
        return text


def patient_down(medpi, *, objective: str = "diagnosis", trial: int = 1, script: Script | None = None):
    """A responder that plays ``script`` (default: a doctor asking twice), except that the patient model of the first
    packet with ``objective`` is down (HTTP 400) in its trial ``trial``: that encounter fails."""
    from craftmd.dataset_builder.packets import load_packets

    who = next(p for p in load_packets(medpi) if p["objective"] == objective)
    script = script or Script(doctor_turns=2)

    def play(req):
        if req["messages"][0]["content"].startswith("You are " + who["name"]) and req.get("seed") == trial:
            raise ValueError("the patient model is down")
        return script(req)

    return play


def run(server, medpi, out, cache, **kw):
    """An encounters run against ``server``; keyword arguments are the run spec's, or the task's options (max_messages, …)."""
    options = {k: kw.pop(k) for k in ("max_messages", "memory_tags", "tag_max_tokens", "embedder", "retrieval") if k in kw}
    spec = GenerateSpec(
        options=options,
        task="encounters",
        dataset=medpi,
        out=out,
        doctor="openai/loopback",
        patient="openai/loopback",
        base_url=server.base_url,
        api_key="sk-test",
        cache=cache,
        progress=False,
        max_retries=1,
        backoff=0.01,
        **kw,
    )
    return generate(spec)


def judge_says(request: dict) -> str:
    """A category-mode rubric judge for the training environments' tests: a doctor who asked about the patient's
    medicines scores 1 + crc32(dimension) % 4 on each dimension asked (not all alike), one who did not scores 1 on each."""
    import zlib

    prompt = request["messages"][0]["content"]
    if prompt.startswith("You chair"):
        return "Clinician: the doctor's questions, quoted."
    ids = re.findall(r"^- ([a-z_]+\.[a-z_]+) \(", prompt, re.M)
    asked = "medicines" in prompt.split("Transcript", 1)[-1]
    return json.dumps(
        {
            "scores": [
                {"dimension": d, "score": 1 + (zlib.crc32(d.encode()) % 4 if asked else 0), "rationale": "r", "evidence": []}
                for d in ids
            ]
        }
    )
