"""The dataset builder: counts, columns, the question and history/exam splits, the
load_dataset round trip, determinism, and refused inputs (nothing written)."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.dataset import load_config
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder.build import MANIFEST, REPORT, build_dataset
from craftmd.dataset_builder.schema import CONFIGS
from craftmd.dataset_builder.upstream import CASES_CSV
from craftmd.source import Source

FIXTURES = Path(__file__).parent / "fixtures" / "medqa"


def file_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


def leftovers(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]


# --------------------------------------------------------------------------- counts and columns


def test_rows_per_config(dataset_dir):
    n = {c: load_config(dataset_dir, c).height for c in CONFIGS}
    assert n["medqa_usmle"] == 1804
    assert n["derm_public"] == 100
    assert n["derm_private"] == 100
    assert n["all"] == 2004
    assert n["nejm_image"] >= 33
    diag = load_config(dataset_dir, "diagnoses")
    assert diag["count"].sum() == 1558  # the cases whose answer names a diagnosis (test_many_choice_options_are_diagnoses)
    assert diag["diagnosis"].n_unique() == diag.height


def test_text_columns_and_values(dataset_dir):
    df = load_config(dataset_dir, "all")
    assert df.columns == [
        "case_id", "source", "specialty", "vignette", "question", "choices", "answer", "answer_index",
        "paper_answer", "task_type", "history", "physical_exam", "single_dx", "content_sha256",
    ]  # fmt: skip
    assert df["case_id"].n_unique() == 2004
    assert df["case_id"].str.contains(r"^case_\d+$").all()
    assert df["source"].value_counts().sort("source").rows() == [
        ("derm_private", 100),
        ("derm_public", 100),
        ("medqa_usmle", 1804),
    ]
    assert (df["choices"].list.len() == 4).all()
    # The answer is the choice its index points at.
    assert all(ch[i] == a for ch, i, a in zip(df["choices"], df["answer_index"], df["answer"]))
    assert set(df["task_type"]) <= set(T.TASK_TYPES)
    # Every question is clean: no double space, no "of the following", ends with "?".
    q = df["question"]
    assert not q.str.contains("  ").any()
    assert not q.str.contains("(?i)of the following").any()
    assert q.str.ends_with("?").all()
    # Content hashes are the hash of the row.
    for row in df.head(50).iter_rows(named=True):
        assert row["content_sha256"] == T.content_sha256(row)


def test_clean_option_drops_only_an_unbalanced_closing_quote():
    assert T.clean_option('Osteosarcoma\n"') == "Osteosarcoma"
    assert T.clean_option('  Cyclothymic   disorder \n" ') == "Cyclothymic disorder"
    assert (
        T.clean_option('Postpartum "blues"; her symptoms are likely self-limited')
        == 'Postpartum "blues"; her symptoms are likely self-limited'
    )
    assert T.clean_option('The "kissing disease"') == 'The "kissing disease"'
    assert T.clean_option("Osteosarcoma") == "Osteosarcoma"


def test_stray_quotes_are_cleaned_and_counted(dataset_dir, source):
    """No published choice or answer keeps the CSV's stray closing quote; the report counts them."""
    df = load_config(dataset_dir, "all")
    choices = df["choices"].explode()
    assert not choices.str.contains(r'\s"$').any() and not df["answer"].str.contains(r'\s"$').any()
    assert (choices == choices.str.strip_chars()).all() and (df["answer"] == df["answer"].str.strip_chars()).all()
    assert df.filter(pl.col("answer").str.contains('"'))["answer"].to_list() == [
        'Postpartum "blues"; her symptoms are likely self-limited'
    ]
    # answer is still one of the choices, at answer_index, after cleaning.
    assert all(a in ch and ch[i] == a for ch, i, a in zip(df["choices"], df["answer_index"], df["answer"]))
    row = df.filter(pl.col("case_id") == "case_208").row(0, named=True)
    assert row["answer"] == "Osteosarcoma" and row["choices"][row["answer_index"]] == "Osteosarcoma"
    # The counts against the raw CSV: 23 answers and 77 choices (one per case) carried the quote.
    raw = pl.read_csv(io.BytesIO(source.read(CASES_CSV)), infer_schema=False)
    cols = ["choice_1", "choice_2", "choice_3", "choice_4"]
    stray = lambda c: pl.col(c).str.replace_all(r"\s+", " ").str.strip_chars().str.ends_with(' "')  # noqa: E731
    n_answers = raw.filter(stray("answer")).height
    n_choices = sum(raw.filter(stray(c)).height for c in cols)
    assert (n_answers, n_choices) == (23, 77)
    report = (dataset_dir / REPORT).read_text()
    assert f"**{n_answers} answers** and **{n_choices} choices (77 cases)**" in report
    manifest = json.loads((dataset_dir / MANIFEST).read_text())
    assert manifest["stray_quotes_removed"] == {"answers": 23, "choices": 77}
    diag = load_config(dataset_dir, "diagnoses")
    assert (
        not diag["diagnosis"].str.ends_with('"').any() and diag.filter(pl.col("diagnosis") == "Osteosarcoma")["count"].item() >= 1
    )


def test_paper_answer_is_upstreams_recorded_key_verbatim(dataset_dir, source):
    """paper_answer is results/gpt4_1106's correct_ans byte for byte (ingest checks the other four models)."""
    df = load_config(dataset_dir, "all")
    recorded = {}
    for f in source.iter_files(["results/gpt4_1106/*.json"]):
        d = json.loads(f.data)
        recorded[d["case_id"]] = d["correct_ans"]
    key = dict(df.select("case_id", "paper_answer").iter_rows())
    assert key == recorded
    assert key["case_208"] == 'osteosarcoma\n"'
    differ = df.filter(pl.col("paper_answer") != pl.col("answer").str.to_lowercase())
    assert differ.height == 35  # trailing spaces/line breaks, stray quotes, case_112's synonym
    assert "case_112" in differ["case_id"].to_list()
    assert "the key the paper's MCQ rule used, kept verbatim for reproduction" in (dataset_dir / "README.md").read_text()


def test_specialties_are_the_papers_twelve(dataset_dir):
    df = load_config(dataset_dir, "all")
    assert set(df["specialty"]) == set(T.SPECIALTIES)
    assert len(T.SPECIALTIES) == 12
    assert df.filter(pl.col("source") != "medqa_usmle")["specialty"].unique().to_list() == ["Dermatology"]
    assert T.map_specialty("Cardiovascular System") == "Cardiology"
    assert T.map_specialty("Gastrointestinal System") == "Gastroenterology"
    assert T.map_specialty("Infectious Diseases") == "Infectious Disease"
    assert T.map_specialty("Renal and Genitourinary System") == "Urology and Nephrology"
    assert T.map_specialty("Neurology") == "Neurology"
    with pytest.raises(CraftMDError, match="unknown specialty"):
        T.map_specialty("Cardiovascular")


def test_single_dx_from_the_dermatologists_qc(dataset_dir):
    df = load_config(dataset_dir, "all")
    derm = df.filter(pl.col("source") != "medqa_usmle")
    assert derm["single_dx"].null_count() == 0
    assert df.filter(pl.col("source") == "medqa_usmle")["single_dx"].null_count() == 1804
    # case_vignette_qc.csv: 22 vignettes with neither an only possible nor a single most likely answer.
    assert derm["single_dx"].sum() == 178
    by_id = dict(zip(df["case_id"], df["single_dx"]))
    assert by_id["case_0"] is True  # public_case01: only possible answer
    assert by_id["case_1"] is False  # public_case02: No, No
    assert by_id["case_106"] is False  # private_case07: No, No
    assert by_id["case_105"] is True  # private_case06: No, Yes
    assert T.single_dx_label("No", "Yes") is True
    assert T.single_dx_label("Yes", "") is True
    assert T.single_dx_label("No", "No") is False
    assert T.single_dx_label("", "") is None
    assert T.qc_case_id("public_case01") == "case_0"
    assert T.qc_case_id("private_case100") == "case_199"


# --------------------------------------------------------------------------- the question split


def test_vignette_agrees_with_upstream_split(dataset_dir, source):
    """Checked here independently of the builder's own report: our vignette against
    the results files' case_vignette, whitespace normalised."""
    df = load_config(dataset_dir, "all")
    ours = dict(zip(df["case_id"], df["vignette"]))
    agree = total = 0
    differing = []
    for f in source.iter_files(["results/gpt4_1106/*"]):
        ref = json.loads(f.data)
        total += 1
        if T.normalize_ws(ours[ref["case_id"]]) == T.normalize_ws(ref["case_vignette"]):
            agree += 1
        else:
            differing.append(ref["case_id"])
    assert total == 2004
    assert agree / total >= 0.995
    report = (dataset_dir / REPORT).read_text()
    for cid in differing:
        assert f"| {cid} |" in report
    manifest = json.loads((dataset_dir / MANIFEST).read_text())
    assert manifest["question_split_agreement"] == pytest.approx(agree / total, abs=1e-6)


def test_split_question_known_forms():
    v, q = T.split_question(
        "A 40-year-old man has pain. His pulse is 90/min. Which of the following is the most likely diagnosis? "
    )
    assert v == "A 40-year-old man has pain. His pulse is 90/min."
    assert q == "Which of the following is the most likely diagnosis?"
    assert T.upstream_question(q) == "Which  is the most likely diagnosis?"
    assert T.clean_question(q) == "Which is the most likely diagnosis?"
    # A stray closing quote left by the source is dropped; a quoted remark inside the text is not the question.
    text = 'She asks, “How is it possible?” She is afebrile. Which of the following is the most likely diagnosis?"'
    v, q = T.split_question(text)
    assert v.endswith("She is afebrile.") and T.clean_question(q) == "Which is the most likely diagnosis?"
    # Lab tables end sentences at line breaks; abbreviations do not end sentences.
    v, q = T.split_question("Labs:\nHemoglobin 8 g/dL\nWhich of the following tests by Dr. Smith would confirm the diagnosis?")
    assert q == "Which of the following tests by Dr. Smith would confirm the diagnosis?"
    # No question: the whole text is the vignette and the default question is asked (the derm cases).
    v, q = T.split_question("A 22-year-old man presented with painful lesions. ")
    assert (v, q) == ("A 22-year-old man presented with painful lesions.", None)
    assert T.clean_question(q) == T.DEFAULT_QUESTION
    # A premise stating a measured value stays with the vignette.
    v, q = T.split_question(
        "Pre-test probability is 40%. If the likelihood ratio is 0.04, what is the chance that this is the right diagnosis?"
    )
    assert v.endswith("0.04,") and T.clean_question(q) == "What is the chance that this is the right diagnosis?"
    # Stems closed by ":" stay in the vignette (as upstream) unless the MedQA rule asks for them.
    assert T.split_question("A man has a cough. The most likely diagnosis is:")[1] is None
    assert (
        T.split_question("A man has a cough. The most likely diagnosis is:", colon_stems=True)[1]
        == "The most likely diagnosis is:"
    )


@pytest.mark.parametrize(
    "question, expected",
    [
        ("Which is the most likely diagnosis?", "diagnosis"),
        ("What is the final diagnosis?", "diagnosis"),
        ("Which is the most likely underlying diagnosis in this patient?", "diagnosis"),
        ("Which is the most appropriate next step in diagnosis?", "next_step"),
        ("Which is most likely to confirm the diagnosis?", "confirm_test"),
        ("Which tests would confirm this patient's diagnosis?", "confirm_test"),
        ("What is the most likely etiology of this patient’s diagnosis?", "cause"),
        ("Which is the most likely causal organism?", "organism"),
        ("Which is associated with the most likely diagnosis?", "associated_finding"),
        ("Which is a risk factor for the patient’s most likely diagnosis?", "risk_factor"),
        ("Which is the best treatment for the most likely diagnosis?", "treatment"),
        ("Which is the pathophysiology of the most likely diagnosis?", "mechanism"),
        ("What is the chance that this is the right diagnosis?", "statistics"),
    ],
)
def test_task_type(question, expected):
    assert T.task_type(question) == expected


@pytest.mark.parametrize(
    ("question", "answer", "expected"),
    [
        ("What is the final diagnosis?", "Lymphogranuloma venereum", True),
        ("Which is the most likely underlying diagnosis?", "Neurofibromatosis type 1", True),
        ("What is the chance that this is the correct diagnosis?", "2.5%", False),  # statistics
        ("Which is the most appropriate next step in diagnosis?", "Lumbar puncture", False),
        ("Which is the most appropriate pharmacotherapy?", "Hydrochlorothiazide 25 mg", False),
        ("Which best describes the most likely diagnosis?", "Linear IgG along the basement membrane", False),
        ("Which is true regarding this patient's most likely diagnosis?", "CA 19-9 is a marker for this condition.", False),
        ("Which images on ophthalmoscopy corresponds with this patient's most likely diagnosis?", "Figure E", False),
        ("What is the most likely diagnosis?", "90/100", False),  # no letter: never a diagnosis
    ],
)
def test_names_a_diagnosis(question, answer, expected):
    assert T.names_a_diagnosis(question, answer) is expected


def test_many_choice_options_are_diagnoses(dataset_dir):
    """The ``diagnoses`` config (the mcq_many options) holds the distinct answers of the cases whose question asks for
    the diagnosis itself, nothing else: 1,136 options from 1,558 cases of the pinned source."""
    diag = load_config(dataset_dir, "diagnoses")
    rows = load_config(dataset_dir, "all")
    named = rows.filter(
        pl.struct("question", "answer").map_elements(
            lambda r: T.names_a_diagnosis(r["question"], r["answer"]), return_dtype=pl.Boolean
        )
    )
    assert (diag.height, int(diag["count"].sum()), named.height) == (1136, 1558, 1558)
    options = {d.casefold() for d in diag["diagnosis"]}
    assert options == {T.normalize_ws(a).casefold() for a in named["answer"]}
    assert set(named["task_type"]) == {"diagnosis"}
    for not_a_diagnosis in ("0.25", "2.5%", "70%", "90/100", "hydrochlorothiazide", "figure e"):
        assert not_a_diagnosis not in options
    assert not any(re.fullmatch(r"[\d\s.,%/:-]+", d) for d in options)
    assert {"lymphogranuloma venereum", "neurofibromatosis type 1", "osteosarcoma"} <= options
    assert "1,136 distinct diagnoses" in (dataset_dir / "README.md").read_text()


def test_medqa_dermatology_cases_are_the_skin_panels_case_set(dataset_dir):
    """Nature Medicine's Fig. 3 MedQA panel holds MedQA's dermatology cases only: the page's note gives their count."""
    df = load_config(dataset_dir, "all")
    skin = df.filter(pl.col("specialty") == "Dermatology")
    assert dict(skin.group_by("source").len().iter_rows()) == {"medqa_usmle": 117, "derm_public": 100, "derm_private": 100}
    note = (Path(T.__file__).resolve().parents[1] / "cards" / "leaderboard_paper.html.j2").read_text()
    assert "117 of the 1,804 in the pinned source" in note


def test_task_types_in_the_dataset(dataset_dir):
    df = load_config(dataset_dir, "all")
    counts = dict(df["task_type"].value_counts().rows())
    assert counts["diagnosis"] > 1500  # most cases ask for the diagnosis itself
    assert df.filter(pl.col("source") != "medqa_usmle")["task_type"].unique().to_list() == ["diagnosis"]
    assert {"next_step", "confirm_test", "treatment"} <= set(counts)


# --------------------------------------------------------------------------- history versus examination


def test_history_exam_split_known_cases(dataset_dir):
    df = load_config(dataset_dir, "all")
    rows = {r["case_id"]: r for r in df.filter(pl.col("case_id").is_in(["case_0", "case_1", "case_2965"])).iter_rows(named=True)}
    r = rows["case_0"]
    assert r["history"].startswith("A 22-year-old man presented with complaints of painful lesions")
    assert "He denied fever" in r["history"] and "chlamydia" in r["history"]
    assert r["physical_exam"] == (
        "Multiple small, nontender scabbed lesions are identified in the bilateral scrotal area and on the shaft "
        "of penis. The right inguinal lymph node was tender and swollen."
    )
    r = rows["case_1"]
    assert r["physical_exam"].startswith("On examination, well-demarcated, scaly plaques")
    assert "He is otherwise healthy." in r["history"]
    r = rows["case_2965"]
    assert "smoked 10–15 cigarettes" in r["history"]
    assert "The pain gets worse on lying down" in r["history"]
    for part in ("blood pressure is 120/50 mm Hg", "scratching sound", "ECG is shown", "Serum troponin"):
        assert part in r["physical_exam"]
        assert part not in r["history"]


def test_history_exam_split_keeps_every_sentence(dataset_dir):
    df = load_config(dataset_dir, "all")
    with_exam = 0
    for r in df.iter_rows(named=True):
        parts = T.sentences(r["vignette"])
        h, e = T.sentences(r["history"]), T.sentences(r["physical_exam"])
        assert sorted(h + e) == sorted(parts), r["case_id"]
        if parts:  # (one MedQA item is a question only, with no vignette)
            assert h and h[0] == parts[0]  # who presents, with what, is history
        with_exam += bool(e)
    assert with_exam > 0.9 * df.height


def test_history_exam_split_rules():
    h, e = T.split_history_exam(
        "A 30-year-old woman comes to the physician because of a cough for 2 weeks. She reports night sweats. "
        "She has smoked for 10 years. Her temperature is 38.2°C (100.8°F). Examination shows crackles over the "
        "right apex. A chest x-ray shows a cavitary lesion. Sputum culture is pending."
    )
    assert h == (
        "A 30-year-old woman comes to the physician because of a cough for 2 weeks. She reports night sweats. "
        "She has smoked for 10 years."
    )
    assert e.startswith("Her temperature is 38.2°C") and e.endswith("Sputum culture is pending.")
    assert T.split_history_exam("A 5-year-old boy has had a rash for 3 days. He denies itching.")[1] == ""


# --------------------------------------------------------------------------- NEJM images and the HF round trip


def test_nejm_images_open_with_pil(dataset_dir):
    from PIL import Image

    df = load_config(dataset_dir, "nejm_image")
    assert df.columns == ["case_id", "image", "vignette", "question", "answer", "choices", "specialty", "source"]
    assert (df["source"] == "nejm_image").all()
    assert (df["choices"].list.len() == 0).all()
    assert df["specialty"].null_count() == df.height
    for r in df.iter_rows(named=True):
        with Image.open(io.BytesIO(r["image"]["bytes"])) as im:
            im.load()
            assert im.width > 100 and im.height > 100
        assert len(r["vignette"]) > 50 and r["answer"] and r["question"].endswith("?")


def test_load_dataset_round_trip(dataset_dir, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants
    from PIL import Image

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    cache = str(tmp_path / "hf-cache")

    ds = datasets.load_dataset(str(dataset_dir), "medqa_usmle", split="test", cache_dir=cache)
    assert ds.num_rows == 1804
    assert set(ds.column_names) == {
        "case_id", "source", "specialty", "vignette", "question", "choices", "answer", "answer_index",
        "paper_answer", "task_type", "history", "physical_exam", "single_dx", "content_sha256",
    }  # fmt: skip
    assert ds.features["choices"] == datasets.List(datasets.Value("string"))
    assert ds.features["single_dx"] == datasets.Value("bool")
    row = ds[0]
    assert row["choices"][row["answer_index"]] == row["answer"] and row["source"] == "medqa_usmle"

    img = datasets.load_dataset(str(dataset_dir), "nejm_image", split="test", cache_dir=cache)
    assert isinstance(img.features["image"], datasets.Image)
    first = img[0]["image"]
    assert isinstance(first, Image.Image) and first.size[0] > 100
    assert img[0]["choices"] == []

    diag = datasets.load_dataset(str(dataset_dir), "diagnoses", split="test", cache_dir=cache)
    assert sum(diag["count"]) == 1558


def test_card_and_manifest(dataset_dir):
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(dataset_dir / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "other"  # each config has its sources' own terms (tests/test_publish_licences.py)
    assert [c["config_name"] for c in data["configs"]] == list(CONFIGS) + [
        "consult_train",
        "craftmd_train",
    ]  # the training sets: split train
    for c in data["configs"]:
        split = "train" if c["config_name"] in ("consult_train", "craftmd_train") else "test"
        assert c["data_files"] == [{"split": split, "path": f"{c['config_name']}/{split}-00000-of-00001.parquet"}]
    infos = {i["config_name"]: i for i in data["dataset_info"]}
    assert infos["medqa_usmle"]["splits"][0]["num_examples"] == 1804
    assert {"name": "image", "dtype": "image"} in infos["nejm_image"]["features"]
    text = card.text
    assert "10.1038/s41591-024-03328-5" in text
    assert "choices` is empty" in text
    manifest = json.loads((dataset_dir / MANIFEST).read_text())
    assert manifest["source"]["commit"] in text and manifest["source"]["content_sha256"] in text
    assert manifest["version"] in text
    for rel, info in manifest["files"].items():
        assert hashlib.sha256((dataset_dir / rel).read_bytes()).hexdigest() == info["sha256"]


# --------------------------------------------------------------------------- determinism and overwrite


def test_same_source_same_bytes(source, dataset_dir, tmp_path):
    again = tmp_path / "again"
    build_dataset(source, again, progress=False)
    assert file_hashes(again) == file_hashes(dataset_dir)


def test_existing_out_is_refused_then_replaced_with_overwrite(source, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CraftMDError, match="exists"):
        build_dataset(source, out, progress=False)
    with pytest.raises(CraftMDError, match="not a built dataset"):
        build_dataset(source, out, overwrite=True, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    report = build_dataset(source, out, overwrite=True, version="9.8.7", progress=False)
    assert report.rows["all"] == 2004
    assert json.loads((out / MANIFEST).read_text())["version"] == "9.8.7"
    assert leftovers(tmp_path, "data") == []
    # a built dataset, its training configs included, is replaced by the next build (the main job rebuilds it so)
    assert (out / "consult_train").is_dir() and (out / "craftmd_train").is_dir()
    build_dataset(source, out, overwrite=True, version="9.8.8", progress=False)
    assert json.loads((out / MANIFEST).read_text())["version"] == "9.8.8"
    assert leftovers(tmp_path, "data") == []


# --------------------------------------------------------------------------- refused inputs: nothing at --out


def test_truncated_archive_is_refused(source, tmp_path):
    bad = tmp_path / "truncated.tar.gz"
    with open(source.path, "rb") as f:
        bad.write_bytes(f.read(3 << 20))
    out = tmp_path / "data"
    with pytest.raises(CraftMDError, match="truncated.tar.gz") as exc:
        build_dataset(Source(bad), out, progress=False)
    assert "\n" not in str(exc.value)
    assert not out.exists() and leftovers(tmp_path, "data") == []


def test_one_changed_byte_is_refused(source, tmp_path):
    data = bytearray(source.read(CASES_CSV))
    data[1000] ^= 0x01
    folder = tmp_path / "src"
    (folder / "data").mkdir(parents=True)
    (folder / CASES_CSV).write_bytes(bytes(data))
    out = tmp_path / "data"
    with pytest.raises(CraftMDError, match=re.escape(CASES_CSV) + ".*does not match the pinned sha256"):
        build_dataset(Source(folder), out, progress=False)
    assert not out.exists() and leftovers(tmp_path, "data") == []


def test_missing_file_is_refused(source, tmp_path):
    folder = tmp_path / "src"
    (folder / "data").mkdir(parents=True)
    (folder / CASES_CSV).write_bytes(source.read(CASES_CSV))
    out = tmp_path / "data"
    with pytest.raises(CraftMDError, match="missing file results/"):
        build_dataset(Source(folder), out, progress=False)
    assert not out.exists() and leftovers(tmp_path, "data") == []


def test_missing_source_is_refused(tmp_path):
    with pytest.raises(CraftMDError, match="source not found"):
        Source(tmp_path / "nowhere.tar.gz")


def test_bad_version_is_refused(source, tmp_path):
    with pytest.raises(CraftMDError, match="not X.Y.Z"):
        build_dataset(source, tmp_path / "data", version="latest", progress=False)
    assert not (tmp_path / "data").exists()
