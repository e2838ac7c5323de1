"""History taking (issue #14): the deterministic metrics, MediQ's facts config, and the dermatologists' check."""

from __future__ import annotations

import io
import json
import math
import random
import shutil
import tarfile

import pyarrow.compute as pc
import pytest

from craftmd import CraftMDError
from craftmd.scoring.score import score_release, stale
from craftmd.dataset import load_config
from craftmd.scoring import history as H


@pytest.fixture(scope="module")
def releases(source, dataset_dir, tmp_path_factory):
    """Two upstream models ingested: GPT-4V (image cases) and LLaMA-2 (its system prompt sent as a user message)."""
    from craftmd.generation.ingest import ingest

    out = tmp_path_factory.mktemp("history_releases")
    ingest(source, dataset_dir, out, models=["gpt4v", "llama2-7b"], progress=False)
    return out


def _messages(row):
    return [m["role"] for m in row["messages"]], [m["content"] for m in row["messages"]]


def test_metrics_equal_rouge_score_exactly_on_real_conversations(releases, dataset_dir):
    from rouge_score import rouge_scorer

    from craftmd.release import read_release

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    vignettes = dict(load_config(dataset_dir, "all").select("case_id", "vignette").iter_rows())
    vignettes.update(load_config(dataset_dir, "nejm_image").select("case_id", "vignette").iter_rows())
    compared = 0
    for model in ("gpt4v", "llama2-7b"):
        rows = read_release(releases / model).table("conversations").to_pylist()
        for row in random.Random(14).sample(rows, 25):
            roles, contents = _messages(row)
            doctor, patient, questions, _ = H.split_turns(roles, contents)
            ref = vignettes[row["case_id"]]
            got = {m: v for m, v, _ in H.score_conversation(roles, contents, H.Reference(ref, None))}
            r1 = scorer.score(ref, "\n".join(patient))["rouge1"]
            want = {"patient_info_recall": r1.recall, "patient_info_precision": r1.precision, "patient_info_f1": r1.fmeasure}
            qs = [doctor[i] for i in questions]
            if len(qs) >= 2:
                pairs = [scorer.score(qs[i], qs[j]) for i in range(len(qs)) for j in range(i + 1, len(qs))]
                for r in ("rouge1", "rouge2", "rougeL"):
                    want[f"question_similarity_{r}"] = math.fsum(p[r].fmeasure for p in pairs) / len(pairs)
            for metric, value in want.items():
                assert got[metric] == value, (model, row["case_id"], row["trial"], metric)
                compared += 1
            assert got["patient_info_recall_at_100"] == got["patient_info_recall"]
    assert compared > 200


def test_tokens_are_rouge_scores_and_lcs_its_table():
    from rouge_score import rouge_scorer, tokenize, tokenizers

    text = "The patient's rashes were itching; she DENIED fevers (38.5 °C) — naïve İstanbul ﬁbrosis running 1st"
    assert H.tokens(text) == tokenize.tokenize(text, tokenizers.DefaultTokenizer(True)._stemmer)
    rng = random.Random(3)
    for _ in range(200):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 70))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 70))]
        table = rouge_scorer._lcs_table(a, b)[-1][-1] if a and b else 0
        assert (H.lcs_length(a, b) if a and b else 0) == table


def test_question_similarity_is_rouge_scores_across_word_boundaries_and_batches():
    """The vectorised pairs (sparse overlaps, LCS in 64-bit words) against rouge-score, with questions of 0 to 200
    tokens (one to four words, repeats, empty ones), and many conversations at once as one at a time."""
    import numpy as np
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    rng = random.Random(5)
    convs = []
    for _ in range(120):
        alphabet = rng.choice(["ab", "abcdefg", "abcdefghijklmnopqrstuvwxyz"])
        convs.append([[rng.choice(alphabet) for _ in range(rng.choice([0, 1, 2, 5, 30, 63, 64, 65, 127, 128, 129, 200]))]
                      for _ in range(rng.randint(0, 6))])  # fmt: skip
    for qs in convs:
        got = H.question_similarity(qs)
        if len(qs) < 2:
            assert got is None
            continue
        pairs = [scorer.score(" ".join(qs[i]), " ".join(qs[j])) for i in range(len(qs)) for j in range(i + 1, len(qs))]
        assert got == tuple(math.fsum(p[r].fmeasure for p in pairs) / len(pairs) for r in ("rouge1", "rouge2", "rougeL"))
    ids = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    flat = [ids[t] for qs in convs for q in qs for t in q]
    lens = [len(q) for qs in convs for q in qs]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    assert H._similarities(np.array(flat), starts, lens, [len(qs) for qs in convs]) == [H.question_similarity(qs) for qs in convs]


def test_the_patient_is_never_the_system_prompt():
    roles = ["user", "assistant", "user", "assistant", "user", "assistant"]
    contents = ["You are an AI doctor. fever", "Hi! What symptoms are you facing today?", "I have a rash.",
                "Any fever?", "No fever.", "Final Diagnosis: measles"]  # fmt: skip
    doctor, patient, questions, answered = H.split_turns(roles, contents)
    assert patient == ["I have a rash.", "No fever."]
    assert doctor == ["Any fever?", "Final Diagnosis: measles"] and questions == [0] and answered == 2


def test_reference_rule_on_the_dataset(dataset_dir):
    case = load_config(dataset_dir, "all").filter(load_config(dataset_dir, "all")["physical_exam"] != "").row(0, named=True)
    refs = H._references(dataset_dir, {(case["case_id"], False, "no_exam"), (case["case_id"], False, "standard")})
    assert refs[(case["case_id"], False, "no_exam")].total == len(H.tokens(case["history"]))
    assert refs[(case["case_id"], False, "standard")].total == len(H.tokens(case["vignette"]))
    assert refs[(case["case_id"], False, "no_exam")].total < refs[(case["case_id"], False, "standard")].total


def test_fact_matching_on_hand_made_examples():
    fever, itch, age = (H.content_stems(f) for f in ("The man denied having a fever.", "The rash is itchy and painful.",
                                                      "A 22-year-old man presented with complaints."))  # fmt: skip
    assert fever == {"fever"} and "man" not in age and {"22", "year", "old"} <= age
    said = set(H.tokens("No, I haven't had any fevers. I'm 22 years old."))
    assert H.covered(fever, said) and H.covered(age, said)
    assert (
        H.covered(itch, set(H.tokens("It itches a lot"))) is False
    )  # itchi/itch: 0 of 3 content stems ("itchi", "pain", "rash")
    assert H.covered(itch, set(H.tokens("the rash hurts, it is painful"))) is True  # 2 of 3 >= 0.5
    reference = set(H.tokens("He denies fever. His rash is itchy and painful."))
    assert H.fact_hits([fever, itch, age], reference, said) == [1, 0, None]  # the age is not in what the patient held
    assert H.covered(frozenset(), said) is False


def test_facts_config_is_in_the_built_dataset_with_its_attribution(dataset_dir):
    facts = load_config(dataset_dir, "facts")
    assert facts.columns == ["case_id", "facts", "mediq_id", "mediq_file", "match_rule"]
    assert facts.height == 279 and facts["case_id"].n_unique() == 279
    by_file = facts.group_by("mediq_file").len().sort("mediq_file").rows()
    assert by_file == [("data/all_craft_md.jsonl", 133), ("data/all_dev_good.jsonl", 146)]
    first = facts.row(0, named=True)
    assert first["case_id"] == "case_0" and first["facts"][4] == "The man denied having a fever."
    card = (dataset_dir / "README.md").read_text()
    for needle in (
        "MediQ: Question-Asking LLMs and a Benchmark for Reliable Interactive Clinical Reasoning",
        "NeurIPS 2024",
        "Li, S. S.",
        "Tsvetkov",
        "CC BY 4.0",
        "config_name: facts",
        "cc-by-4.0",
    ):
        assert needle in card, needle
    assert "MediQ atomic facts (facts config) for 279 cases" in (dataset_dir / "build_report.md").read_text()
    from datasets import load_dataset

    ds = load_dataset(str(dataset_dir), "facts", split="test")
    assert ds.num_rows == 279 and ds.features["facts"].feature.dtype == "string"


def _retar(src, dest, change):
    with tarfile.open(src) as tin, tarfile.open(dest, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None
            if data is not None and m.name.endswith(change):
                data = data.replace(b"fever", b"fevre", 1)
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)


def test_a_tampered_or_missing_mediq_archive_is_refused_in_one_line(source, tmp_path, monkeypatch):
    from craftmd.dataset_builder import mediq as MQ
    from craftmd.dataset_builder.build import build_dataset

    bad = tmp_path / "mediq.tar.gz"
    _retar(MQ.default_location(), bad, "data/all_craft_md.jsonl")
    with pytest.raises(CraftMDError) as e:
        build_dataset(source, tmp_path / "out", mediq=bad, progress=False)
    assert "data/all_craft_md.jsonl does not match the pinned sha256" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("CRAFTMD_MEDIQ", str(tmp_path / "nowhere.tar.gz"))
    with pytest.raises(CraftMDError) as e:
        build_dataset(source, tmp_path / "out", progress=False)
    assert "MediQ archive not found" in str(e.value) and "\n" not in str(e.value)


def test_scores_are_written_beside_the_release_and_a_rerun_is_byte_identical(releases, dataset_dir, tmp_path):
    from craftmd.release import read_release

    rel = tmp_path / "gpt4v"
    shutil.copytree(releases / "gpt4v", rel)
    from conftest import frozen

    before = frozen(rel)
    old = read_release(rel).scores_with_records()[0]
    assert stale(rel, dataset_dir, ["history"]) == ["history"]
    score_release(rel, dataset_dir, ["history"], progress=False, force=True)
    assert frozen(rel) == before and sorted(p.name for p in rel.iterdir()) == [
        "answers.parquet",
        "conversations.parquet",
        "manifest.json",
        "scores.parquet",
    ]
    r = read_release(rel)
    table, records = r.scores_with_records()
    hist = table.filter(pc.equal(table["scorer"], H.SCORER))
    assert set(hist["metric"].to_pylist()) == set(H.METRIC_NAMES) - {"patient_fact_recall"}  # image cases: no facts
    assert {"conversation", "with_image"} <= set(table.column_names)
    assert table.num_rows - hist.num_rows == old.num_rows  # the graders' rows are kept
    assert records[H.SCORER]["scored"] == 165 and records[H.SCORER]["version"] == H.HISTORY_VERSION
    assert stale(rel, dataset_dir, ["history"]) == []
    first = (rel / "scores.parquet").read_bytes()
    score_release(rel, dataset_dir, ["history"], progress=False, force=True, options={"workers": 1})
    assert (rel / "scores.parquet").read_bytes() == first
    score_release(rel, dataset_dir, ["history"], progress=False)
    assert (rel / "scores.parquet").read_bytes() == first


def test_fact_recall_is_scored_where_the_case_has_facts(releases, dataset_dir, tmp_path):
    from craftmd.release import read_release

    rel = tmp_path / "llama"
    shutil.copytree(releases / "llama2-7b", rel)
    score_release(rel, dataset_dir, ["history"], progress=False, force=True)
    t = read_release(rel).scores_with_records()[0]
    fr = t.filter(pc.equal(t["metric"], "patient_fact_recall")).to_pylist()
    with_facts = set(load_config(dataset_dir, "facts")["case_id"].to_list())
    assert fr and {r["case_id"] for r in fr} <= with_facts and len({r["case_id"] for r in fr}) >= 270
    d = json.loads(fr[0]["detail"])
    assert d["held"] == sum(h is not None for h in d["hits"]) and fr[0]["value"] == d["revealed"] / d["held"]


def test_the_dermatologists_agreement_on_q2_is_reproduced(source, dataset_dir):
    from craftmd.analysis.agreement.history_validity import history_validity_audit

    audit = history_validity_audit(None, dataset_dir, source, B=200)
    raters = {r[0]: r for r in audit["tables"][1]["rows"]}
    assert raters["doctor_history"][1:4] == [60, 0.8, pytest.approx(0.58, abs=0.005)]
    assert audit["id"] == "history_validity" and audit["figures"] == []
    aucs = {(r[0], r[2]): r for r in audit["tables"][0]["rows"]}
    row = aucs[("patient_info_recall (vs history)", "all resolved")]
    assert row[3] == 180 and row[7] <= row[6] <= row[8] and row[6] > 0.5
    assert "each other" in audit["description"]
