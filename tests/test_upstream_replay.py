"""A CRAFT-MD run speaks upstream's own messages: replayed against upstream's recorded GPT-4 transcripts, every request
of the four settings × mcq4 and frq is the one upstream's code builds for that case, byte for byte, in its role.

What upstream's code builds is written here from ``src/craftmd.py`` (``craftmd_gpt``, ``craftmd_opensource``) and
``src/utils.py``, with upstream's prompts rendered through the package's parse of ``src/prompts.py``, on what the results
files say upstream passed (their ``case_vignette`` and ``question``) and the CSV's category and choices. The server
answers each expected request with what upstream's run recorded for it, so the run follows the recorded conversation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from craftmd import CraftMDError
from craftmd.generation.runner import GenerateSpec, generate
from craftmd.release import read_release
from craftmd.upstream_prompts import upstream_code, upstream_prompt

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer  # noqa: E402

#: 30 recorded cases (short conversations): MedQA, Derm-Public and Derm-Private, 11 specialties ("Other" and renamed ones).
REPLAY = {
    "n": 30,
    "seed": 12,
    "max_messages": 16,
    "categories": ("Other", "Dermatology", "Cardiovascular System", "Neurology", "Renal and Genitourinary System"),
}
EXPERIMENTS = ["vignette", "multiturn", "singleturn", "summarized", "mcq4", "frq"]
CELLS = [(s, f) for s in ("vignette", "multiturn", "singleturn", "summarized") for f in ("mcq4", "frq")]


def key(msgs: list[dict]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in msgs], ensure_ascii=False)


def answer(x) -> str:
    """What the server says for a recorded reply (some recorded answers are missing or not text)."""
    return x if isinstance(x, str) and x.strip() else "(nothing recorded)"


def upstream_requests(row: dict, rec: dict, source, layout: str = "gpt") -> tuple[dict[str, str], dict[str, str]]:
    """Every request upstream's ``craftmd_gpt`` (``layout="opensource"``: ``craftmd_opensource``) sends for trial 0 of
    one case -> the reply its run recorded; and the recorded answer of each setting_format."""
    P = lambda name, *args: upstream_prompt(name, *args, source=source)  # noqa: E731
    specialty, case_desc, question = row["category"], rec["case_vignette"], rec["question"]
    choices = ", ".join(row[f"choice_{i}"] for i in range(1, 5))  # utils.get_choices
    t = rec["trial_0"]
    conv = t["multiturn_conversation"]
    gpt = layout == "gpt"
    top = "system" if gpt else "user"
    doctor = [{"role": top, "content": P("get_doctor_prompt", specialty)}] + conv[1:]
    out = {
        key([{"role": top, "content": P("get_vignette_mcq_prompt", specialty, case_desc, question, choices)}]): t["vignette_mcq"],
        key([{"role": top, "content": P("get_vignette_frq_prompt", specialty, case_desc, question)}]): t["vignette_frq"],
    }
    patient = [{"role": "system", "content": P("get_patient_prompt", case_desc)}]
    for n in range(2, len(conv)):
        if conv[n]["role"] == "assistant":  # the doctor's turn n, on its view so far
            out[key(doctor[:n])] = conv[n]["content"]
        else:  # the patient's, on the flipped dialogue
            flipped = [{"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]} for m in conv[1:n]]
            out[key(patient + flipped)] = conv[n]["content"]
    for setting, view in (("multiturn", doctor[:-1]), ("singleturn", doctor[:3])):
        for fmt, prompt in (
            ("mcq", P("get_mcq_after_conversation_prompt", choices, question)),
            ("frq", P("get_frq_after_conversation_prompt", question)),
        ):
            if gpt:
                msgs = view + [{"role": "system", "content": prompt}]
            else:
                msgs = view[:-1] + [{**view[-1], "content": view[-1]["content"] + f"\n\n{prompt}"}]
            out[key(msgs)] = t[f"{setting}_{fmt}"]
    said = "".join(m["content"] + " " for m in doctor[1:] if m["role"] == "user")  # utils.get_patient_responses
    out[key([{"role": "system", "content": P("convert_to_summarized_prompt", said)}])] = t["summarized_conversation"]
    summary = t["summarized_conversation"]
    out[key([{"role": "user", "content": P("get_vignette_mcq_prompt", specialty, summary, question, choices)}])] = t[
        "summarized_mcq"
    ]
    out[key([{"role": "user", "content": P("get_vignette_frq_prompt", specialty, summary, question)}])] = t["summarized_frq"]
    answers = {f"{s}_{f}": t[f"{s}_{f.replace('mcq4', 'mcq')}"] for s, f in CELLS}
    return {k: answer(v) for k, v in out.items()}, answers


class Recorded:
    """The server: answers each expected request with its recorded reply; any other request is listed and refused."""

    def __init__(self, expected: dict[str, str]):
        self.expected = expected
        self.sent: list[str] = []
        self.unexpected: list[list] = []

    def __call__(self, req: dict) -> str:
        k = key(req["messages"])
        self.sent.append(k)
        if k not in self.expected:
            self.unexpected.append(req["messages"])
            raise ValueError("not a request upstream's code makes")
        return self.expected[k]


def spec(dataset, out, url, **kw) -> GenerateSpec:
    base = dict(
        dataset=dataset,
        out=out,
        doctor="openai/loopback",
        task="craftmd",
        patient="openai/loopback",
        base_url=url,
        cache=out.parent / f"{out.name}.sqlite",
        trials=1,
        progress=False,
        timeout=10.0,
        backoff=0.01,
        concurrency=16,
        experiments=EXPERIMENTS,
    )
    return GenerateSpec(**{**base, **kw})


def rows_of(upstream) -> dict[str, dict]:
    return {r["case_id"]: r for r in upstream["csv"].iter_rows(named=True) if r["case_id"] in upstream["text"]}


def replay_run(layout, ids, upstream, source, tiny_dataset, tmp_path):
    rows = rows_of(upstream)
    expected, answers = {}, {}
    for cid in ids:
        e, a = upstream_requests(rows[cid], upstream["text"][cid], source, layout)
        assert not set(e) & set(expected), "two cases share a request: the replay could not tell them apart"
        expected.update(e)
        answers.update({(cid, k): v for k, v in a.items()})
    server = Recorded(expected)
    options = {} if layout == "gpt" else {"message_roles": layout}
    with LoopbackServer(server) as s:
        report = generate(spec(tiny_dataset, tmp_path / layout, s.base_url, cases=ids, options=options))
    return server, answers, read_release(report.path)


def replayable(upstream) -> list[str]:
    """The picked cases whose recorded turns all hold text: GPT-4 once gave upstream's patient an empty reply, which
    upstream passed on; the package records an empty reply as a failed call (by design), so such a case cannot follow
    its recording."""
    convs = {cid: rec["trial_0"]["multiturn_conversation"] for cid, rec in upstream["text"].items()}
    return sorted(cid for cid, conv in convs.items() if all(m["content"].strip() for m in conv[1:]))


def test_every_request_is_upstreams_own_in_upstreams_roles(upstream, source, tiny_dataset, tmp_path):
    ids = replayable(upstream)
    assert len(ids) >= REPLAY["n"] - 2
    rows = {cid: r for cid, r in rows_of(upstream).items() if cid in ids}
    assert {"MedQA_USMLE", "dermatology_public", "dermatology_private"} <= {r["dataset"] for r in rows.values()}
    assert {"Other", "Cardiovascular System"} <= {r["category"] for r in rows.values()} and len(
        {r["category"] for r in rows.values()}
    ) >= 6
    server, answers, rel = replay_run("gpt", ids, upstream, source, tiny_dataset, tmp_path)
    assert server.unexpected == []  # every request the run sent is one upstream's code makes for that case
    assert set(server.sent) == set(server.expected)  # and every one upstream's code makes was sent
    assert len(server.sent) == len(server.expected)  # once each
    got = {(a["case_id"], f"{a['setting']}_{a['format']}"): a["response"] for a in rel.table("answers").to_pylist()}
    assert got == {k: answer(v) for k, v in answers.items()}  # the run followed the recorded conversations
    conv = {c["case_id"]: c for c in rel.table("conversations").to_pylist()}
    for cid in ids:
        rec = upstream["text"][cid]["trial_0"]["multiturn_conversation"]
        assert (
            conv[cid]["messages"][1:] == rec[1:]
            and conv[cid]["summary"] == upstream["text"][cid]["trial_0"]["summarized_conversation"]
        )
    record = rel.manifest.prompt_set
    text_cells = [c for c in record["upstream"]["cells"] if not c.endswith(":image")]  # (image jobs: the image replay)
    assert record["name"] == "craftmd-upstream-3bb2737" and sorted(text_cells) == sorted(f"{s}:{f}" for s, f in CELLS)
    assert rel.manifest.notes["message_roles"] == "gpt"


def test_the_open_source_path_is_upstreams_too(upstream, source, tiny_dataset, tmp_path):
    ids = replayable(upstream)[:6]
    server, answers, rel = replay_run("opensource", ids, upstream, source, tiny_dataset, tmp_path)
    assert server.unexpected == [] and set(server.sent) == set(server.expected)
    assert all(m["role"] != "system" for c in rel.table("conversations").to_pylist() for m in c["messages"])
    got = {(a["case_id"], f"{a['setting']}_{a['format']}"): a["response"] for a in rel.table("answers").to_pylist()}
    assert got == {k: answer(v) for k, v in answers.items()}
    assert rel.manifest.notes["message_roles"] == "opensource"


def test_the_open_source_cap_ends_the_conversation_as_upstream_does(upstream, source, tiny_dataset, tmp_path):
    """Upstream's open-source path stops once the doctor's view holds 30 messages and asks its question on that view
    without the doctor's last (unanswered) question, appended to the patient's last turn."""
    cid = sorted(upstream["text"])[0]
    sent = []

    def responder(req):
        sent.append(req["messages"])
        first = req["messages"][0]["content"]
        if first.startswith("You are a patient"):
            return f"Answer {len(req['messages'])}."
        return "**Final Diagnosis:** Flu" if "Stop asking" in req["messages"][-1]["content"] else "Anything else?"

    with LoopbackServer(responder) as s:
        report = generate(
            spec(
                tiny_dataset,
                tmp_path / "cap",
                s.base_url,
                cases=[cid],
                experiments=["multiturn", "frq"],
                options={"message_roles": "opensource"},
            )
        )
    cap = upstream_code(source).opensource_message_cap
    (conv,) = read_release(report.path).table("conversations").to_pylist()
    assert len(conv["messages"]) == cap and conv["ended"] == "max_turns" and conv["messages"][-1]["content"] == "Anything else?"
    (question,) = [m for m in sent if "Stop asking" in m[-1]["content"]]
    question_text = upstream_prompt("get_frq_after_conversation_prompt", upstream["text"][cid]["question"], source=source)
    assert question[:-1] == conv["messages"][:-2]
    assert question[-1] == {"role": "user", "content": conv["messages"][-2]["content"] + "\n\n" + question_text}


def test_craftmd_v1_stays_selectable_and_the_layout_needs_upstreams_set(upstream, tiny_dataset, tmp_path):
    from craftmd.generation.protocol import PromptSet
    from craftmd.tasks.diagnosis.protocol import CraftMD

    cid = sorted(upstream["text"])[0]
    sent = []

    def responder(req):
        sent.append(req["messages"])
        return "**Final Diagnosis:** Flu"

    with LoopbackServer(responder) as s:
        report = generate(
            spec(
                tiny_dataset, tmp_path / "v1", s.base_url, cases=[cid], experiments=["multiturn", "frq"], prompt_set="craftmd-v1"
            )
        )
        with pytest.raises(CraftMDError, match="message_roles=opensource is upstream's layout"):
            generate(
                spec(
                    tiny_dataset,
                    tmp_path / "bad",
                    s.base_url,
                    cases=[cid],
                    prompt_set="craftmd-v1",
                    options={"message_roles": "opensource"},
                )
            )
    v1 = PromptSet("craftmd-v1", CraftMD.prompts_root)
    assert read_release(report.path).manifest.prompt_set == v1.describe()
    doctor = [m for m in sent if len(m) > 2 and m[1]["role"] == "assistant"]  # the doctor's view: opening as assistant
    assert doctor and doctor[0][0]["content"] == v1.text(
        "doctor_system.txt", specialty=v1.specialty_clause(_specialty(cid, tiny_dataset)), image=""
    )
    assert doctor[0][1]["content"] == v1.text("doctor_opening.txt")


def _specialty(cid, dataset):
    from craftmd.dataset import load_config

    return dict(load_config(dataset, "all").select("case_id", "specialty").iter_rows())[cid]
