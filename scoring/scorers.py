"""The scorer registry: every way the package turns an answer into a score, in one place.

A scorer has a ``name`` (what ``scores.scorer`` says), the answer formats it applies to,
the metric it writes, an ``identity`` (a version or table hash; None for a scorer whose
outputs cannot be re-derived, such as an LLM) and a ``score`` function. ``craftmd grade``
looks scorers up here by name; nothing else spells grader names.

* ``paper``, ``strict``: the two MCQ rules (:func:`craftmd.scoring.mcq.grade_mcq`) on
  ``mcq4`` and ``mcq_many``.
* ``offline``: the offline FRQ grader (:mod:`craftmd.scoring.offline`) on ``frq`` and ``top3``.
* ``llm:<provider/model>``: the paper's two-step grader-AI (:mod:`craftmd.scoring.llm_grader`) on ``frq``.
* ``upstream-gpt4``: the GPT-4 grader labels recorded upstream; written by ingest, never re-run.

Which FRQ scorer stands behind a model's free-response figure is decided by
:func:`rank_frq`, once: graders whose agreement with people has been measured come
first, most reliable first; a grader that would grade its own model never stands there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyarrow as pa

from craftmd import CraftMDError
from craftmd.registry import Registry
from craftmd.release import ANSWER_VARIANT, SCORE_COLUMNS

MCQ_RULES = ("paper", "strict")
MCQ_FORMATS = ("mcq4", "mcq_many")
RECORDED = "upstream-gpt4"
AGREEMENT_FILE = Path(__file__).resolve().parent / "data" / "offline_agreement.json"


@dataclass(frozen=True)
class Verdict:
    """One answer's grade: what the scorer resolved, whether it is right, its own record."""

    resolved: str | None
    resolved_kind: str  # single | multiple | none
    correct: bool | None  # None: the score could not be produced (a failed call)
    detail: str | None = None  # the scorer's own JSON object, or None
    error: str | None = None


def _detail(v: Verdict) -> str:
    """The score's detail: the resolved kind spliced into the scorer's own JSON object."""
    head = '{"resolved_kind": ' + json.dumps(v.resolved_kind)
    if v.error is not None:
        head += ', "error": ' + json.dumps(v.error, ensure_ascii=False)
    if not v.detail or v.detail == "{}":
        return head + "}"
    if not v.detail.startswith("{"):
        return head + ', "grader": ' + json.dumps(v.detail, ensure_ascii=False) + "}"
    return head + ", " + v.detail[1:]


#: The columns of answer-level scores: the base columns with CRAFT-MD's answer variant keys after the trial.
SCHEMA = pa.schema([SCORE_COLUMNS.field("case_id"), SCORE_COLUMNS.field("trial"), *ANSWER_VARIANT,
                    *[f for f in SCORE_COLUMNS if f.name not in ("case_id", "trial")]])


class ScoreRows:
    """Columns of answer-level scores (CRAFT-MD's answer variant keys), filled one score at a time."""

    def __init__(self):
        self.cols = {n: [] for n in SCHEMA.names}

    def score(self, row: dict, scorer: str, metric: str, value: float | None, *, label: str | None = None,
              detail: str | None = None) -> None:
        """One score of an answer ``row``; ``value`` None means the score could not be produced (status error)."""
        c = self.cols
        c["case_id"].append(row["case_id"])
        c["trial"].append(row["trial"])
        c["setting"].append(row["setting"])
        c["format"].append(row["format"])
        c["with_image"].append(row["with_image"])
        c["scorer"].append(scorer)
        c["metric"].append(metric)
        c["value"].append(None if value is None else float(value))
        c["label"].append(label)
        c["detail"].append(detail)
        c["status"].append("error" if value is None else "ok")

    def add(self, row: dict, scorer: str, v: Verdict) -> None:
        """A grader's verdict as a ``correct`` score (null when the grader could not produce one)."""
        self.score(row, scorer, "correct", None if v.correct is None else float(v.correct), label=v.resolved, detail=_detail(v))

    def __len__(self) -> int:
        return len(self.cols["case_id"])

    def table(self) -> pa.Table:
        return pa.table(self.cols, schema=SCHEMA)


def scores_from_grades(rows: list[dict] | pa.Table) -> pa.Table:
    """Answer-level ``correct`` scores from grade rows of the old shape (case_id, trial, setting, format,
    with_image, grader, resolved, resolved_kind, correct, detail): the one converter, used by tests and
    by anyone holding grades from a schema-1 release."""
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    out = ScoreRows()
    for r in rows:
        correct = r.get("correct")
        out.add(r, r["grader"], Verdict(r.get("resolved"), r.get("resolved_kind") or "none",
                                        None if correct is None else bool(correct), r.get("detail")))
    return out.table()


@dataclass
class Context:
    """What a scorer needs besides the answers: the dataset's keys, and the model layer's settings."""

    cases: dict  # (case_id, with_image) -> (choices, answer, paper_answer)
    many: list[str]  # the many-choice options (the dataset's diagnoses config)
    dataset_dir: Path
    base_url: str | None = None
    cache: object = None
    progress: bool = True


class Scorer:
    name: str
    formats: tuple[str, ...] = ()

    def identity(self) -> dict | None:
        """What the release records about the scorer; None when its scores cannot be re-derived (always re-run)."""
        return None

    def score(self, rows: list[dict], ctx: Context, out: ScoreRows) -> dict:
        """Score answer ``rows`` of this scorer's formats into ``out``; returns counts for the record."""
        raise NotImplementedError

    def record(self) -> dict:
        return dict(self.identity() or {})


class McqRule(Scorer):
    formats = MCQ_FORMATS

    def __init__(self, rule: str):
        self.name = rule

    def identity(self) -> dict:
        from craftmd.scoring.mcq import RULES_VERSION

        return {"rule": self.name, "rules_version": RULES_VERSION}

    def score(self, rows, ctx, out):
        from tqdm import tqdm

        from craftmd.scoring.mcq import grade_mcq

        n = 0
        for row in tqdm(rows, desc=f"grade {self.name}", unit="answer", disable=not ctx.progress or not rows):
            choices, answer, paper_answer = ctx.cases[(row["case_id"], row["with_image"])]
            if self.name == "paper":  # the key the published rule matched, verbatim
                answer = paper_answer
            if row["format"] == "mcq_many":
                if not ctx.many:
                    raise CraftMDError(f"{ctx.dataset_dir}: no 'diagnoses' config, needed to grade mcq_many answers")
                choices = ctx.many
            if not choices:  # NEJM image cases: no options, not gradable by rule
                continue
            resolved, kind, correct = grade_mcq(row["response"], choices, answer, self.name)
            out.add(row, self.name, Verdict(resolved, kind, correct))
            n += 1
        return {"graded": n}


class Offline(Scorer):
    name = "offline"
    formats = ("frq", "top3")

    def identity(self) -> dict:
        from craftmd.scoring.offline import default_grader

        return default_grader().version

    def score(self, rows, ctx, out):
        from tqdm import tqdm

        from craftmd.scoring.offline import default_grader

        og = default_grader()
        for row in tqdm(rows, desc="grade offline", unit="answer", disable=not ctx.progress or not rows):
            answer = ctx.cases[(row["case_id"], row["with_image"])][1]
            r = og.grade_top3(row["response"], answer) if row["format"] == "top3" else og.grade(row["response"], answer)
            out.add(row, self.name, Verdict(r.resolved, r.resolved_kind, r.correct, r.detail))
        return {"graded": len(rows)}


class LLM(Scorer):
    formats = ("frq",)

    def __init__(self, name: str):
        from craftmd.scoring.llm_grader import parse_grader_name

        self.name = name
        self.model = parse_grader_name(name)
        self._record: dict = {}

    def score(self, rows, ctx, out):
        from craftmd.scoring.llm_grader import LLMGrader

        lg = LLMGrader(self.model, base_url=ctx.base_url, cache=ctx.cache)
        pairs = [(row["response"], ctx.cases[(row["case_id"], row["with_image"])][1]) for row in rows]
        results = lg.grade_many(pairs, progress=ctx.progress)
        for row, r in zip(rows, results):
            err = json.loads(r.detail).get("error") if r.failed else None
            out.add(row, self.name, Verdict(r.resolved, r.resolved_kind, None if r.failed else r.correct, r.detail, err))
        self._record = lg.record()
        if ctx.base_url or lg.server.get("service"):  # where it was called: a public URL, never a user:password or query
            self._record.update({k: v for k, v in lg.server.items() if v is not None})
        return {"graded": len(rows), "failures": sum(r.failed for r in results)}

    def record(self) -> dict:
        return dict(self._record)


class Recorded(Scorer):
    """Labels recorded upstream: ingest writes them; they cannot be re-run."""

    name = RECORDED
    formats = ("frq",)


#: name -> factory; ``llm:<provider/model>`` names are made by :class:`LLM`.
SCORERS: Registry = Registry("grader")
SCORERS.update({"paper": lambda: McqRule("paper"), "strict": lambda: McqRule("strict"), "offline": Offline})


def register_scorer(name: str, factory) -> None:
    """Add a scorer (a task's own): ``factory()`` returns a :class:`Scorer` whose ``name`` is ``name``."""
    if name == RECORDED or name.startswith("llm:"):
        raise CraftMDError(f"scorer name {name!r} is reserved")
    SCORERS.register(name, factory)


def get_scorer(name: str) -> Scorer:
    """The scorer called ``name`` (``paper``, ``strict``, ``offline``, ``llm:PROVIDER/MODEL``, or a registered one)."""
    if name in SCORERS:
        return SCORERS[name]()
    if name.startswith("llm:"):
        return LLM(name)
    if name == RECORDED:
        raise CraftMDError(f"grader {name!r} is the recorded upstream label; it cannot be re-run")
    raise CraftMDError(f"unknown grader {name!r}; known: {', '.join(sorted(SCORERS))}, llm:PROVIDER/MODEL")


def check_scorers(names: list[str]) -> list[str]:
    """Validate scorer names; returns them de-duplicated, in order."""
    if not names:
        raise CraftMDError("no grader given (paper, strict, offline, llm:PROVIDER/MODEL)")
    out = []
    for n in names:
        get_scorer(n)
        if n not in out:
            out.append(n)
    return out


# -- who grades whom, and whose figure stands on the board ---------------------------------------


def _bare(model: str) -> str:
    """``openai/gpt-4-1106-preview`` -> ``gpt-4-1106-preview`` (the provider says where, not what)."""
    return model.split("/", 1)[1] if "/" in model else model


def family(model: str) -> str:
    """A model's family: its bare name's leading letters (``gpt``, ``llama``, ``mistral``, ``smollm``)."""
    m = re.match(r"[a-z]+", _bare(model).lower().split("/")[-1])
    return m.group(0) if m else _bare(model).lower()


def grades_itself(grader: str, model_under_test: str, doctor_family: str | None = None) -> bool:
    """Whether an LLM grader is the model under test (same model, or the family the run record names)."""
    if not grader.startswith("llm:"):
        return False
    g = grader[4:]
    if _bare(g).lower() == _bare(model_under_test).lower():
        return True
    return doctor_family is not None and family(g) == doctor_family.lower()


@cache
def measured_agreement() -> dict[str, dict]:
    """Each grader's measured agreement with people (the dermatologists' grader validation), where measured."""
    try:
        rec = json.loads(AGREEMENT_FILE.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    out = {}
    for g, d in (rec.get("dermatologists") or {}).items():
        if isinstance(d, dict) and d.get("agreement") is not None:
            out[g] = {"agreement": float(d["agreement"]), "reference": "dermatologists", "trials": d.get("trials")}
    return out


def rank_frq(graders: list[str], *, self_graders: set[str] = frozenset()) -> list[str]:
    """FRQ graders, best first: measured agreement with people (highest first), then unmeasured ones;
    graders that grade their own model last. The first is the one the board shows."""
    agree = measured_agreement()

    def key(g: str):
        measured = g in agree
        return (g in self_graders, not measured, -(agree[g]["agreement"] if measured else 0.0), g)

    return sorted(graders, key=key)


__all__ = [
    "Scorer", "Verdict", "ScoreRows", "Context", "scores_from_grades", "get_scorer", "register_scorer", "SCORERS", "check_scorers", "rank_frq", "grades_itself", "family",
    "measured_agreement", "MCQ_RULES", "MCQ_FORMATS", "RECORDED",
]
