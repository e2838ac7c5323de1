"""An image job speaks upstream's multimodal path: replayed against upstream's recorded GPT-4V transcripts, every request
of an NEJM case's image job (the four settings × frq) is the one upstream's ``craftmd_multimodal`` builds for that case,
byte for byte, in its role and content parts (the image a data URL, the second part of the system message).

What upstream's code builds is written here from ``src/craftmd.py`` (``craftmd_multimodal``) and ``src/utils.py``, with
upstream's prompts rendered through the package's parse of ``src/prompts.py``, on what the results files say upstream
passed (their ``case_vignette`` and ``question``) and the image they carry. Where the pinned code and the recorded run
disagree, the code is the reference (as for GPT-4's runs): the recorded GPT-4V doctor prompt is an earlier wording than
the pinned ``get_doctor_prompt_multimodal``, so the doctor's requests carry the pinned one and the server answers them with
the recorded turns. The pinned ``craftmd_multimodal`` reads an undefined ``specialty`` for its summarized questions (a
NameError): the package gives "Other", with which the text path's functions name no specialty, as the multimodal ones name
none. The same cases' jobs without the image speak upstream's text path on the same inputs (the specialty "Other").
What cannot be replayed: the recorded MCQ answers (``*_mcq``), since the pinned data holds no choices for the NEJM cases
(upstream's ``data/nejmai_dataset.csv`` was never released) and the task poses no MCQ on them; and the summarized
questions' exact prompts, which the recorded files do not hold (only their answers).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from craftmd.generation.ingest import upstream_protocol
from craftmd.generation.runner import generate
from craftmd.release import protocol_differences, read_release
from craftmd.upstream_prompts import upstream_prompt

sys.path.insert(0, str(Path(__file__).parent))
from test_upstream_replay import Recorded, answer, key, spec  # noqa: E402
from loopback import LoopbackServer  # noqa: E402

#: Recorded GPT-4V cases (trial 0) with short conversations.
N_CASES, MAX_MESSAGES = 8, 16
EXPERIMENTS = ["vignette", "multiturn", "singleturn", "summarized", "frq"]
SETTINGS = ("vignette", "multiturn", "singleturn", "summarized")
STAND_IN = "**Final Diagnosis:** stand-in"  # the text variant's doctor and answers (upstream recorded none)


@pytest.fixture(scope="module")
def gpt4v(source) -> dict[str, tuple[str, dict]]:
    """case_id -> (results file, record) of ``N_CASES`` recorded GPT-4V cases with short conversations."""
    files = source.read_files(["results/gpt4v/*.json"])
    recs = sorted(((p, json.loads(b)) for p, b in files.items()), key=lambda x: x[0])
    short = [(p, d) for p, d in recs if len(d["trial_0"]["multiturn_conversation"]) <= MAX_MESSAGES]
    return {d["case_id"]: (p, d) for p, d in short[:N_CASES]}


@pytest.fixture(scope="module")
def image_dataset(source, gpt4v, tmp_path_factory) -> Path:
    """A dataset folder holding the ``nejm_image`` config of those cases, made by the builder's own functions."""
    from craftmd.dataset_builder.build import write_config
    from craftmd.dataset_builder.schema import image_row
    from craftmd.dataset_builder.upstream import parse_image_case

    files = source.read_files([p for p, _ in gpt4v.values()])
    out = tmp_path_factory.mktemp("image") / "data"
    write_config(out, "nejm_image", [image_row(parse_image_case(p, files[p])[0]) for p, _ in gpt4v.values()])
    return out


def image_message(text: str, url: str) -> dict:
    """craftmd_multimodal's message with the image: one system message, a text part then the image part."""
    return {"role": "system", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}


def conversation_requests(doctor: list[dict], patient_system: str, conv: list[dict]) -> dict[str, str]:
    """The doctor's and the patient's requests of a conversation upstream's code runs (the doctor's view ``doctor``, the
    patient's flipped view under ``patient_system``) -> the reply ``conv`` recorded for each."""
    out = {}
    for n in range(2, len(conv)):
        if conv[n]["role"] == "assistant":
            out[key(doctor[:n])] = conv[n]["content"]
        else:
            flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in conv[1:n]]
            out[key([{"role": "system", "content": patient_system}] + flipped)] = conv[n]["content"]
    return out


def after_conversation(doctor: list[dict], question: str, P) -> dict[str, str]:
    """The multiturn and singleturn FRQ requests on the doctor's view (GPT layout: a system message after it)."""
    prompt = {"role": "system", "content": P("get_frq_after_conversation_prompt", question)}
    return {"multiturn": key(doctor[:-1] + [prompt]), "singleturn": key(doctor[:3] + [prompt])}


def summary_requests(doctor: list[dict], summary: str, question: str, P) -> tuple[str, str]:
    said = "".join(m["content"] + " " for m in doctor[1:] if m["role"] == "user")  # utils.get_patient_responses
    return (
        key([{"role": "system", "content": P("convert_to_summarized_prompt", said)}]),
        key([{"role": "user", "content": P("get_vignette_frq_prompt", "Other", summary, question)}]),
    )


def multimodal_requests(rec: dict, source) -> tuple[dict[str, str], dict[str, str]]:
    """Every request upstream's craftmd_multimodal sends for trial 0 of one case (frq) -> the reply its run recorded; and
    the recorded answer of each setting."""
    P = lambda name, *args: upstream_prompt(name, *args, source=source)  # noqa: E731
    case_desc, question, t = rec["case_vignette"], rec["question"], rec["trial_0"]
    conv = t["multiturn_conversation"]
    url = conv[0]["content"][1]["image_url"]["url"]  # upstream's local_image_to_data_url of the case's image
    doctor = [image_message(P("get_doctor_prompt_multimodal"), url)] + conv[1:]
    out = {key([image_message(P("get_vignette_frq_prompt_multimodal", case_desc, question), url)]): t["vignette_frq"]}
    out.update(conversation_requests(doctor, P("get_patient_prompt", case_desc), conv))
    after = after_conversation(doctor, question, P)
    out[after["multiturn"]], out[after["singleturn"]] = t["multiturn_frq"], t["singleturn_frq"]
    summarize, summarized = summary_requests(doctor, t["summarized_conversation"], question, P)
    out[summarize], out[summarized] = t["summarized_conversation"], t["summarized_frq"]
    return {k: answer(v) for k, v in out.items()}, {s: t[f"{s}_frq"] for s in SETTINGS}


def text_variant_requests(rec: dict, source) -> dict[str, str]:
    """The same case's job without the image: upstream's text path (craftmd_gpt) on the same inputs, specialty "Other";
    the patient's first answer is the recorded one (the same request), the doctor then gives a stand-in diagnosis."""
    P = lambda name, *args: upstream_prompt(name, *args, source=source)  # noqa: E731
    case_desc, question = rec["case_vignette"], rec["question"]
    conv = rec["trial_0"]["multiturn_conversation"][:3] + [{"role": "assistant", "content": STAND_IN}]
    doctor = [{"role": "system", "content": P("get_doctor_prompt", "Other")}] + conv[1:]
    out = {key([{"role": "system", "content": P("get_vignette_frq_prompt", "Other", case_desc, question)}]): STAND_IN}
    out.update(conversation_requests(doctor, P("get_patient_prompt", case_desc), conv))
    out.update(dict.fromkeys(after_conversation(doctor, question, P).values(), STAND_IN))
    summarize, summarized = summary_requests(doctor, STAND_IN, question, P)
    out[summarize], out[summarized] = STAND_IN, STAND_IN
    return out


def has_image(msgs: list[dict]) -> bool:
    return any(isinstance(m["content"], list) for m in msgs)


def test_every_image_request_is_upstreams_multimodal_own(gpt4v, image_dataset, source, tmp_path):
    expected, recorded, image_keys = {}, {}, set()
    for cid, (_, rec) in gpt4v.items():
        e, answers = multimodal_requests(rec, source)
        assert not set(e) & set(expected), "two cases share a request: the replay could not tell them apart"
        image_keys |= {k for k in e if '"image_url"' in k}
        expected.update(e)
        recorded.update({(cid, s): answer(a) for s, a in answers.items()})
        text = text_variant_requests(rec, source)
        assert all(expected.get(k, v) == v for k, v in text.items())  # shared only where the two paths send one request
        expected.update(text)
    server = Recorded(expected)
    with LoopbackServer(server) as s:
        report = generate(spec(image_dataset, tmp_path / "img", s.base_url, config="nejm_image", experiments=EXPERIMENTS))
    assert server.unexpected == []  # every request the run sent is one upstream's code makes for that case
    assert set(server.sent) == set(expected)  # and every one upstream's code makes was sent
    sent = Counter(server.sent)
    assert all(sent[k] == 1 for k in image_keys)  # each image request once
    assert len(image_keys) >= 5 * len(gpt4v)  # the doctor's turns and the vignette question carry the image
    rel = read_release(report.path)
    answers = rel.table("answers").to_pylist()
    got = {(a["case_id"], a["setting"]): a["response"] for a in answers if a["with_image"]}
    assert got == recorded  # the image jobs followed the recorded conversations to the recorded answers
    assert {a["response"] for a in answers if not a["with_image"]} == {STAND_IN}
    for c in rel.table("conversations").to_pylist():
        if c["with_image"]:
            rec = gpt4v[c["case_id"]][1]["trial_0"]
            assert c["messages"][1:] == rec["multiturn_conversation"][1:] and c["summary"] == rec["summarized_conversation"]
            assert c["messages"][0]["content"].endswith("\n<image>")  # the record keeps the text part, marks the image
    m = rel.manifest
    assert {"vignette:frq:image", "multiturn:frq:image", "singleturn:frq:image", "summarized:frq:image"} <= set(
        m.prompt_set["upstream"]["cells"]
    )
    assert {"get_doctor_prompt_multimodal", "get_vignette_frq_prompt_multimodal"} <= set(m.prompt_set["upstream"]["functions"])
    # the protocol says images were shown: never one with a text run; with GPT-4V's recorded run but for the roles and trials
    assert m.protocol.images is True
    assert "images shown to the doctor vs text only" in protocol_differences(m.protocol, upstream_protocol())
    why = protocol_differences(m.protocol, upstream_protocol(images=True))
    assert why and all(w.startswith(("patient ", "summarizer ", "1 trials")) for w in why), why


def test_the_recorded_gpt4v_doctor_prompt_is_an_earlier_wording(gpt4v, source):
    """GPT-4V's recorded doctor prompt is not the pinned get_doctor_prompt_multimodal (as GPT-4's is not the pinned
    get_doctor_prompt): the code is the reference, the recorded one an earlier wording; both end with the image line."""
    pinned = upstream_prompt("get_doctor_prompt_multimodal", source=source)
    recorded = {rec["trial_0"]["multiturn_conversation"][0]["content"][0]["text"] for _, rec in gpt4v.values()}
    assert len(recorded) == 1 and pinned not in recorded
    (text,) = recorded
    last = pinned.rsplit(".", 2)[-2].strip() + "."  # the pinned prompt's last sentence: the one line on the image
    assert text.endswith(last) and len(text) < len(pinned)


def test_an_image_job_in_the_open_source_layout_has_no_system_role(gpt4v, image_dataset, tmp_path):
    """Upstream has no open-source multimodal path: with -T message_roles=opensource an image job's messages are laid out
    as its open-source path lays out the text ones (the system messages become user turns, the image kept in its part)."""
    sent = []

    def responder(req):
        sent.append(req["messages"])
        first = req["messages"][0]
        return (
            "Just a cough."
            if isinstance(first["content"], str) and first["content"].startswith("You are a patient")
            else STAND_IN
        )

    cid = sorted(gpt4v)[0]
    with LoopbackServer(responder) as s:
        generate(
            spec(
                image_dataset,
                tmp_path / "os",
                s.base_url,
                config="nejm_image",
                cases=[cid],
                experiments=EXPERIMENTS,
                options={"message_roles": "opensource"},
            )
        )
    with_image = [m for m in sent if has_image(m)]
    assert with_image and all(m[0]["role"] == "user" and m[0]["content"][1]["type"] == "image_url" for m in with_image)
    doctor_views = [m for m in sent if len(m) > 1 and m[1]["role"] == "assistant"]  # the opening as the doctor's turn
    assert doctor_views and all(x["role"] != "system" for m in doctor_views for x in m)
