"""Pure transformations of one upstream case, one function per step.

Nothing here reads files: every function maps text (or a small record) to text or
a label, deterministically. The builder composes them; the tests exercise them
one by one on known cases.
"""

from __future__ import annotations

import hashlib
import json
import re

from craftmd import CraftMDError

# ---------------------------------------------------------------------------
# Specialties
# ---------------------------------------------------------------------------

#: The paper's twelve specialty names.
SPECIALTIES = (
    "Dermatology",
    "Hematology and Oncology",
    "Neurology",
    "Gastroenterology",
    "Pediatrics and Neonatology",
    "Cardiology",
    "Infectious Disease",
    "Obstetrics and Gynecology",
    "Urology and Nephrology",
    "Endocrinology",
    "Rheumatology",
    "Other",
)
#: The four names the upstream CSV spells differently from the paper.
SPECIALTY_ALIASES = {
    "Cardiovascular System": "Cardiology",
    "Gastrointestinal System": "Gastroenterology",
    "Infectious Diseases": "Infectious Disease",
    "Renal and Genitourinary System": "Urology and Nephrology",
}


def map_specialty(category: str) -> str:
    """The upstream ``category`` as one of the paper's twelve specialty names."""
    name = SPECIALTY_ALIASES.get(category.strip(), category.strip())
    if name not in SPECIALTIES:
        raise CraftMDError(f"unknown specialty {category!r}; expected one of {', '.join(SPECIALTIES)}")
    return name


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------

#: Upstream ``dataset`` column -> our ``source`` value.
SOURCES = {"MedQA_USMLE": "medqa_usmle", "dermatology_public": "derm_public", "dermatology_private": "derm_private"}


def map_source(dataset: str) -> str:
    try:
        return SOURCES[dataset.strip()]
    except KeyError:
        raise CraftMDError(f"unknown dataset {dataset!r}; expected one of {', '.join(SOURCES)}") from None


# ---------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------

# A sentence ends at . ? ! (optionally closed by a quote or bracket) followed by
# whitespace and a capital, digit or opening quote; a line break always ends one.
_END = re.compile(r"[.?!]([\"”’')\]]*)[ \t]+(?=[A-Z0-9\"“(])|\n+")
# Words whose trailing period does not end a sentence.
_ABBREV = re.compile(r"\b(Dr|Mr|Ms|Mrs|vs|e\.g|i\.e|St|No|approx)\.$")


class _Boundary:
    """Sentence boundaries of a text (matches of :data:`_END` not after an abbreviation)."""

    def finditer(self, text: str):
        for m in _END.finditer(text):
            if text[m.start()] == "." and _ABBREV.search(text, max(0, m.start() - 7), m.start() + 1):
                continue
            yield m


_BOUNDARY = _Boundary()


def _segments(text: str) -> list[tuple[str, str]]:
    """``(sentence, separator before it)``; the separator is "\n" after a line break, else " "."""
    out, start, sep = [], 0, ""
    for m in _BOUNDARY.finditer(text):
        end = m.start() + (1 + len(m.group(1)) if m.group(1) is not None else 0)
        piece = text[start:end].strip()
        if piece:
            out.append((piece, sep))
        sep = "\n" if "\n" in m.group(0) else " "
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append((tail, sep))
    return out


def sentences(text: str) -> list[str]:
    """Split text into sentences (stripped, non-empty), keeping their punctuation."""
    return [s for s, _ in _segments(text)]


def _join(parts: list[tuple[str, str]]) -> str:
    """Join segments; a line break where the source had one or the previous piece has no end mark."""
    out = ""
    for i, (s, sep) in enumerate(parts):
        if i:
            out += "\n" if sep == "\n" or not re.search(r"[.?!:]['\"”’)\]]*$", out) else " "
        out += s
    return out


def normalize_ws(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


# ---------------------------------------------------------------------------
# The question sentence
# ---------------------------------------------------------------------------

#: The question upstream asks of cases whose vignette carries none (the derm cases).
DEFAULT_QUESTION = "What is the final diagnosis?"
# Upstream removed exactly these words; we remove them and the space they leave.
_OF_THE_FOLLOWING = re.compile(r"\s+of the following\b", re.IGNORECASE)


# A conditional premise that states a measured value ("... if the likelihood ratio
# ... is 0.04, what is the chance ...") is case data: it stays with the vignette.
_PREMISE = re.compile(r"^(?:If|According to)\b[^?]*?\d[^?]*?,\s+(?=(?:what|which)\b)")


def split_question(text: str, *, colon_stems: bool = False) -> tuple[str, str | None]:
    """``(vignette, raw question sentence)``: the last sentence when it is a question.

    The vignette is everything before the question sentence, right-stripped. When the
    text does not end with a question, the whole text is the vignette and the
    question is ``None``. Upstream split only sentences ending with "?" and left the
    few MedQA stems that end with ":" ("... would most likely include:") in the
    vignette; so do we, unless ``colon_stems`` (the MedQA filter judges those stems).
    """
    stripped = text.rstrip()
    end = r"[?:]" if colon_stems else r"\?"
    if not re.search(end + r"[\"”’']*$", stripped):
        return stripped, None
    start = 0
    for m in _BOUNDARY.finditer(stripped):
        if m.end() < len(stripped):
            start = m.end()
    question = stripped[start:].strip()
    # A premise clause with case data stays with the vignette (see _PREMISE).
    premise = _PREMISE.match(question)
    if premise:
        start += premise.end()
        question = stripped[start:].strip()
    vignette = stripped[:start].rstrip()
    return vignette, question


def clean_question(raw: str | None) -> str:
    """The question as we ask it: "of the following" removed, single spaces, no stray quote."""
    if raw is None:
        return DEFAULT_QUESTION
    q = _OF_THE_FOLLOWING.sub("", raw)
    q = re.sub(r"\bwhich the following\b", "which", q, flags=re.IGNORECASE)
    q = re.sub(r"^(Of|Given) the following( options)?,\s*", "", q, flags=re.IGNORECASE)
    q = normalize_ws(q)
    # A closing quote with no opening one in the sentence is a leftover of the source.
    if q.endswith(('?"', "?”")) and q.count('"') + q.count("“") + q.count("”") == 1:
        q = q[:-1]
    q = q.replace(" ?", "?")
    return q[:1].upper() + q[1:]


def upstream_question(raw: str | None) -> str:
    """The question exactly as upstream wrote it in its results files ("of the following" cut)."""
    if raw is None:
        return DEFAULT_QUESTION
    return raw.replace("of the following", "")


# ---------------------------------------------------------------------------
# Task type
# ---------------------------------------------------------------------------

#: Ordered rules: the first whose pattern matches the (clean, lower-case) question wins.
TASK_RULES: tuple[tuple[str, str], ...] = (
    ("statistics", r"\b(sensitivity|specificity|probability|chance|predictive value|replicated)\b"),
    ("treatment", r"\b(treatments?|therapy|pharmacotherapy|medications?|drugs?|management|manage)\b"),
    ("organism", r"\b(organisms?|pathogens?|infectious agents?|causal agent|causative agent)\b"),
    (
        "mechanism",
        r"\b(mechanisms?|pathophysiology|pathogenesis|pathway|germ cell layer|hepatic zone|hypersensitivity reaction|defense mechanism)\b",
    ),
    ("risk_factor", r"\b(risk factor|predisposing|at (an increased |increased )?risk|causative factor|risk for)\b"),
    ("cause", r"\b(cause[ds]?|etiology|responsible for|likely related to)\b"),
    (
        "confirm_test",
        r"\b(confirm\w*|establish\w*|tests?|testing|investigations?|markers?|assays?|stain|antibod(y|ies)|"
        r"measurement|laboratory|work ?up|yield|reveal|rule out|ruling out|excludes?|visualize|"
        r"recommended for diagnosis|required to|determin\w*|useful in)\b",
    ),
    ("next_step", r"\bnext (best |appropriate )?step\b|\bfirst tested\b|\b1st step\b|\bproper step\b"),
    (
        "associated_finding",
        r"\b(associated|characteristic|consistent|findings?|features?|present|seen|expected|support|suggest\w*|"
        r"indicate|complications?|screened|predict|shares?|same|mutation|transmission|history|clue|statement|"
        r"describes? the organism|located|locations|process|enzymes?|suspicion)\b",
    ),
    ("diagnosis", r"\bdiagnos[ie]s\b|\bdiagnose\b"),
)
TASK_TYPES = tuple(name for name, _ in TASK_RULES) + ("other",)
# Words that turn a "which diagnosis" sentence into a question about something else.
_NOT_PLAIN = re.compile(
    r"\b(next step|treat\w*|therap\w*|management|pathophysiology|same|related to|suspicion|different|"
    r"recommended|required|determining|useful|confirm\w*|tests?|drugs?|medications?)\b"
)
_TASK_RES = tuple((name, re.compile(p)) for name, p in TASK_RULES)
# The plain "what is the (most likely) diagnosis" family, decided before the rules.
_PLAIN_DX = re.compile(
    r"^(according to [^,]+, |regarding this patient, |the findings are most consistent with |"
    r"no fracture but |arterial blood gas .*? )?"
    r"(which|what)( is| was| would be)?( this| the)?( best| correct| final| likely| most likely| most probable| "
    r"most appropriate| probable| possible| clinical| underlying| most likely clinical| most likely underlying)* "
    r"(diagnos[ie]s|diagnosis do these findings suggest)\b"
)


def task_type(question: str) -> str:
    """What the question asks for, decided by ordered keyword rules (see TASK_RULES)."""
    q = normalize_ws(question).lower().replace("’", "'")
    q = re.sub(r"\s+", " ", q)
    plain = _PLAIN_DX.search(q) or re.search(r"\b(is|was) (most likely )?(this|the) (patient's |most likely )*diagnosis\b", q)
    plain = plain or re.search(
        r"(which|what) (diagnosis|trinucleotide disorder)\b|support(s)? a diagnosis of which|"
        r"diagnosis is most appropriate to consider|most likely diagnosis (for|of|in|contributing|responsible|based)",
        q,
    )
    if plain and not _NOT_PLAIN.search(q):
        return "diagnosis"
    for name, rx in _TASK_RES:
        if rx.search(q):
            return name
    return "other"


# ---------------------------------------------------------------------------
# The many-choice options
# ---------------------------------------------------------------------------

# A "diagnosis" question that asks for something about the diagnosis rather than its name
# ("Which best describes the most likely diagnosis?", "Which is true regarding ...", "Which underlies ...").
_ABOUT_THE_DIAGNOSIS = re.compile(
    r"\b(true|describes?|underlies|mechanism|pathognomonic|images?|prevent|originates?|aid|stage|explanation|outcome)\b",
    re.IGNORECASE,
)

#: The rule of :func:`names_a_diagnosis`, in words (the dataset card and the build report quote it).
DIAGNOSIS_OPTION_RULE = (
    "the correct answers of the text cases whose question asks for the diagnosis itself: the question's "
    "`task_type` is `diagnosis` and it does not ask about the diagnosis (which best describes it, what is true "
    "of it, what underlies it, its mechanism, stage, outcome, a pathognomonic sign or image of it, what "
    "prevents it, what would aid it); an answer with no letter (a number, percentage or ratio) is never one. "
    "Answers to every other question (statistics, treatment and drugs, next steps, tests, mechanisms, organisms, "
    "causes, risk factors, associated findings) are left out"
)


def names_a_diagnosis(question: str, answer: str) -> bool:
    """Whether a case's correct ``answer`` is a diagnosis, by :data:`DIAGNOSIS_OPTION_RULE`: the many-choice
    question's options are the distinct answers for which this holds."""
    if task_type(question) != "diagnosis" or _ABOUT_THE_DIAGNOSIS.search(question):
        return False
    return re.search(r"[^\W\d_]", answer) is not None


# ---------------------------------------------------------------------------
# History versus physical examination
# ---------------------------------------------------------------------------

# A sentence belongs to the examination and test findings when it reports what the
# clinician observes or measures: the examination itself, vital signs, laboratory
# values, imaging, biopsy, pathology. Everything else is what the patient can tell.
# (The patterns are lower case and run on the lower-cased sentence: several times
# faster than re.IGNORECASE.)
_EXAM = re.compile(
    r"\b("
    r"exam\w*|physical(ly)?|on inspection|inspection|palpat\w*|auscultat\w*|percussion|"
    r"vital signs?|temperature|pulse|blood pressure|heart rate|respiratory rate|respirations|"
    r"oxygen saturation|pulse oximetry|o2 saturation|bmi|mm ?hg|/min\b|°[cf]|"
    r"laborator\w*|labs?|serum|plasma|blood (tests?|work|count|smear|cultures?|gas)|"
    r"hemoglobin|hematocrit|leukocyte|platelet|count|concentration|level|levels|urinalysis|"
    r"urine (studies|test|toxicology|culture|dipstick)|cultures?|smear|gram stain|stain(ing|ed)?|"
    r"titer|assay|antibod\w*|pcr|test(s|ing)?|screen(ing)?|panel|"
    r"x-?rays?|radiograph\w*|ct|mri|scan|imaging|ultraso\w*|sonograph\w*|echocardiograph\w*|"
    r"ecg|ekg|electrocardiogra\w*|eeg|emg|angiogra\w*|endoscop\w*|colonoscop\w*|"
    r"biops\w*|histolog\w*|patholog\w*|microscop\w*|aspirat\w*|koh|dermoscop\w*|"
    r"shows?|showed|shown|reveals?|revealed|demonstrates?|demonstrated|notable for|remarkable for|"
    r"significant for|is noted|are noted|was noted|were noted|noted|identified|observed|visualized|"
    r"appears?|appeared|is seen|are seen|was seen|were seen|is found|are found|"
    r"photograph|image|lesions? (is|are|was|were)|is present|are present|"
    r"tender(ness)?|afebrile|febrile|alert|oriented|jaundiced|pale|diaphoretic|"
    r"murmur|crackles|rales|wheez\w*|bruit|reflexes|strength|gait|sensation|"
    r"hepatomegaly|splenomegaly|lymphadenopathy|edema"
    r")\b",
)
# Sentences that report what the patient says, even with an exam word in them.
_HISTORY = re.compile(
    r"\b(reports?|reported|complains?|complained|states?|stated|says|said|notes? that|noticed|"
    r"denies|denied|endorses?|endorsed|describes?|history of|past medical history|"
    r"medical history|family history|presents?|presented|comes|came|is brought|was brought|"
    r"admits|recalls|mentions|tells|worried|concerned|"
    r"has (had|been)|had been|takes|took|smokes|drinks|works|lives|was diagnosed|has a history|"
    r"claims?|claimed|feeling|for the (past|last)|over the (past|last|course)|ago|started|began|since)\b",
)
_STRONG_EXAM = re.compile(
    r"\b(physical exam\w*|on exam\w*|exam(ination)? (shows|reveals|demonstrates|is|was|of|findings)|"
    r"examination|vital signs|temperature is|pulse is|blood pressure is|laboratory (studies|tests|findings|results|evaluation)|"
    r"biopsy|ct|mri|x-?ray|ultrasound|radiograph\w*|photograph|is shown|are shown|ecg|ekg|"
    r"on palpation|to palpation|palpated|auscultation|(is|are|was|were) (positive|negative)|(positive|negative) for|"
    r"\d+\s*(mm ?hg|/min|°[cf]|mg/dl|g/dl|meq/l|mmol/l|/mm3|u/l|%))\b",
)


def is_exam_sentence(sentence: str) -> bool:
    """Whether a sentence reports examination or test findings (see the module notes)."""
    sentence = sentence.lower()
    if _STRONG_EXAM.search(sentence):
        return True
    if _HISTORY.search(sentence):
        return False
    return bool(_EXAM.search(sentence))


def split_history_exam(vignette: str) -> tuple[str, str]:
    """``(history, physical_exam)``: the vignette's sentences, each kept in order.

    The first sentence (who presents, with what) is always history. A sentence goes
    to the examination when :func:`is_exam_sentence` says so. Sentences are joined by
    a space, or by a line break where the vignette had one (lab tables stay tables).
    ``physical_exam`` is ``""`` when no sentence qualifies.
    """
    parts = _segments(vignette)
    history, exam = [], []
    for i, seg in enumerate(parts):
        (exam if i > 0 and is_exam_sentence(seg[0]) else history).append(seg)
    return _join(history), _join(exam)


# ---------------------------------------------------------------------------
# Answers, expert labels, hashes
# ---------------------------------------------------------------------------


def clean_option(text: str) -> str:
    """A choice or answer as we publish it: single spaces, no stray closing quote.

    Upstream's CSV ends a few choice and answer cells with a line break and an extra
    ``"`` (the cell ``Osteosarcoma`` + newline + ``"`` reads as ``Osteosarcoma "``). A trailing
    ``"`` that closes no opening quote in the text is that artifact: it goes, with the space
    before it.
    A balanced quote (``Postpartum "blues"; ...``) stays.
    """
    text = normalize_ws(text)
    while text.endswith('"') and text.count('"') % 2 == 1:
        text = text[:-1].rstrip()
    return text


#: Upstream answers written as a synonym of their choice (casefolded answer -> choice).
#: case_112: the answer "Henoch-Scholein vasculitis" is offered as "IgA vasculitis".
ANSWER_EQUIVALENTS = {"henoch-scholein vasculitis": "iga vasculitis"}


def answer_index(choices: list[str], answer: str) -> int:
    """0-based position of the answer among the choices.

    Exact match, else ignoring case and spacing, else through :data:`ANSWER_EQUIVALENTS`.
    """
    if answer in choices:
        return choices.index(answer)
    key = normalize_ws(answer).casefold()
    folded = [normalize_ws(c).casefold() for c in choices]
    for k in (key, ANSWER_EQUIVALENTS.get(key)):
        if k in folded:
            return folded.index(k)
    raise CraftMDError(f"answer {answer!r} is not one of the choices {choices}")


def qc_case_id(qc_id: str) -> str:
    """Map the QC file's ``public_caseNN``/``private_caseNN`` to our ``case_<n>``.

    Derm-public is ``case_0``..``case_99`` and derm-private ``case_100``..``case_199``
    in the upstream CSV, in the QC file's order (``public_case01`` is ``case_0``).
    """
    m = re.fullmatch(r"(public|private)_case0*(\d+)", qc_id.strip())
    if not m or not 1 <= int(m.group(2)) <= 100:
        raise CraftMDError(f"unexpected expert QC case id {qc_id!r}")
    return f"case_{int(m.group(2)) - 1 + (100 if m.group(1) == 'private' else 0)}"


def single_dx_label(only_possible: str | None, single_most_likely: str | None) -> bool | None:
    """The dermatologists' label: is there one most likely diagnosis for this vignette?

    True when the answer is the only possible one, or when (not the only possible
    one) it is the single most likely one; False when neither; None when unlabelled.
    """

    def yn(v: str | None) -> bool | None:
        v = (v or "").strip().lower()
        return {"yes": True, "no": False}.get(v)

    only, single = yn(only_possible), yn(single_most_likely)
    if only is True or single is True:
        return True
    if only is False and single is False:
        return False
    return None


def content_sha256(row: dict) -> str:
    """sha256 of a row's content fields (sorted-key JSON, without the hash itself)."""
    body = {k: v for k, v in row.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
