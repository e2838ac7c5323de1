"""The offline FRQ grader: judges a free-text diagnosis without any model.

Two steps, as the paper's grader-AI does them:

1. :meth:`OfflineGrader.extract` pulls the diagnosis out of a free-text answer
   (``**Final Diagnosis:** X``, ``The most likely diagnosis is X``, a bare ``X.``),
   drops trailing explanations and hedges, and says whether the answer names one
   diagnosis (``single``), several alternatives (``multiple``) or none (``none``:
   empty, a refusal, "not possible to diagnose", a question back to the patient, or a
   test, procedure or treatment instead of a diagnosis, as the recorded grader-AI's step 1
   judged them on training cases). "X, specifically Y" keeps both names; a slash inside a
   name ("attention-deficit/hyperactivity disorder") is one diagnosis.
2. :meth:`OfflineGrader.equivalent` compares that diagnosis with the correct answer
   after normalisation (case, accents, punctuation, possessives, British spellings,
   "disease"/"syndrome"/"disorder"), abbreviations and synonyms from the versioned
   table ``scoring/data/synonyms.tsv``, and word order. The subtype rule of the paper:
   an answer *more general* than the correct one counts (``lymphoma`` for
   ``Hodgkin lymphoma``); one *more specific* does not (``Hodgkin lymphoma`` for
   ``lymphoma``), except for qualifiers of course or severity (``acute``,
   ``chronic``, ``severe``, ...) which do not make a different disease. A one-letter
   misspelling of a long word is forgiven; in "X with Y" either named disease counts.

The table is data, reviewed by hand and built from the training cases only (see
``scoring/data/README.md``); nothing is learnt at run time. ``multiple`` and ``none``
always grade as wrong.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import Levenshtein

from craftmd import CraftMDError

TABLE_VERSION = "3"
#: What an answer more specific than the correct one gets: "qualifiers" (the paper's rule:
#: wrong, unless the extra words only qualify course/severity/side) or "count" (right).
SPECIFIC_POLICIES = ("qualifiers", "count")
DATA = Path(__file__).resolve().parent / "data"

#: Words that carry no identity of the disease (dropped before comparison).
STOPWORDS = frozenset(
    "a an the of in on to for with and without by from at as due its their his her this that is are be "
    "disease diseases syndrome syndromes disorder disorders condition type form variant "
    "likely possible probable probably possibly suspected presumed presumptive most suggestive "
    "consistent compatible infection eg ie would".split()
)
#: Qualifiers of course, severity, side or extent: adding one does not make an answer a subtype.
NEUTRAL = frozenset(
    "acute chronic subacute severe mild moderate bilateral unilateral left right recurrent "
    "early late new onset uncomplicated complicated simple active ongoing persistent "
    "worsening progressive mild-moderate episode episodic exacerbation flare primary sided".split()
)
#: Qualifiers of site, age group or cause that the recorded grader-AI did not treat as making a subtype
#: ("cutaneous leishmaniasis" for "leishmaniasis", "bacterial pneumonia" for "pneumonia"). Used only
#: when the policy is "qualifiers" and the more specific answer adds nothing else.
PRESENTATION = frozenset(
    "cutaneous congenital neonatal infantile juvenile adult childhood pediatric maternal bacterial viral infected "
    "infectious traumatic postoperative lumbar cervical thoracic pulmonary community acquired nosocomial "
    "localized generalized disseminated benign".split()
)
#: Words that make a disease of their own: an answer that drops one is not "more general"
#: ("bipolar disorder" for "bipolar II disorder", "OCD" for "obsessive-compulsive personality disorder").
#: Causes and mechanisms named in the correct answer are part of its identity too: "drug-induced lupus" is
#: not credited for "lupus", nor "nephrogenic diabetes insipidus" for "diabetes insipidus" (training cases).
DISTINCT = frozenset(
    "personality i ii iii iv 1 2 3 4 a b c drug induced hereditary nephrogenic inflammatory autoimmune ruptured normal "
    "nonhodgkin".split()
)
#: Words too generic to count as "more general" than a named disease on their own: categories
#: ("infection", "cancer") and findings or syndromes that many diseases share ("anemia", "jaundice",
#: "seizure"); the recorded grader-AI did not credit them for a specific disease (training cases).
GENERIC = frozenset(
    "infection infectious inflammation inflammatory tumor tumour cancer malignancy neoplasm mass lesion "
    "carcinoma disease syndrome disorder deficiency injury trauma failure insufficiency cyst "
    "reaction dysfunction abnormality anomaly toxicity poisoning rash eruption pain fever "
    "virus viral bacterial fungal allergy allergic cell acid anemia leukemia jaundice dementia seizure vertigo "
    "syncope amnesia ataxia hepatitis diabetes headache meningitis conjunctivitis angioedema arthritis "
    "dermatitis colitis gastritis glossitis nephritis urticaria".split()
)

_BRITISH_MAP = {
    "haem": "hem", "aem": "em", "oedem": "edem", "oesophag": "esophag", "oestr": "estr", "naev": "nev",
    "tumour": "tumor", "paed": "ped", "coel": "cel", "diarrhoea": "diarrhea", "ischaem": "ischem",
    "leukaem": "leukem", "sulph": "sulf",
}  # fmt: skip
_BRITISH = re.compile("|".join(sorted(_BRITISH_MAP, key=len, reverse=True)))
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})
_GREEK = str.maketrans({"\u03b1": " alpha ", "\u03b2": " beta ", "\u03b3": " gamma ", "\u03b4": " delta ", "\u03ba": " kappa "})
_POSS = re.compile(r"(\w)'s\b")
_POSS_PL = re.compile(r"(\w)s'(?=\s|$)")
_PREFIXES = re.compile(r"\b(non|anti|post|pre|para|pseudo|hypo|hyper|sub|intra|extra|inter|peri|poly|neuro|co|re)[\s-]+(?=[a-z])")
_NONWORD = re.compile(r"[^a-z0-9+]+")


@lru_cache(maxsize=None)
def _fold(text: str) -> str:
    """Lower case, accents off, quotes straightened, possessives dropped, punctuation to spaces."""
    if text.isascii():
        t = text.lower()
    else:
        t = unicodedata.normalize("NFKD", text.lower().translate(_GREEK))
        t = "".join(c for c in t if not unicodedata.combining(c)).lower()
    t = t.translate(_QUOTES)
    t = _POSS.sub(r"\1", t)
    t = _POSS_PL.sub(r"\1s", t)
    # "non-Hodgkin", "post-traumatic", "anti-TTG": a prefix is part of its word.
    t = _PREFIXES.sub(r"\1", t)
    t = _BRITISH.sub(lambda m: _BRITISH_MAP[m.group(0)], t)
    t = _NONWORD.sub(" ", t)
    return " ".join(t.split())


@lru_cache(maxsize=None)
def _stem(word: str) -> str:
    """Plural to singular for the few endings that matter in disease names."""
    if len(word) > 5 and word.endswith("oses"):  # keratoses -> keratosis
        return word[:-2] + "is"
    if len(word) > 4 and word.endswith("mas"):  # lipomas, xanthelasmas
        return word[:-1]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ses", "xes")) and not word.endswith(("oses", "ases")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "as", "os", "ys")):
        return word[:-1]
    return word


def _stem_all(folded: str) -> str:
    return " ".join(_stem(w) for w in folded.split())


# The word lists are compared with stemmed tokens ("diabetes" -> "diabete"): hold both forms.
STOPWORDS, NEUTRAL, PRESENTATION, DISTINCT, GENERIC = (
    frozenset(ws | {_stem(w) for w in ws}) for ws in (STOPWORDS, NEUTRAL, PRESENTATION, DISTINCT, GENERIC)
)


@dataclass(frozen=True)
class SynonymTable:
    """Phrase -> canonical phrase (folded), plus the table's own hash for the record."""

    canon: dict[str, str]
    broader: dict[str, frozenset[str]]  # canonical -> canonical terms it is a subtype of
    sha256: str
    rows: int

    @classmethod
    def load(cls, path: Path | None = None) -> SynonymTable:
        if path is None:
            ref = resources.files("craftmd.scoring") / "data" / "synonyms.tsv"
            raw = ref.read_bytes()
            where = "scoring/data/synonyms.tsv"
        else:
            raw = Path(path).read_bytes()
            where = str(path)
        canon: dict[str, str] = {}
        broader: dict[str, set[str]] = {}
        rows = 0
        reader = csv.reader(raw.decode("utf-8").splitlines(), delimiter="\t")
        for n, row in enumerate(reader, 1):
            if not row or row[0].startswith("#") or row[0] == "term":
                continue
            if len(row) < 3:
                raise CraftMDError(f"{where}:{n}: expected term<TAB>canonical<TAB>relation")
            term, target, relation = _fold(row[0]), _fold(row[1]), row[2].strip()
            if not term or not target:
                raise CraftMDError(f"{where}:{n}: empty term")
            rows += 1
            if relation in ("synonym", "abbreviation", "spelling"):
                canon[term] = target
            elif relation in ("subtype", "accepted"):
                # subtype: term is a kind of target, so target (more general) counts for term.
                # accepted: for the correct answer term, the grader-AI accepted target (training cases).
                broader.setdefault(term, set()).add(target)
            else:
                raise CraftMDError(f"{where}:{n}: unknown relation {relation!r} (synonym|abbreviation|spelling|subtype|accepted)")
        # Resolve chains (a -> b -> c) once, so lookups are one step.
        for term in list(canon):
            seen = {term}
            t = canon[term]
            while t in canon and t not in seen:
                seen.add(t)
                t = canon[t]
            canon[term] = t
        return cls(canon, {k: frozenset(v) for k, v in broader.items()}, hashlib.sha256(raw).hexdigest(), rows)


def _misspelt(dx: frozenset[str], ans: frozenset[str]) -> bool:
    """Same words but one misspelt by one letter ("apthous stomatitis", "Guillan-Barre"); long words only, no digits."""
    a_only, d_only = ans - dx, dx - ans
    if len(a_only) != 1 or len(d_only) != 1:
        return False
    (a,), (d,) = a_only, d_only
    return min(len(a), len(d)) >= 6 and not any(c.isdigit() for c in a + d) and Levenshtein.distance(a, d) <= 1


@dataclass(frozen=True)
class Extraction:
    """What the answer names: the diagnosis text (or None) and its kind."""

    diagnosis: str | None
    kind: str  # single | multiple | none
    alternatives: tuple[str, ...] = ()


@dataclass(frozen=True)
class OfflineGrade:
    resolved: str | None
    resolved_kind: str
    correct: bool
    detail: str  # JSON


# --- extraction -----------------------------------------------------------------
_FINAL = re.compile(r"final\s+diagnosis\s*(?:is|would\s+be|:)?\s*:?", re.I)
#: "The final diagnosis would be confirmed by a biopsy", "the final diagnosis, after further testing, could be X": a remark
#: about the final diagnosis, not one; the earlier "most likely diagnosis is X" is what the answer names.
_FINAL_REMARK = re.compile(
    r"\s*(?:,|(?:be\s+)?(?:confirmed|made|established|determined|requires?|needs?|should|will|would|can(?:not)?|depends|may|might"
    r"|must|after|pending|not|uncertain|dependent)\b)",
    re.I,
)
_MARKERS = [
    re.compile(
        r"\bdiagnosis(?:\s+(?:for|of|in)\s+(?:this|the|her|his)\s+(?:patient|case|child|woman|man|infant|boy|girl)(?:'s)?"
        r"(?:\s+(?:condition|symptoms|presentation))?)?"
        r"(?:\s+based\s+on\s+[^.:\n]{0,160}?)?"
        r"\s*(?:,\s*)?(?:is|would\s+be|could\s+be|appears\s+to\s+be|seems\s+to\s+be|is\s+likely(?:\s+to\s+be)?|:)\s*:?",
        re.I,
    ),
    # "the most likely diagnosis for this 17-year-old girl is X", "the most probable diagnosis in the present case is X".
    re.compile(
        r"\bdiagnosis\s+(?:for|of|in)\s+[^.:;\n?]{1,80}?\s+(?:is|would\s+be)\s+(?:likely\s+)?",
        re.I,
    ),
    re.compile(r"\b(?:diagnose\s+(?:him|her|them|the\s+patient|this\s+patient)\s+with)\s+", re.I),
    # "the most likely diagnosis, given the symptoms of ..., is X"; "the underlying cause of the patient's condition is X".
    re.compile(r"\bdiagnosis,\s+(?:given|based|considering|in\s+view)\b[^.;\n?]{1,200}?,\s+is\s+", re.I),
    re.compile(r"\bcause\s+of\s+(?:the|this|his|her)\s+(?:patient'?s?\s+)?(?:condition|symptoms|presentation)\s+is\s+", re.I),
    re.compile(r"\b(?:diagnosis\s+of|diagnosed\s+with|likely\s+to\s+be|most\s+likely\s+(?:has|have|cause\s+is|due\s+to))\s+", re.I),
    re.compile(
        r"\b(?:suggest|suggests|suggestive\s+of|indicate|indicates|indicative\s+of|point\s+to|points\s+to|consistent\s+with"
        r"|compatible\s+with|suffering\s+from|suffers\s+from|cause\s+of\s+(?:his|her|the|their)\s+symptoms\s+is)\s+",
        re.I,
    ),
]
_NONE_PAT = re.compile(
    r"^(?:(?:none(?!\s+other)|n/?a|unknown|unclear|undetermined|inconclusive)\b|no\s+(?:definitive\s+|specific\s+|clear\s+|final\s+)?diagnosis\b"
    r"|not\s+(?:possible|able|enough|determined|applicable)|cannot|can't|can\s+not|unable|insufficient|i\s+(?:am|'m)\s+(?:sorry|unable|not)"
    r"|i\s+apologi|sorry|further\s+(?:information|evaluation|testing|tests|investigation|workup)|more\s+information|additional\s+information"
    r"|undiagnosed|no\s+(?:current\s+)?(?:medical|acute|significant|abnormal)|as\s+an\s+ai|you\s+have\s+not|please\s+provide)",
    re.I,
)
#: What a marker found that only points back at a diagnosis named earlier ("... consistent with this diagnosis").
_BACKREF = re.compile(
    r"\s*(?:this|these|that|those|the\s+above|such|other|his|her|their|the\s+(?:patient|symptoms?|findings?|diagnosis|condition)|based\s+on)\b",
    re.I,
)
#: "Based on the symptoms provided, X": the lead-in clause, not the diagnosis.
_BASED = re.compile(r"^based\s+on\s+[^,.;:\n]{0,150},\s*", re.I)
_LEAD = re.compile(
    r"^(?:(?:is|are|was|be|to\s+be|a|an|the|of|as|likely|most\s+likely|probably|possibly|possible|probable|suspected|presumed|presumptive"
    r"|clinically|that|this\s+is|it\s+is|none\s+other\s+than|diagnosis\s+of|diagnosed\s+with|a\s+case\s+of|case\s+of|(?:most\s+)?consistent\s+with|suggestive\s+of"
    r"|compatible\s+with|potential|atypical\s+presentation\s+of|a\s+form\s+of|form\s+of|type\s+of)(?:\s+|$)|[:\-]\s*)+",
    re.I,
)
_CUT = re.compile(
    r"(?:\.\s|\.$|;|:|\n|,\s+(?:a|an|the)\s|\s(?:a|an)\s+(?:common|rare|type|form|condition|complication|side|disorder|severe|serious|chronic|benign|group)\b|\s\((?:note|see|this|these|based|likely|possibly|probably|most|if|given|due)\b|\s[-\u2013\u2014]\s|\s\(if\b|,\s*(?:which|likely|possibly|probably|based|given|as|due|secondary|caused|with\s+possible"
    r"|and\s+(?:further|additional)|although|though|but|however|considering|in\s+(?:a|the|this)|most|specifically)\b"
    r"|\s(?:based\s+on|due\s+to|secondary\s+to|caused\s+by|because|given|considering|as\s+(?:evidenced|indicated|suggested|a\s+result)"
    r"|in\s+(?:a|this|the)\s+(?:patient|child|woman|man|setting|context)|which|that\s+(?:is|was|has|may)|associated\s+with|resulting\s+from|leading\s+to"
    r"|following|after|triggered|related\s+to|induced\s+by|from\s+(?:a|an|the)|is\s+(?:a|the|likely|most|suspected|characterized))\b)",
    re.I,
)
#: "Attention-deficit/hyperactivity disorder", "HIV/AIDS": a slash inside a name is one diagnosis; a spaced one is two.
_MULTI = re.compile(r"\s(?:or|vs\.?|versus|and/or)\s|(?<!\w)/|/(?!\w)|\bdifferential\b|\beither\b|\brule\s+out\b|\br/o\b", re.I)
_WITH = re.compile(r"\s(?:with|and|plus|complicated\s+by|accompanied\s+by|along\s+with)\s", re.I)
_SITE = re.compile(r"\s(?:of|in|on|involving|affecting)\s+(?:the|both|his|her|a|an)\s", re.I)
_ALSO = re.compile(r"\s(?:also\s+known\s+as|also\s+called|aka|a\.k\.a\.|known\s+as|such\s+as|specifically|likely|namely|eg|or)\s", re.I)
#: Tests, procedures and treatments: an answer naming one names no diagnosis (the recorded grader-AI's step 1 said
#: "none" for 93 % of them on training cases).
_PROC = re.compile(
    r"\b(?:ultrasound|ultrasonography|sonography|colonoscopy|endoscopy|ct|computed\s+tomography|mri|magnetic\s+resonance|biopsy"
    r"|radiograph\w*|x-?rays?|echocardiogra\w*|electrocardiogra\w*|ecg|ekg|scan|tests?|testing|assay|serology|titer|cultures?"
    r"|smear|(?<!meconium\s)(?<!body\s)aspiration(?![\s-]+(?:pneumon\w+|syndrome))|puncture|panel|angiogra\w*|imaging|therapy|treatment"
    r"|administration|administer|surgery|surgical|excision|resection|transfusion(?![\s-]+(?:reaction|related|associated))|management"
    r"|antibiotics?(?![\s-]+(?:associated|induced|related))|referral|refer|observation|reassurance|counseling|evaluation|work-?up"
    r"|monitoring|urinalysis|cystoscopy|laparoscopy|bronchoscopy|mammogra\w*|elisa|pcr|screening|order|obtain|perform|start"
    r"|initiate|prescribe|measure|measurement|electrophoresis|manometry|vaccines?|vaccination)\b",
    re.I,
)
_SPECIFIC = re.compile(r",?\s+(?:more\s+)?(?:specifically|particularly|namely|likely|most\s+likely)[,:]?\s+", re.I)
_HEDGE_END = re.compile(r"(?:\s+(?:possibly|likely|probably|most\s+likely|potentially))+$", re.I)
_REFUSAL = re.compile(r"(?:i\s+cannot|i\s+can't|i'm\s+unable|i\s+am\s+unable|i\s+am\s+not\s+able|i'm\s+not\s+able|as\s+an\s+ai)\b", re.I)
_EG = re.compile(r"\be\.g\.|\bi\.e\.")
_ABBR_DOT = re.compile(r"\b(vs|st|dr|no|type)\.", re.I)
#: "E. coli", "C. difficile", "H. pylori": a genus initial is no sentence end.
_GENUS_DOT = re.compile(r"\b([A-Z])\.\s*(?=[a-z]{3,})")
_PAREN = re.compile(r"\(([^()]*)\)")
_MD = re.compile(r"[*_#`>]+")
_ENUM = re.compile(r"^\s*(?:\d+[.)]|[-\u2022*])\s+", re.M)
#: "A. Asthma", "(B) Pelvic inflammatory disease": a multiple-choice letter before the name (not "E. coli").
_OPTION = re.compile(r"^\(?[A-J][.)]\s+(?=[A-Z])")


def _first_clause(text: str) -> str:
    # Keep "(...)" intact while cutting: mask dots/colons inside parentheses.
    masked = _PAREN.sub(lambda m: "(" + "x" * (len(m.group(0)) - 2) + ")", text) if "(" in text else text
    m = _CUT.search(masked)
    return text[: m.start()] if m else text


def extract(response: str | None) -> Extraction:
    """Pull the diagnosis out of a free-text answer (see the module doc)."""
    if response is None or not response.strip():
        return Extraction(None, "none")
    text = _MD.sub("", response).strip()
    if _REFUSAL.match(text):  # "I cannot provide a diagnosis... However, it could be X": the grader-AI read no diagnosis
        return Extraction(None, "none")
    if "." in text:
        text = _EG.sub("eg", text)
        text = _GENUS_DOT.sub(r"\1 ", _ABBR_DOT.sub(r"\1", text))
    found = None
    m = _FINAL.search(text)
    if m and text[m.end():].strip() and not _FINAL_REMARK.match(text[m.end():]):
        found = text[m.end():]
    else:  # the earliest of the other markers
        hits = [m for pat in _MARKERS for m in [pat.search(text)] if m and text[m.end():].strip() and not _BACKREF.match(text[m.end():])]
        if hits:
            found = text[min(hits, key=lambda m: m.start()).end():]
    body = found if found is not None else text
    body = body.strip()
    # The first non-empty line; an enumerated list starts on the next line.
    lines = [ln for ln in body.splitlines() if ln.strip()]
    if not lines:
        return Extraction(None, "none")
    first = lines[0].strip()
    if _ENUM.match(first) or (first.endswith(":") and len(lines) > 1):
        items = [ln for ln in lines if _ENUM.match(ln)]
        if len(items) > 1:
            return Extraction(None, "multiple", tuple(_ENUM.sub("", i).strip() for i in items[:5]))
        first = _ENUM.sub("", items[0] if items else lines[1]).strip()
    first = _LEAD.sub("", _BASED.sub("", _OPTION.sub("", first))).strip()
    if not first or _NONE_PAT.match(first) or "?" in _first_clause(first):  # a question back is no diagnosis
        return Extraction(None, "none")
    clause = _first_clause(first).strip(" ,.;:-")
    m = _SPECIFIC.search(first)
    if m and first[: m.start()].strip(" ,") == clause:  # "X, specifically Y": both name it; Y is what the grader-AI took
        tail = _LEAD.sub("", _first_clause(first[m.end():])).strip(" ,.;:-")
        clause = f"{clause} ({tail})" if tail else clause
    clause = _HEDGE_END.sub("", clause)
    clause = _LEAD.sub("", clause).strip(" ,.;:-")
    if not clause or _NONE_PAT.match(clause):
        return Extraction(None, "none")
    outside = _PAREN.sub(" ", clause)
    if _MULTI.search(outside):
        parts = [p.strip(" ,.") for p in re.split(r"\s(?:or|vs\.?|versus|and/or)\s|/", outside, flags=re.I) if p.strip(" ,.")]
        return Extraction(clause, "multiple", tuple(parts))
    if _PROC.search(_WITH.split(outside, maxsplit=1)[0]):  # a test, procedure or treatment is no diagnosis
        return Extraction(None, "none", (clause,))
    return Extraction(clause, "single")


# --- equivalence ----------------------------------------------------------------
class OfflineGrader:
    """Grades free-text answers against the correct diagnosis, with no model."""

    name = "offline"

    def __init__(self, table: SynonymTable | Path | None = None, *, specific: str = "qualifiers"):
        if specific not in SPECIFIC_POLICIES:
            raise CraftMDError(f"unknown subtype policy {specific!r}; one of {SPECIFIC_POLICIES}")
        self.specific = specific
        self.table = table if isinstance(table, SynonymTable) else SynonymTable.load(table)
        # Table terms are matched in the same stemmed form as the text they replace.
        self._canon = {_stem_all(k): _stem_all(v) for k, v in self.table.canon.items()}
        self._phrases = sorted(self._canon, key=lambda p: (-len(p.split()), p))
        self._phrase_re = (
            re.compile(r"\b(?:" + "|".join(re.escape(p) for p in self._phrases) + r")\b") if self._phrases else None
        )
        self._tokens = lru_cache(maxsize=None)(self._tokens_uncached)
        self.canonical = lru_cache(maxsize=None)(self._canonical_uncached)
        self._accept: dict[str, set[str]] = {}
        for term, targets in self.table.broader.items():
            self._accept.setdefault(self.canonical(term), set()).update(self.canonical(t) for t in targets)
        self._grade = lru_cache(maxsize=None)(self._grade_uncached)

    @property
    def version(self) -> dict:
        """What a release records about the grader: the table's and the rules' (this module's) hashes."""
        return {
            "name": "offline",
            "table_version": TABLE_VERSION,
            "table_sha256": self.table.sha256,
            "table_rows": self.table.rows,
            "rules_sha256": rules_sha256(),
        }

    # Normal form of a phrase: folded, synonyms replaced (longest first), stemmed, stopwords out.
    def _canonical_uncached(self, phrase: str) -> str:
        t = _stem_all(_fold(phrase))
        if self._phrase_re is not None:
            t = self._phrase_re.sub(lambda m: self._canon[m.group(0)], t)
        return t

    def _tokens_uncached(self, phrase: str) -> frozenset[str]:
        canon = self.canonical(phrase)
        words = [_stem(w) for w in canon.split()]
        # "a" is an article at the start, a subtype after a name ("hepatitis a", "hemophilia a").
        toks = frozenset(w for i, w in enumerate(words) if w not in STOPWORDS or (w == "a" and i > 0 and words[i - 1] != "of"))
        return toks or frozenset(words)

    def _variants(self, text: str, *, answer: bool) -> list[str]:
        """Phrases a text may stand for: itself, without/inside its parentheses, its main part."""
        out: list[str] = []

        def add(p: str) -> None:
            p = p.strip(" ,.;:-")
            if p and p not in out:
                out.append(p)

        add(text)
        bare = _PAREN.sub(" ", text)
        add(bare)
        for inner in _PAREN.findall(text):
            add(inner)
        for part in _ALSO.split(bare):
            add(part)
        if answer:
            # "anorexia nervosa - purging type", "x, y": the head before a dash or comma.
            for sep in (" - ", ", ", ": "):
                if sep in bare:
                    add(bare.split(sep, 1)[0])
        else:
            # "renal cell carcinoma with hematuria": the main diagnosis before "with/and".
            head, *rest = _WITH.split(bare, maxsplit=1)
            add(head)
            # "myocardial infarction with pericarditis": the grader-AI credited either named disease.
            for tail in rest:
                add(_LEAD.sub("", _first_clause(tail)))
            # "squamous cell carcinoma of the foot": the disease without its site.
            add(_SITE.split(head, maxsplit=1)[0])
            # "interstitial cystitis/bladder pain syndrome": two names of one disease, each counts.
            if "/" in head:
                sides = head.split("/")
                if all(len(side.split()) >= 2 for side in sides):
                    for side in sides:
                        add(side)
        return out

    def _same(self, dx: frozenset[str], ans: frozenset[str], compound: bool = False) -> bool:
        if dx == ans or _misspelt(dx, ans):
            return True
        if dx < ans and not compound:  # the answer is more general than the correct one: counts, unless only a generic word
            rest = dx - NEUTRAL
            return bool(rest) and not rest <= GENERIC and not (ans - dx) & DISTINCT
        if ans < dx:  # more specific: counts only when the extra words are course/severity qualifiers
            return self.specific == "count" or (dx - ans) <= NEUTRAL | PRESENTATION
        return False

    def equivalent(self, diagnosis: str, answer: str) -> bool:
        """True when ``diagnosis`` names the correct ``answer`` (synonym, same, or more general)."""
        dxs = self._variants(diagnosis, answer=False)
        anss = self._variants(answer, answer=True)
        dtoks = [self._tokens(d) for d in dxs]
        for a in anss:
            atoks = self._tokens(a)
            # "panic disorder and agoraphobia": naming one of the two is not "more general".
            compound = " and " in f" {_fold(a)} "
            if any(self._same(d, atoks, compound) for d in dtoks):
                return True
            accepted = self._accept.get(self.canonical(a))
            if accepted and any(self.canonical(d) in accepted for d in dxs):
                return True
        return False

    def _grade_uncached(self, response: str | None, answer: str) -> OfflineGrade:
        ex = extract(response)
        correct = ex.kind == "single" and ex.diagnosis is not None and self.equivalent(ex.diagnosis, answer)
        detail = json.dumps(
            {"extracted": ex.diagnosis, "kind": ex.kind, "alternatives": list(ex.alternatives)},
            ensure_ascii=False,
            sort_keys=True,
        )
        resolved = ex.diagnosis if ex.kind == "single" else (ex.diagnosis if ex.kind == "multiple" else None)
        return OfflineGrade(resolved, ex.kind, bool(correct), detail)

    def grade(self, response: str | None, answer: str) -> OfflineGrade:
        """Grade one free-text answer against the correct answer."""
        return self._grade(response, answer)

    def grade_top3(self, response: str | None, answer: str) -> OfflineGrade:
        """A top-3 answer (one diagnosis per line): correct when one of its first three names the answer."""
        items = []
        for line in (response or "").splitlines():
            line = _ENUM.sub("", _MD.sub("", line)).strip()
            if not line or line.endswith(":") and not items:
                continue
            ex = extract(line)
            if ex.kind == "single" and ex.diagnosis:
                items.append(ex.diagnosis)
            if len(items) == 3:
                break
        if len(items) == 1 and response and "," in items[0]:  # "a, b, c" on one line
            items = [p.strip() for p in items[0].split(",") if p.strip()][:3]
        hit = next((i for i in items if self.equivalent(i, answer)), None)
        kind = "none" if not items else "single" if len(items) == 1 else "multiple"
        detail = json.dumps({"items": items, "match": hit}, ensure_ascii=False, sort_keys=True)
        return OfflineGrade(hit if hit is not None else ("; ".join(items) or None), kind, hit is not None, detail)


@lru_cache(maxsize=1)
def rules_sha256() -> str:
    """sha256 of this module's source: the rules (patterns, word lists) the grader applies."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def default_grader() -> OfflineGrader:
    return OfflineGrader()


__all__ = ["OfflineGrader", "OfflineGrade", "Extraction", "SynonymTable", "extract", "default_grader"]
