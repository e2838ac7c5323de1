"""Issue 32: the golden consultations (``consult_train``), their decontamination against the benchmark, the long and
short doctors, and the framework's Table 2/3 and Figure 5 measures of consultation releases.

Scripted dialogues are built from the pinned MediQ lines with no model; the model writer and every agent of the
consultation protocol are played by the loopback server (tests/loopback.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.dataset_builder import golden as G

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer, pick_upstream, text_of, write_replay_dataset  # noqa: E402
from test_analysis_tasks import Consultation  # noqa: E402
from test_consultation import consult, extract  # noqa: E402

TRAIN = f"{G.CONFIG}/{G.SPLIT}-00000-of-00001.parquet"


def hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


def benchmark_texts(dataset_dir: Path) -> dict[str, str]:
    out = {}
    for config in ("all", "nejm_image"):
        df = pl.read_parquet(dataset_dir / config / "test-00000-of-00001.parquet", columns=["case_id", "vignette"])
        out.update(zip(df["case_id"], df["vignette"]))
    return out


# --------------------------------------------------------------------------- the script, by hand


def test_key_values_and_the_scripted_dialogue_by_hand():
    facts = ("A 30-year-old woman comes to the clinic because of a cough for 2 weeks.", "She has a fever.",
             "Her temperature is 38.5°C and pulse is 100/min.", "Her mother has asthma.", "She smokes one pack daily.",
             "She had a fever last night too.")  # fmt: skip
    request, items = G.key_values(facts)
    assert request == "Hello doctor. A 30-year-old woman comes to the clinic because of a cough for 2 weeks. Can you help me?"
    # keys in the order of their first fact; a key's facts joined; the vital signs before the fallback rule
    assert items == [
        {"key": "Symptoms and history", "value": "She has a fever. She had a fever last night too."},
        {"key": "Vital signs", "value": "Her temperature is 38.5°C and pulse is 100/min."},
        {"key": "Family history", "value": "Her mother has asthma."},
        {"key": "Social history", "value": "She smokes one pack daily."},
    ]
    c = G.Candidate(
        "mediq:7", "mediq", "vignette", facts, "Which is the most likely diagnosis?", ("Asthma", "Pneumonia"), "Pneumonia"
    )
    row = G.script(c, "SYSTEM")
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "user"] * 4 + ["assistant"]
    assert msgs[0]["content"] == "SYSTEM" and msgs[1]["content"] == request
    assert [m["content"] for m in msgs[2:10:2]] == [G.QUESTIONS[i["key"]] for i in items]  # one key question a turn
    assert [m["content"] for m in msgs[3:10:2]] == [i["value"] for i in items]  # the patient answers it
    assert msgs[-1]["content"] == ("Thank you. Putting together what you told me: She has a fever. She had a fever last night too. "
                                   "Her temperature is 38.5°C and pulse is 100/min. Her mother has asthma. She smokes one pack daily."
                                   "\n**Final Diagnosis:** Pneumonia")  # fmt: skip
    assert row["turns"] == 4 and row["id"] == "mediq:7:script" and row["licence"] == "CC BY 4.0" and row["writer"] == "script"
    with pytest.raises(CraftMDError, match="facts list is empty"):
        G.key_values(("  ",))
    one = G.Candidate(
        "medqa-train:2", "medqa-train", "A 30-year-old woman has a cough.", ("A 30-year-old woman has a cough.",), "q", (), "a"
    )
    assert G.prepare([c, one], {}).no_facts == ["medqa-train:2"]  # a lone fact is the request: nothing to ask, listed


def test_decontamination_drops_copies_and_near_copies_with_their_scores():
    import Levenshtein

    case = (
        "A 45-year-old man comes to the emergency department because of crushing chest pain radiating to his left arm for "
        "one hour. He has hypertension and smokes. His pulse is 110/min. An ECG shows ST elevations in the anterior leads."
    )
    other = (
        "A 6-year-old girl is brought to the physician because of an itchy rash on her elbows and knees for three months. "
        "Her father has psoriasis. Examination shows silvery scaly plaques."
    )
    near = case.replace("one hour", "two hours").replace("110/min", "112/min")
    fresh = (
        "A 70-year-old woman has had progressive memory loss over two years and gets lost in her own neighbourhood; "
        "she lives alone and her daughter worries about her."
    )
    cand = [
        G.Candidate(f"medqa-train:{i}", "medqa-train", t, ("x",), "q", ("a", "b"), "a")
        for i, t in enumerate((case, near, fresh), 1)
    ]
    kept, dropped = G.decontaminate(cand, {"case_9": case, "case_10": other})
    assert [c.case for c in kept] == ["medqa-train:3"]
    norm = G.normalise(case)
    n2 = G.normalise(near)
    sim = 1 - Levenshtein.distance(norm, n2) / max(len(norm), len(n2))
    grams = lambda t: {tuple(t.split()[i : i + 8]) for i in range(len(t.split()) - 7)}  # noqa: E731
    share = len(grams(n2) & grams(norm)) / len(grams(n2))
    assert dropped == [
        {"case": "medqa-train:1", "source": "medqa-train", "benchmark_case": "case_9", "similarity": 1.0, "ngram_share": 1.0},
        {"case": "medqa-train:2", "source": "medqa-train", "benchmark_case": "case_9", "similarity": round(sim, 4),
         "ngram_share": round(share, 4)},
    ]  # fmt: skip
    assert sim >= G.LEVENSHTEIN_THRESHOLD and share < 1


# --------------------------------------------------------------------------- the build


def test_build_writes_consult_train_deterministically_with_no_benchmark_case(source, dataset_dir, tmp_path):
    import datasets
    from huggingface_hub import DatasetCard

    from craftmd.dataset_builder.build import build_dataset

    again = tmp_path / "again"
    build_dataset(source, again, progress=False)
    assert hashes(again) == hashes(dataset_dir)  # rebuilt byte-identical, consult_train included
    ds = datasets.load_dataset(str(dataset_dir), G.CONFIG, split="train", cache_dir=str(tmp_path / "hf"))
    rows = ds.to_list()
    manifest = json.loads((dataset_dir / "build_manifest.json").read_text())
    # of MediQ's 1,272 lines: 3 without facts, 152 benchmark cases, the rest kept when the diagnosis rule keeps them
    assert manifest["consult_train"]["dropped"] == 152 and manifest["consult_train"]["inputs"] == {G.MEDIQ_FILE: 1272}
    assert len(rows) == manifest["train_configs"][G.CONFIG] == 187
    assert {r["source"] for r in rows} == {"mediq"} and {r["writer"] for r in rows} == {"script"}
    assert {r["licence"] for r in rows} == {"CC BY 4.0"}
    for r in rows[:50]:
        roles = [m["role"] for m in r["messages"]]
        assert (
            roles[:2] == ["system", "user"]
            and roles[-1] == "assistant"
            and r["messages"][-1]["content"].endswith(f"**Final Diagnosis:** {r['answer']}")
        )
        assert (
            r["messages"][1]["content"] == r["initial_request"] and len(r["items"]) == r["turns"] == roles.count("assistant") - 1
        )
        assert r["answer"] in r["options"]
    # no row is within the thresholds of any benchmark case
    bench = benchmark_texts(dataset_dir)
    cands = [G.Candidate(r["case"], r["source"], r["vignette"], ("x",), "", (), "") for r in rows]
    for cid, sim, share in G.nearest(cands, bench):
        assert sim < G.LEVENSHTEIN_THRESHOLD and share < G.NGRAM_THRESHOLD
    # the MediQ lines that are CRAFT-MD cases (by the facts config's 150-character match) are dropped and listed
    from craftmd.dataset_builder.mediq import open_mediq

    lines = G.mediq_candidates(open_mediq().read_files([G.MEDIQ_FILE])[G.MEDIQ_FILE])
    prefixes = {G.normalise(v)[:150] for v in bench.values() if v.strip()}
    craft = {c.case for c in lines if c.vignette and G.normalise(c.vignette)[:150] in prefixes}
    assert len(craft) == 147 and not craft & {r["case"] for r in rows}
    report = (dataset_dir / "build_report.md").read_text()
    listed = {line.split(" | ")[0].removeprefix("| ") for line in report.splitlines() if line.startswith("| mediq:")}
    assert craft <= listed
    card = DatasetCard.load(dataset_dir / "README.md")
    cfg = {c["config_name"]: c for c in card.data.to_dict()["configs"]}
    assert cfg[G.CONFIG]["data_files"] == [{"split": "train", "path": TRAIN}]
    assert "benchmark case is excluded" in card.text and "consult_train" in card.text


def medqa_line(question: str, options: list[str], answer: int, **extra) -> str:
    letters = "ABCD"[: len(options)]
    return json.dumps({"question": question, "options": dict(zip(letters, options)), "answer": options[answer],
                       "answer_idx": letters[answer], **extra})  # fmt: skip


FRESH = (
    "A 34-year-old man comes to the physician because of a painless swelling of the left testis for two months. "
    "He has no urinary symptoms. His father had colon cancer. He smokes cigarettes. Examination shows a firm mass "
    "that does not transilluminate. Serum alpha-fetoprotein concentration is increased. Which of the following is the "
    "most likely diagnosis?"
)


class Writer:
    """The writer model: the extraction from the vignette's sentences, then a dialogue over the items; the dialogue of the
    case whose vignette says ``fails`` is prose."""

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        system, last = text_of(msgs[0]["content"]), text_of(msgs[-1]["content"])
        if system.startswith("You turn a clinical case"):
            vignette = last.split("Case description:\n", 1)[1].rsplit("\n\nJSON:", 1)[0]
            items = [{"key": f"Point {i}", "value": s} for i, s in enumerate(vignette.split(". ")[:3], 1)]
            return json.dumps(
                {
                    "initial_request": "I have a problem, doctor.",
                    "items": items,
                    **({"bad": 1} if "sarcoidosis" in vignette else {}),
                }
            )
        if system.startswith("You write a model consultation"):
            items = [ln[2:] for ln in last.splitlines() if ln.startswith("- ")]
            turns = [{"doctor": f"What about {k.split(':')[0].lower()}?", "patient": k.split(": ", 1)[1]} for k in items]
            return json.dumps({"turns": turns, "analysis": "The findings fit one diagnosis."})
        raise ValueError(system[:40])


def test_medqa_train_file_planted_case_and_model_writer(source, dataset_dir, tmp_path):
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.generation.golden import writer

    from craftmd.dataset_builder.medqa import select

    medqa = pl.read_parquet(dataset_dir / "medqa_usmle" / "test-00000-of-00001.parquet").iter_rows(named=True)
    bench = next(r for r in medqa if select(f"{r['vignette']} {r['question']}").keep)  # a case the diagnosis rule would keep
    planted = medqa_line(f"{bench['vignette']} {bench['question']}", list(bench["choices"]), bench["answer_index"])
    facts = ["1. A 29-year-old woman has a dry cough and shortness of breath.", "2. She has tender red nodules on her shins.",
             "3. A chest x-ray shows bilateral hilar lymphadenopathy."]  # fmt: skip
    with_facts = medqa_line("A 29-year-old woman has a dry cough, red nodules on the shins and bilateral hilar lymphadenopathy; "
                            "a case of sarcoidosis. Which of the following is the most likely diagnosis?",
                            ["Sarcoidosis", "Tuberculosis", "Lymphoma", "Asthma"], 0, facts=facts)  # fmt: skip
    f = tmp_path / "train.jsonl"
    f.write_text(
        "\n".join([medqa_line(FRESH, ["Seminoma", "Yolk sac tumor", "Hydrocele", "Varicocele"], 1), planted, with_facts]) + "\n"
    )
    out = tmp_path / "built"
    with LoopbackServer(Writer()) as server:
        w = writer("openai/loopback", base_url=server.base_url, cache=tmp_path / "c.sqlite", limit=None, progress=False)
        w_limited = lambda cands, system: w([c for c in cands if c.source == "medqa-train"], system)  # noqa: E731
        report = build_dataset(source, out, progress=False, medqa_train=f, golden_writer=w_limited)
        calls = server.calls
        # the same build again over the cache: no request, the same bytes
        build_dataset(source, tmp_path / "again", progress=False, medqa_train=f, golden_writer=w_limited)
        assert server.calls == calls
    assert hashes(tmp_path / "again") == hashes(out)
    rows = pq.read_table(out / TRAIN).to_pylist()
    mine = [r for r in rows if r["source"] == "medqa-train"]
    assert {(r["case"], r["writer"]) for r in mine} == {("medqa-train:1", "script"), ("medqa-train:3", "script"),
                                                         ("medqa-train:1", "openai/loopback")}  # fmt: skip
    assert {r["licence"] for r in mine} == {"MIT"}
    scripted3 = next(r for r in mine if r["case"] == "medqa-train:3")
    assert (
        scripted3["initial_request"]
        == "Hello doctor. A 29-year-old woman has a dry cough and shortness of breath. Can you help me?"
    )
    assert [i["value"] for i in scripted3["items"]] == [
        "She has tender red nodules on her shins.",
        "A chest x-ray shows bilateral hilar lymphadenopathy.",
    ]  # the line's own facts
    model = next(r for r in mine if r["writer"] == "openai/loopback")
    assert model["messages"][-1]["content"] == "The findings fit one diagnosis.\n**Final Diagnosis:** Yolk sac tumor"
    assert [m["content"] for m in model["messages"][2::2]][:-1] == [
        "What about point 1?",
        "What about point 2?",
        "What about point 3?",
    ]
    # the planted copy is dropped and reported with its benchmark case and score
    dropped = {d["case"]: d for d in report.consult_train["dropped"]}
    assert dropped["medqa-train:2"]["benchmark_case"] == bench["case_id"] and dropped["medqa-train:2"]["similarity"] == 1.0
    text = (out / "build_report.md").read_text()
    assert f"| medqa-train:2 | {bench['case_id']} | craftmd, consultation | 1.0000 | 1.0000 |" in text
    assert dropped["medqa-train:2"]["tasks"] == ["craftmd", "consultation"]  # the tasks whose test case it is
    # the writer's failure (its extraction reply does not validate) is listed, not written, not replaced
    assert report.consult_train["writer"]["failed"] == {
        "medqa-train:3": "keyinfo invalid reply: bad: Extra inputs are not permitted"
    }
    assert "- medqa-train:3: keyinfo invalid reply" in text
    assert calls == 3  # two requests for case 1, one for case 3


def test_cli_golden_writer_writes_the_first_kept_cases(source, tmp_path, capsys):
    out = tmp_path / "out"
    with LoopbackServer(Writer()) as server:
        assert cli_main(["build", "--source", source.location, "--out", str(out), "--golden-writer", "openai/loopback",
                         "--golden-base-url", server.base_url, "--golden-limit", "2", "--cache", str(tmp_path / "c.sqlite"),
                         "--quiet"]) == 0  # fmt: skip
        assert server.calls == 4
    rows = pq.read_table(out / TRAIN).to_pylist()
    scripted = [r["case"] for r in rows if r["writer"] == "script"]
    assert [r["case"] for r in rows if r["writer"] == "openai/loopback"] == scripted[
        :2
    ]  # the first two kept, beside their script
    manifest = json.loads((out / "build_manifest.json").read_text())["consult_train"]
    assert (
        manifest["writer"]["model"] == "openai/loopback"
        and manifest["writer"]["asked"] == 2
        and manifest["writer"]["failed"] == 0
    )
    assert "openai/loopback wrote 2 of 2, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("line, error", [
    ('{"question": "A 3-year-old boy has a cough. Which is the most likely diagnosis?", "answer_idx": "A"}',
     "train.jsonl:1: 'options' must map letters to texts"),
    (medqa_line(FRESH, ["a", "b"], 0, facts=[]), "train.jsonl:1: 'facts' is an empty list"),
    (medqa_line(FRESH, ["a", "b"], 0, facts=["ok", 3]), "train.jsonl:1: 'facts' must be a list of texts"),
])  # fmt: skip
def test_bad_training_inputs_are_one_line_and_write_nothing(source, tmp_path, capsys, line, error):
    f = tmp_path / "train.jsonl"
    f.write_text(line + "\n")
    out = tmp_path / "out"
    assert cli_main(["build", "--source", source.location, "--out", str(out), "--medqa-train", str(f), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and error in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_golden_writer_options_need_the_writer(source, tmp_path, capsys):
    assert cli_main(["build", "--source", source.location, "--out", str(tmp_path / "out"), "--golden-limit", "3", "--quiet"]) == 2
    assert "go with --golden-writer" in capsys.readouterr().err


# --------------------------------------------------------------------------- the measures of consultation releases


class TwoDoctors(Consultation):
    """The short doctor (``consult-v1``) asks three questions, the long one (``consult-long-v1``) five, all different."""

    def __call__(self, req: dict) -> str:
        msgs = req["messages"]
        system = text_of(msgs[0]["content"])
        if system.startswith("You are a doctor"):
            asked = sum(m["role"] == "assistant" for m in msgs)
            limit = 5 if "as many questions as you can" in system else 3
            words = ["fever", "cough", "pain in the chest", "weight loss at night", "rash"]
            return f"Do you have {words[asked]}?" if asked < limit else "**Final Diagnosis:** Pneumonia"
        return super().__call__(req)


@pytest.fixture(scope="module")
def two_doctors(source, tmp_path_factory):
    root = tmp_path_factory.mktemp("two-doctors")
    data = root / "data"
    write_replay_dataset(pick_upstream(source, 4, seed=5, max_messages=14), data)
    f = data / "all" / "test-00000-of-00001.parquet"
    df = pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase())
    df.write_parquet(f)
    models = TwoDoctors({v: (c, a) for c, v, a in zip(df["case_id"], df["vignette"], df["answer"])})
    rels = root / "releases"
    with LoopbackServer(models) as server:
        assert extract(data, server.base_url, root / "c.sqlite") == 0
        for name, prompts in (("short", "consult-v1"), ("long", "consult-long-v1")):
            assert consult(data, rels / name, server.base_url, root / "c.sqlite", "--prompt-set", prompts) == 0
            assert cli_main(["score", str(rels / name), "--dataset", str(data), "--scorer", "paper", "--scorer", "offline",
                             "--scorer", "keyinfo", "--quiet"]) == 0  # fmt: skip
    return data, rels


def test_consultation_measures_by_hand(two_doctors):
    from rouge_score.rouge_scorer import RougeScorer
    from rouge_score.tokenize import tokenize
    from nltk.stem import porter

    from craftmd.keyinfo import load_keyinfo
    from craftmd.release import read_release

    data, rels = two_doctors
    info = load_keyinfo(data)
    r1 = RougeScorer(["rouge1"], use_stemmer=True)
    rall = RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    stem = porter.PorterStemmer()
    for name, asked in (("short", 3), ("long", 5)):
        rel = read_release(rels / name)
        assert rel.manifest.prompt_set["name"] == ("consult-v1" if name == "short" else "consult-long-v1")
        assert rel.manifest.notes["doctor_prompt"] == name  # recorded in the run record
        convs = [c for c in rel.table("conversations").to_pylist() if c["conversation"] == "consult"]
        scores = pl.read_parquet(rels / name / "scores.parquet").filter(
            pl.col("scorer") == "keyinfo", pl.col("conversation") == "consult"
        )
        for c in convs:
            ki = info[c["case_id"]]
            msgs = c["messages"]
            got = {r["metric"]: r["value"] for r in scores.filter(pl.col("case_id") == c["case_id"]).to_dicts()}
            doctor = [m["content"] for m in msgs if m["role"] == "assistant"]
            patient = [m["content"] for m in msgs[2:] if m["role"] == "user"]
            questions, answers = doctor[:-1], patient
            assert len(questions) == asked == len(answers)
            assert got["doctor_turns"] == asked + 1
            assert got["doctor_words_per_turn"] == sum(len(tokenize(t, stem)) for t in doctor) / len(doctor)
            assert got["patient_words_per_turn"] == sum(len(tokenize(t, stem)) for t in patient) / len(patient)
            pairs = [(i, j) for i in range(asked) for j in range(i + 1, asked)]
            for r in ("rouge1", "rouge2", "rougeL"):
                want = math.fsum(rall.score(questions[i], questions[j])[r].fmeasure for i, j in pairs) / len(pairs)
                assert got[f"question_similarity_{r}"] == pytest.approx(want, abs=1e-12)
            for p in (20, 40, 60, 80, 100):
                k = math.ceil(p * asked / 100)
                assert got[f"doctor_key_f1_at_{p}"] == r1.score("\n".join(ki.keys), "\n".join(questions[:k]))["rouge1"].fmeasure
                assert (
                    got[f"patient_value_f1_at_{p}"] == r1.score("\n".join(ki.values), "\n".join(answers[:k]))["rouge1"].fmeasure
                )


def test_consultation_tables_and_page_compare_the_two_doctors(two_doctors, tmp_path):
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse

    data, rels = two_doctors
    out = tmp_path / "out"
    a = analyse(rels, data, out, B=200)
    write_page(a, out)
    dia = pl.read_csv(out / "tables" / "consult_dialogue.csv")
    f1 = pl.read_csv(out / "tables" / "consult_f1_rounds.csv")
    for name, asked in (("short", 3), ("long", 5)):
        sc = pl.read_parquet(rels / name / "scores.parquet").filter(pl.col("scorer") == "keyinfo")
        mine = dia.filter(pl.col("model") == name)
        assert set(mine["doctor_prompt"]) == {name}
        for conv, metric in (
            ("consult", "doctor_turns"),
            ("consult", "doctor_key_f1"),
            ("oracle_direct", "patient_value_recall"),
            ("consult", "question_similarity_rouge2"),
        ):
            per_case = (sc.filter(pl.col("conversation") == conv, pl.col("metric") == metric).group_by("case_id")
                        .agg(pl.col("value").mean()))  # fmt: skip
            row = mine.filter(pl.col("conversation") == conv, pl.col("metric") == metric).row(0, named=True)
            assert row["mean"] == pytest.approx(per_case["value"].mean(), abs=1e-6) and row["n_cases"] == per_case.height
            assert row["ci_low"] <= row["mean"] <= row["ci_high"]
        turns = mine.filter(pl.col("conversation") == "consult", pl.col("metric") == "doctor_turns").row(0, named=True)
        assert turns["mean"] == turns["ci_low"] == turns["ci_high"] == asked + 1
        for who, metric in (("doctor", "doctor_key_f1_at_60"), ("patient", "patient_value_f1_at_60")):
            per_case = (
                sc.filter(pl.col("conversation") == "consult", pl.col("metric") == metric)
                .group_by("case_id")
                .agg(pl.col("value").mean())
            )
            row = f1.filter(
                pl.col("model") == name, pl.col("conversation") == "consult", pl.col("who") == who, pl.col("share") == 60
            )
            assert row["f1"][0] == pytest.approx(per_case["value"].mean(), abs=1e-6)
    page = (out / "index.html").read_text()
    assert "How the doctors ask" in page and "The long and the short doctor" in page
    assert "tables/consult_f1_rounds.csv" in page and 'src="figures/consult_f1_rounds.png"' in page
    assert (out / "figures" / "consult_f1_rounds.png").stat().st_size > 1000
