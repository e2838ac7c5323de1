"""Upstream's prompts read from its pinned code: parsed with ast, rendered as upstream's functions would, pinned, cached;
anything the parser does not read is refused in one line."""

from __future__ import annotations

import io
import tarfile

import pytest

from craftmd import CraftMDError
from craftmd.source import PINNED_COMMIT, code_location
from craftmd.upstream_prompts import (
    _load,
    parse_craftmd,
    parse_utils,
    parse_prompts,
    upstream_cases,
    upstream_code,
    upstream_image_cases,
    upstream_prompt,
    upstream_prompts_sha256,
)

CODE = f"craft-md-code-{PINNED_COMMIT}.tgz"

CRAFTED = """
def f(kind, text, n):
    if kind=="Other":
        p = "A."
    else:
        p = f"A {kind}."
    p += " B  " + text
    p += f"\\n{n} words" + "!"
    return p
"""


def test_constructs_render_as_python_would():
    t = parse_prompts(CRAFTED)["f"]
    assert t.render("Other", "x", 3) == "A. B  x\n3 words!"
    assert t.render("Skin", "y", "four") == "A Skin. B  y\nfour words!"
    with pytest.raises(CraftMDError, match="takes 3 arguments"):
        t.render("Other", "x")
    with pytest.raises(CraftMDError, match="text must be a string"):
        t.render("Other", 5, 3)  # "..." + 5 raises in Python too


@pytest.mark.parametrize(
    "snippet",
    [
        "def f(a):\n    p = a.upper()\n    return p\n",
        "def f(a):\n    p = 'x %s' % a\n    return p\n",
        "def f(a):\n    p = f'{a!r}'\n    return p\n",
        "def f(a):\n    p = f'{a:>9}'\n    return p\n",
        "def f(a):\n    if a != 'Other':\n        p = 'x'\n    return p\n",
        "def f(a):\n    p = ''\n    for x in a:\n        p += x\n    return p\n",
        "def f(a='x'):\n    return a\n",
        "import os\ndef f(a):\n    return a\n",
        "def f(a):\n    p = 'x'\n",
        "def f(a):\n    p = 'x'\n    p *= 2\n    return p\n",
    ],
)
def test_an_unsupported_construct_is_refused_in_one_line(snippet):
    with pytest.raises(CraftMDError) as err:
        parse_prompts(snippet)
    msg = str(err.value)
    assert "\n" not in msg and "src/prompts.py:" in msg and "not a construct the prompt parser reads" in msg


@pytest.fixture(scope="module")
def recorded(source):
    """The CSV's categories and a few recorded open-source (mistral-v1) runs, which were made with the pinned code."""
    import json

    import polars as pl

    csv = pl.read_csv(source.read("data/usmle_and_derm_dataset.csv"))
    cats = dict(zip(csv["case_id"].to_list(), csv["category"].to_list()))
    other = next(c for c, k in cats.items() if k == "Other")
    files = source.read_files([f"results/mistral-v1/{c}.json" for c in ("case_1", other, "case_2000")])
    return cats, {k.rsplit("/", 1)[1][:-5]: json.loads(v) for k, v in files.items()}


def test_the_pinned_code_gives_every_prompt_function_and_the_opening(source, recorded):
    code = upstream_code(source)
    assert {
        "get_doctor_prompt",
        "get_patient_prompt",
        "get_vignette_mcq_prompt",
        "get_vignette_frq_prompt",
        "get_mcq_after_conversation_prompt",
        "get_frq_after_conversation_prompt",
        "convert_to_summarized_prompt",
        "get_extract_diagnosis_name_prompt",
        "get_diagnosis_evaluation_prompt",
        "get_meld_prompt",
    } <= set(code.templates)
    assert code.templates["get_vignette_mcq_prompt"].params == ("specialty", "case_vignette", "question", "choices")
    assert code.opensource_message_cap == 30
    # the recorded runs open with the line the code holds, on both sides
    assert recorded[1]["case_1"]["trial_0"]["multiturn_conversation"][1]["content"] == code.opening


def test_doctor_prompt_renders_as_the_open_source_runs_recorded_it(source, recorded):
    """The open-source runs (mistral-v1) were made with the pinned code: their doctor prompt is the rendered one, for a
    named specialty and for "Other" (no specialty)."""
    cats, recs = recorded
    assert "Other" in {cats[c] for c in recs}
    for cid, rec in recs.items():
        first = rec["trial_0"]["multiturn_conversation"][0]
        assert first["content"] == upstream_prompt("get_doctor_prompt", cats[cid], source=source), cid
    assert "specializing" not in upstream_prompt("get_doctor_prompt", "Other", source=source)


def test_unknown_function_and_sha256(source):
    with pytest.raises(CraftMDError, match="has no function 'get_nothing'"):
        upstream_prompt("get_nothing", source=source)
    a = upstream_prompts_sha256(["get_meld_prompt", "get_doctor_prompt"], source=source)
    assert a == upstream_prompts_sha256(["get_doctor_prompt", "get_meld_prompt", "get_meld_prompt"], source=source)
    assert len(a) == 64 and a != upstream_prompts_sha256(["get_meld_prompt"], source=source)
    # the hash is over the parsed templates: one changed literal changes it
    t = parse_prompts("def f(a):\n    p = 'x'\n    return p\n")["f"]
    u = parse_prompts("def f(a):\n    p = 'y'\n    return p\n")["f"]
    assert t.text != u.text


def test_the_parse_is_cached_per_location(source):
    upstream_code(source)
    hits = _load.cache_info().hits
    upstream_prompt("get_frq_after_conversation_prompt", "Q?", source=source)
    assert _load.cache_info().hits == hits + 1


def _code_members(source):
    tgz = code_location(source.location)
    assert tgz.endswith(CODE), "the code archive sits beside the data archive"
    with tarfile.open(tgz) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def test_a_changed_or_missing_code_file_is_refused(source, tmp_path):
    members = _code_members(source)
    changed = tmp_path / "changed" / CODE
    changed.parent.mkdir()
    with tarfile.open(changed, "w:gz") as tar:
        for m, data in members:
            if data is not None and m.name.endswith("src/prompts.py"):
                data = data.replace(b"questios", b"questions")  # upstream's typo "fixed": not the pinned file
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    with pytest.raises(CraftMDError, match="src/prompts.py does not match the pinned sha256"):
        upstream_prompt("get_doctor_prompt", "Other", source=str(changed))
    # a data folder with no code beside it and none inside: one line saying where the code should be
    (tmp_path / "bare" / "craft-md-x" / "data").mkdir(parents=True)
    with pytest.raises(CraftMDError, match=f"craft-md-code-{PINNED_COMMIT}.tgz beside the data archive"):
        upstream_prompt("get_doctor_prompt", "Other", source=str(tmp_path / "bare"))


def test_upstreams_own_archive_shape_is_read_too(source, tmp_path):
    """Code unpacked over the data (upstream's own archive of the commit holds src/ beside data/) is read in place."""
    root = tmp_path / "full"
    for m, data in _code_members(source):
        if data is not None:
            (root / m.name).parent.mkdir(parents=True, exist_ok=True)
            (root / m.name).write_bytes(data)
    assert code_location(root) == str(root)
    assert upstream_prompt("get_patient_prompt", "V.", source=str(root)) == upstream_prompt(
        "get_patient_prompt", "V.", source=source
    )


def test_craftmd_py_without_its_opening_is_refused():
    with pytest.raises(CraftMDError, match="no function craftmd_gpt"):
        parse_craftmd("def other():\n    pass\n")


def test_upstreams_inputs_of_every_case_are_the_results_files_split(source):
    """What the package passes upstream's prompts for a case (the split ported from src/utils.py, its literals read
    from there) is what every results file says upstream passed: its case_vignette and question, byte for byte."""
    import json

    cases = upstream_cases(source)
    recs = [json.loads(v) for v in source.read_files(["results/gpt4_1106/*.json"]).values()]
    assert len(recs) == len(cases) == 2004
    differ = [
        r["case_id"]
        for r in recs
        if (cases[r["case_id"]].vignette, cases[r["case_id"]].question) != (r["case_vignette"], r["question"])
    ]
    assert differ == []
    assert sum("  is" in c.question for c in cases.values()) > 100  # "of the following" dropped, its double space kept


def test_utils_py_without_the_split_is_refused():
    with pytest.raises(CraftMDError, match="no function get_case_without_question"):
        parse_utils("def other():\n    pass\n")
    with pytest.raises(CraftMDError, match="not the split the package ports"):
        parse_utils("def get_case_without_question(case):\n    return case\n")


def test_the_multimodal_image_message_is_read_from_the_pinned_code(source):
    """craftmd_multimodal's image message (role, parts in order) is read with ast, alike for its three messages; a file
    where one of them is laid out otherwise, or without the function, is refused in one line."""
    from craftmd.source import Source

    assert upstream_code(source).image_message == ("system", ("text", "image_url"))
    text = Source(code_location(source.location), source.commit, part="code").read("src/craftmd.py").decode()
    head = 'conv = [{"role": "system", "content": [{"type": "text",'
    assert text.count(head) == 2  # the two vignette questions (the doctor's message is a third)
    with pytest.raises(CraftMDError, match="no single image message layout") as err:
        parse_craftmd(text.replace(head, head.replace("system", "user"), 1))
    assert "\n" not in str(err.value)
    with pytest.raises(CraftMDError, match="no function craftmd_multimodal"):
        parse_craftmd(text.replace("def craftmd_multimodal(", "def renamed("))


def test_upstreams_inputs_of_the_nejm_cases_are_their_gpt4v_results_split(source):
    """What upstream's multimodal path passed for an NEJM case: its results file's case_vignette and question (the
    split left "of the following" out, its double space kept), the specialty "Other", no choices."""
    import json

    cases = upstream_image_cases(source)
    recs = [json.loads(v) for v in source.read_files(["results/gpt4v/*.json"]).values()]
    assert len(cases) == len(recs) == 33
    assert all((cases[r["case_id"]].vignette, cases[r["case_id"]].question) == (r["case_vignette"], r["question"]) for r in recs)
    assert {(c.specialty, c.choices) for c in cases.values()} == {("Other", "")}
    assert sum("  is" in c.question for c in cases.values()) >= 5
