"""Golden consultations for training a doctor: the ``consult_train`` config (split ``train``).

After the consultation-evaluation framework's training set (its §4.2, "Vicuna Finetuned"): per training case, a
dialogue in which the doctor asks one key question a turn and the patient answers, ending in the doctor's analysis
and the correct answer, as chat ``messages`` (TRL's conversational format; the system message is the consultation
task's doctor prompt). Candidates come from MediQ's MedQA lines and a user's MedQA-format file (:func:`mediq_candidates`,
:func:`medqa_candidates`); only diagnosis vignettes that are no benchmark case are kept (:func:`decontaminate`); the
dialogue is scripted (:func:`script`) or model-written (:mod:`craftmd.generation.golden`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from craftmd import CraftMDError
from craftmd.dataset_builder import medqa as M
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder.mediq import context_text, parse_lines, strip_number
from craftmd.release import natural_key
from craftmd.text import LEVENSHTEIN_THRESHOLD, NGRAM, NGRAM_THRESHOLD, NgramIndex, normalise, same_case  # noqa: F401 (normalise: G.normalise)

CONFIG = "consult_train"
SPLIT = "train"
MEDIQ_FILE = "data/all_dev_good.jsonl"
WRITER_SCRIPT = "script"
LICENCES = {"mediq": "CC BY 4.0", "medqa-train": "MIT"}
DECONTAMINATION_DOC = (
    f"each candidate's vignette against every benchmark case's (both lower-cased, punctuation dropped, whitespace made "
    f"one space): the cases sharing a word {NGRAM}-gram with it are scored by MELD's normalised Levenshtein similarity "
    f"(1 - distance / longer length) and by the share of the candidate's distinct {NGRAM}-grams the case has; a "
    f"candidate is dropped when its best case reaches similarity {LEVENSHTEIN_THRESHOLD} or share {NGRAM_THRESHOLD}"
)

#: Ordered (key, pattern) rules: a fact's key is that of the first pattern it matches (case-insensitive).
KEY_RULES: tuple[tuple[str, str], ...] = (
    (
        "Vital signs",
        r"\b(temperature|pulse|heart rate|blood pressure|respirations|respiratory rate|oxygen saturation|"
        r"afebrile|vital signs|body mass index|bmi)\b",
    ),
    (
        "Laboratory results",
        r"\b(laboratory|labs?|serum|plasma|hemoglobin|hematocrit|leukocyte\w*|platelet\w*|sodium|"
        r"potassium|glucose|creatinine|urea|urinalysis|urine|mg/dl|meq/l|mmol/l|g/dl|titers?|"
        r"antibod\w*|cultures?|gram stain|biopsy|smear|pcr|serolog\w*|concentration)\b",
    ),
    (
        "Imaging and other tests",
        r"\b(x-rays?|radiograph\w*|ct|mri|ultrasound\w*|ultrasonograph\w*|echocardiograph\w*|ecg|"
        r"ekg|electrocardiogra\w*|scan|imaging|endoscop\w*|colonoscop\w*|angiograph\w*|"
        r"spirometry)\b",
    ),
    (
        "Physical examination",
        r"\b(examination|exam|auscultation|palpat\w*|inspection|appears|tender\w*|murmurs?|"
        r"reflex\w*|pupils?)\b",
    ),
    (
        "Family history",
        r"\bfamily history\b|\b(mother|father|sister|brother|siblings?|grandmother|grandfather|aunt|"
        r"uncle)\b[^.]*\b(has|had|have|died|diagnosed|history)\b",
    ),
    ("Medications", r"\b(medications?|takes|taking|treated with|prescribed|drugs?)\b"),
    (
        "Social history",
        r"\b(smok\w*|cigarettes?|alcohol|drinks|illicit|cocaine|heroin|sexually|occupation|works|"
        r"worked|lives|travel\w*)\b",
    ),
    (
        "Pregnancy and menstrual history",
        r"\b(pregnan\w*|gestation\w*|gravida|menstrua\w*|menarche|menopaus\w*|"
        r"contracepti\w*)\b",
    ),
    ("Immunizations", r"\b(immuniz\w*|vaccin\w*)\b"),
    ("Past medical history", r"\b(history of|diagnosed|previous\w*|prior|surgery|underwent|hospitali\w*)\b"),
)
OTHER_KEY = "Symptoms and history"
_RULES = tuple((k, re.compile(p, re.IGNORECASE)) for k, p in KEY_RULES)
#: The scripted doctor's question for each key.
QUESTIONS = {
    "Vital signs": "What were your vital signs when you were checked: temperature, pulse, blood pressure?",
    "Laboratory results": "What did your laboratory tests show?",
    "Imaging and other tests": "Have you had any scans or other tests, and what did they show?",
    "Physical examination": "What was found when you were examined?",
    "Family history": "Does anything run in your family?",
    "Medications": "What medications are you taking?",
    "Social history": "Can you tell me about your lifestyle: smoking, alcohol, work, where you live?",
    "Pregnancy and menstrual history": "Can you tell me about your periods and any pregnancies?",
    "Immunizations": "Are your vaccinations up to date?",
    "Past medical history": "Have you had any medical problems or operations before?",
    OTHER_KEY: "Can you tell me more about your symptoms and how they started?",
}
OPENING = "Hello doctor. {first_fact} Can you help me?"
CLOSING = "Thank you. Putting together what you told me: {findings}\n**Final Diagnosis:** {answer}"


@dataclass(frozen=True)
class Candidate:
    """A training case before its dialogue: where it comes from, its text, facts, question and answer."""

    case: str  # "mediq:<id>" or "medqa-train:<line>"
    source: str  # mediq | medqa-train
    vignette: str
    facts: tuple[str, ...]
    question: str
    options: tuple[str, ...]
    answer: str


@dataclass
class Prepared:
    """Candidates after the diagnosis rule and the decontamination, and what was left out."""

    kept: list[Candidate]
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> verdict reason -> candidates
    dropped: list[dict] = field(default_factory=list)  # case, source, benchmark_case, similarity, ngram_share
    no_facts: list[str] = field(default_factory=list)  # candidates with fewer than two facts: nothing to ask after the request


# -- candidates -----------------------------------------------------------------------------------


def mediq_candidates(data: bytes) -> list[Candidate]:
    """MediQ's MedQA lines (``all_dev_good.jsonl``, CC BY 4.0, Li et al. 2024), in file order; a malformed line is one
    error naming it. The vignette is the joined ``context``, the facts are MediQ's atomic facts (numbering stripped)."""

    def candidate(rec: dict) -> Candidate:
        options = rec["options"]
        letters = sorted(options)
        return Candidate(f"mediq:{int(rec['id'])}", "mediq", T.normalize_ws(context_text(rec)), tuple(strip_number(f) for f in rec["facts"]),
                         T.normalize_ws(rec["question"]), tuple(T.clean_option(options[k]) for k in letters),
                         T.clean_option(options[rec["answer_idx"]]))  # fmt: skip

    return parse_lines(MEDIQ_FILE, data, candidate)


def medqa_candidates(items: list[M.MedQAItem]) -> list[Candidate]:
    """The lines of a MedQA-format file (:func:`craftmd.dataset_builder.medqa.read_jsonl`; MedQA's own training split,
    ``craftmd build --medqa-train FILE``), in file order. The vignette is the question text without its question
    sentence; the facts are the line's ``facts`` when it has them (a non-empty list of strings), else the vignette's
    sentences. Of the candidates, only diagnosis vignettes are kept, by the benchmark's own MedQA rule
    (:func:`craftmd.dataset_builder.medqa.select`); the others are counted by reason in the build report."""
    out = []
    for it in items:
        vignette, raw_q = T.split_question(it.question, colon_stems=True)
        facts = it.facts if it.facts is not None else tuple(T.sentences(vignette))
        letters = sorted(it.options)
        out.append(Candidate(f"medqa-train:{it.line}", "medqa-train", T.normalize_ws(vignette), facts, T.clean_question(raw_q),
                             tuple(T.clean_option(it.options[k]) for k in letters), T.clean_option(it.options[it.answer_idx])))  # fmt: skip
    return out


# -- decontamination ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _index(benchmark: tuple[tuple[str, str], ...]) -> NgramIndex:
    """The benchmark's n-gram index, made once per benchmark (a build screens two training configs against the same cases)."""
    return NgramIndex(dict(benchmark))


def nearest(candidates: list[Candidate], benchmark: dict[str, str]) -> list[tuple[str | None, float, float]]:
    """For each candidate, (the benchmark case most like it, similarity, n-gram share); (None, 0, 0) when no case
    shares an n-gram with it (:meth:`craftmd.text.NgramIndex.nearest`)."""
    index = _index(tuple(benchmark.items()))
    return [index.nearest(c.vignette) for c in candidates]


def contaminated(sim: float, share: float) -> bool:
    return same_case(sim, share)


def prepare(candidates: list[Candidate], benchmark: dict[str, str]) -> Prepared:
    """Keep the candidates with two facts or more (the first is the request, a question needs another) that are no
    benchmark case (:func:`decontaminate`, every one of them listed) and are diagnosis vignettes; list or count the rest."""
    p = Prepared([])
    with_facts = []
    for c in candidates:
        enough = sum(bool(f.strip()) for f in c.facts) >= 2
        (with_facts if enough else p.no_facts).append(c if enough else c.case)
    clean, p.dropped = decontaminate(with_facts, benchmark)
    for c in clean:
        v = M.select(f"{c.vignette} {c.question}")
        by = p.reasons.setdefault(c.source, {})
        by[v.reason] = by.get(v.reason, 0) + 1
        if v.keep:
            p.kept.append(c)
    p.reasons = {s: dict(sorted(r.items())) for s, r in sorted(p.reasons.items())}
    return p


def decontaminate(candidates: list[Candidate], benchmark: dict[str, str]) -> tuple[list[Candidate], list[dict]]:
    """(the candidates no benchmark case is like, the dropped ones with their nearest case and scores).

    Every candidate's vignette is compared with every case of the benchmark's configs (the built text cases and the
    image cases' texts), both normalised as :func:`craftmd.text.normalise` does. A word 8-gram index
    picks, for each candidate, the cases that share at least one 8-gram with it; for those the similarity is MELD's
    normalised Levenshtein (:func:`craftmd.text.similarity`) and the n-gram share is the share of the candidate's
    distinct 8-grams the case also has. A candidate whose best case reaches :data:`LEVENSHTEIN_THRESHOLD` or
    :data:`NGRAM_THRESHOLD` is dropped and listed (with the case and both scores) in the build report. The
    thresholds, from MediQ's 1,272 MedQA lines against CRAFT-MD's cases: the lines that are CRAFT-MD cases (the
    ``facts`` config's 150-character match) share more than half of their 8-grams with their case (nearly all of
    them every 8-gram), the others less than 0.15, except five that retell a benchmark case's scenario in other words
    for another question (0.22–0.35): the 0.2 cut drops those too. The similarity of unrelated vignettes stays below
    0.65, so 0.75 catches a lightly reworded copy that shares few 8-grams."""
    kept, dropped = [], []
    for c, (cid, sim, share) in zip(candidates, nearest(candidates, benchmark)):
        if cid is not None and contaminated(sim, share):
            dropped.append({"case": c.case, "source": c.source, "benchmark_case": cid, "similarity": round(sim, 4),
                            "ngram_share": round(share, 4)})  # fmt: skip
        else:
            kept.append(c)
    return kept, dropped


def benchmark_texts(dataset_dir: Path | str, need: str | None = None) -> dict[str, str]:
    """Every registered task's test cases held in a built dataset folder, as one benchmark by key
    (:func:`craftmd.overlap.benchmark`: a case's id, ``task/id`` where an earlier task gives another text under it; the
    CRAFT-MD tasks' image cases as ``nejm_image/<id>``): what a training split is checked against. ``need``: the task
    whose cases must be there (else any task's); one line when they are not."""
    from craftmd.overlap import benchmark, task_cases

    found = task_cases([dataset_dir])
    if (need is not None and need not in found.texts) or not found.texts:
        why = found.missing.get(need, "") if need else "no registered task's cases are in it"
        raise CraftMDError(
            f"{dataset_dir}: not a built dataset of {need or 'any task'} ({why}); run craftmd build --out {dataset_dir}"
        )
    return benchmark(found).texts


def check_disjoint(what: str, cases: dict[str, str], benchmark: dict[str, str]) -> None:
    """Refuse (one line) training cases (``{id: vignette}``) of which one is a benchmark case by id, or by text under
    :func:`decontaminate`'s rule and thresholds (the first named, with its case and both scores)."""
    clash = sorted(set(cases) & set(benchmark))
    if clash:
        raise CraftMDError(f"{what}: training id(s) {', '.join(clash[:5])} are benchmark ids")
    cands = [Candidate(cid, "training", text, (), "", (), "") for cid, text in cases.items()]
    _, dropped = decontaminate(cands, benchmark)
    if dropped:
        d = dropped[0]
        raise CraftMDError(
            f"{what}: {len(dropped)} training case(s) are benchmark cases by text, first {d['case']} ~ {d['benchmark_case']} "
            f"(similarity {d['similarity']:.4f}, 8-gram share {d['ngram_share']:.4f}; rule: {DECONTAMINATION_DOC})"
        )


def candidate(row: dict) -> Candidate:
    """A ``consult_train`` row's case as the candidate it was made from (its facts are not kept: ``()``)."""
    return Candidate(row["case"], row["source"], row["vignette"], (), row["question"], tuple(row["options"]), row["answer"])


# -- the scripted dialogue ------------------------------------------------------------------------


def key_of(fact: str) -> str:
    for key, pattern in _RULES:
        if pattern.search(fact):
            return key
    return OTHER_KEY


def key_values(facts: tuple[str, ...] | list[str]) -> tuple[str, list[dict]]:
    """(initial request, key-value items) from a case's facts, by :data:`KEY_RULES`; no facts is one error."""
    facts = [T.normalize_ws(f) for f in facts if f and f.strip()]
    if not facts:
        raise CraftMDError("a golden consultation needs at least one fact; the facts list is empty")
    grouped: dict[str, list[str]] = {}
    for f in facts[1:]:
        grouped.setdefault(key_of(f), []).append(f)
    return OPENING.format(first_fact=facts[0]), [{"key": k, "value": " ".join(v)} for k, v in grouped.items()]


def doctor_system_file() -> Path:
    """The doctor prompt the system message of every row is: the one the task whose training split this config is
    declares (:attr:`craftmd.tasks.Environment.train_prompt`: the consultation task's, prompt set ``consult-v1``)."""
    from craftmd.tasks import builtin_tasks

    found = {
        t.environment.train_prompt for t in builtin_tasks().values() if t.environment and t.environment.train_config == CONFIG
    }
    found.discard(None)
    if len(found) != 1:
        raise CraftMDError(f"{len(found)} tasks declare the doctor prompt of the {CONFIG} config; one must")
    return found.pop()


def doctor_system() -> str:
    return doctor_system_file().read_text(encoding="utf-8")


def closing(values: list[str], answer: str) -> str:
    return CLOSING.format(findings=" ".join(v if v.endswith((".", "!", "?")) else v + "." for v in values), answer=answer)


def messages(system: str, request: str, turns: list[tuple[str, str]], final: str) -> list[dict]:
    out = [{"role": "system", "content": system}, {"role": "user", "content": request}]
    for q, a in turns:
        out += [{"role": "assistant", "content": q}, {"role": "user", "content": a}]
    return out + [{"role": "assistant", "content": final}]


def script(c: Candidate, system: str) -> dict:
    """The scripted golden consultation of one candidate, as a row (:data:`schema.CONSULT_TRAIN_FEATURES`); no model.

    The first fact is the patient's initial request (MediQ's own convention: the first sentence is what the doctor is
    told first); the other facts are grouped under keys by the ordered keyword rules :data:`KEY_RULES` (the first rule
    whose pattern the fact matches names its key; ``Symptoms and history`` catches the rest), the keys in the order
    of their first fact, each key's value its facts joined by spaces. Each key is one turn: the doctor asks
    :data:`QUESTIONS` [key], the patient answers with the value. The doctor closes with :data:`CLOSING`: the analysis
    (the findings gathered, one per key) and ``**Final Diagnosis:** <answer>``, the line the consultation task stops
    on. The patient speaks as ``user``, the doctor as ``assistant``."""
    request, items = key_values(c.facts)
    turns = [(QUESTIONS[i["key"]], i["value"]) for i in items]
    return row(c, WRITER_SCRIPT, request, items, messages(system, request, turns, closing([i["value"] for i in items], c.answer)))


def row(c: Candidate, writer: str, request: str, items: list[dict], msgs: list[dict]) -> dict:
    return {
        "id": f"{c.case}:{writer}", "case": c.case, "source": c.source, "writer": writer, "licence": LICENCES[c.source],
        "messages": msgs, "items": items, "initial_request": request, "vignette": c.vignette, "question": c.question,
        "options": list(c.options), "answer": c.answer, "turns": sum(m["role"] == "assistant" for m in msgs) - 1,
    }  # fmt: skip


def build_rows(
    mediq_data: bytes, medqa_train: list[M.MedQAItem] | None, benchmark: dict[str, str], writer=None
) -> tuple[list[dict], dict]:
    """The config's rows and the build report's account of them.

    ``benchmark``: every benchmark case's text by id. ``writer``: None (the script only), or a callable
    ``(candidates, system) -> (rows, failed {case: why}, info)`` that writes model dialogues
    (:func:`craftmd.generation.golden.writer`)."""
    candidates = mediq_candidates(mediq_data)
    inputs = {MEDIQ_FILE: len(candidates)}
    if medqa_train is not None:
        candidates += medqa_candidates(medqa_train)
        inputs["--medqa-train"] = len(medqa_train)
    p = prepare(candidates, benchmark)
    system = doctor_system()
    rows = [script(c, system) for c in p.kept]
    report = {"inputs": inputs, "reasons": p.reasons, "no_facts": p.no_facts, "dropped": p.dropped,
              "decontamination": DECONTAMINATION_DOC, "writer": None}  # fmt: skip
    if writer is not None:
        written, failed, info = writer(p.kept, system)
        rows += written
        report["writer"] = {**info, "written": len(written), "failed": failed}
    rows = order(rows)
    by: dict[str, int] = {}
    for r in rows:
        by[r["writer"]] = by.get(r["writer"], 0) + 1
    report.update(rows=len(rows), by_writer=by)
    return rows, report


def order(rows: list[dict]) -> list[dict]:
    """Rows by source (MediQ first), case in natural order, then the script before model writers (by name)."""
    src = {"mediq": 0, "medqa-train": 1}
    return sorted(rows, key=lambda r: (src[r["source"]], natural_key(r["case"]), r["writer"] != WRITER_SCRIPT, r["writer"]))


__all__ = [
    "CONFIG",
    "SPLIT",
    "Candidate",
    "Prepared",
    "mediq_candidates",
    "medqa_candidates",
    "prepare",
    "decontaminate",
    "benchmark_texts",
    "check_disjoint",
    "candidate",
    "nearest",
    "key_values",
    "script",
    "row",
    "order",
    "messages",
    "closing",
    "doctor_system",
    "KEY_RULES",
    "QUESTIONS",
    "LEVENSHTEIN_THRESHOLD",
    "NGRAM_THRESHOLD",
    "DECONTAMINATION_DOC",
]
