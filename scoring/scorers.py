"""The scorer registry: every way the package turns a release into scores, in one place.

A :class:`Scorer` has a ``name``, the ``unit`` it scores (answer, conversation, case), what it applies to, its metrics,
an ``identity`` and the ``inputs`` it read; :meth:`Scorer.run` returns its rows and records (:class:`ScorerResult`),
which :func:`craftmd.scoring.score.score_release` writes, only for scorers that are stale (:meth:`Scorer.current`, the
one staleness rule). ``craftmd score --list`` lists them; a task's own is added with :func:`register_scorer`, and
:func:`rank_frq` decides once which FRQ grader stands behind a model's free-response figure.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import polars as pl
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.dataset import CRAFTMD, config_file, dataset_fingerprint, load_config
from craftmd.registry import Registry
from craftmd.scoring.families import family, grades_itself
from craftmd.release import ANSWER_VARIANT, CLAIM_PREFIX, SCORE_COLUMNS

MCQ_RULES = ("paper", "strict")
MCQ_FORMATS = ("mcq4", "mcq_many")
RECORDED = "upstream-gpt4"


@dataclass(frozen=True)
class Verdict:
    """One answer's grade: what the scorer resolved, whether it is right, its own record."""

    resolved: str | None
    resolved_kind: str  # single | multiple | none
    correct: bool | None  # None: the score could not be produced (a failed call)
    detail: str | None = None  # the scorer's own JSON object, or None
    error: str | None = None


def llm_verdict(r) -> Verdict:
    """The verdict of one LLM grader's result (:class:`craftmd.scoring.llm_grader.LLMGrader`): a failed call is no
    grade, its error kept."""
    err = json.loads(r.detail).get("error") if r.failed else None
    return Verdict(r.resolved, r.resolved_kind, None if r.failed else r.correct, r.detail, err)


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
SCHEMA = pa.schema(
    [
        SCORE_COLUMNS.field("case_id"),
        SCORE_COLUMNS.field("trial"),
        *ANSWER_VARIANT,
        *[f for f in SCORE_COLUMNS if f.name not in ("case_id", "trial")],
    ]
)


class ScoreRows:
    """Columns of answer-level scores (CRAFT-MD's answer variant keys), filled one score at a time."""

    def __init__(self):
        self.cols = {n: [] for n in SCHEMA.names}

    def score(
        self, row: dict, scorer: str, metric: str, value: float | None, *, label: str | None = None, detail: str | None = None
    ) -> None:
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


@dataclass
class ScorerResult:
    """What every scorer returns (:meth:`Scorer.run`): its score ``rows``, and for each scorer name it writes its
    ``records`` (identity, ``inputs``, counts); ``summary``: what the run reports besides (a judge's calls and cost).
    Only ``craftmd score`` (:func:`craftmd.scoring.score.score_release`) writes them into the release."""

    rows: pa.Table
    records: dict[str, dict]
    summary: dict | None = None


def scores_from_grades(rows: list[dict] | pa.Table) -> pa.Table:
    """Answer-level ``correct`` scores from grade rows of the old shape (case_id, trial, setting, format,
    with_image, grader, resolved, resolved_kind, correct, detail): the one converter, used by tests and
    by anyone holding grades from a schema-1 release."""
    if isinstance(rows, pa.Table):
        rows = rows.to_pylist()
    out = ScoreRows()
    for r in rows:
        correct = r.get("correct")
        out.add(
            r,
            r["grader"],
            Verdict(
                r.get("resolved"), r.get("resolved_kind") or "none", None if correct is None else bool(correct), r.get("detail")
            ),
        )
    return out.table()


#: The dataset configs grading reads.
READS = ("all", "nejm_image", "diagnoses")


def dataset_inputs(dataset_dir: Path | str) -> dict:
    """The dataset part of what a grade depends on (the answers' hash is added where they are written)."""
    return {"dataset_sha256": dataset_fingerprint(dataset_dir, READS)}


def grading_inputs(manifest, dataset_dir: Path | str) -> dict:
    """What a grade depends on besides the grader: the release's answers file and the dataset."""
    return {"answers_sha256": manifest.files["answers.parquet"]["sha256"], **dataset_inputs(dataset_dir)}


def load_cases(dataset_dir: Path | str) -> tuple[dict[tuple[str, bool], tuple[list[str], str, str | None]], list[str]]:
    """``{(case_id, with_image): (choices, answer, paper_answer)}`` and the many-choice option list.

    ``paper_answer`` is the key the ``paper`` MCQ rule matches (upstream's recorded
    ``correct_ans``, verbatim); ``strict`` and the FRQ graders use ``answer``. NEJM image
    cases have no choices and no paper key.
    """
    cases: dict[tuple[str, bool], tuple[list[str], str, str | None]] = {}
    ds = load_config(dataset_dir, "all")
    if "paper_answer" not in ds.columns:
        raise CraftMDError(
            f"{dataset_dir}: the dataset has no paper_answer column (built by an older craftmd); rebuild it with craftmd build"
        )
    for cid, ch, ans, key in ds.select("case_id", "choices", "answer", "paper_answer").iter_rows():
        cases[(cid, False)] = (list(ch or []), ans, key)
    if config_file(dataset_dir, "nejm_image").exists():
        nj = pl.read_parquet(config_file(dataset_dir, "nejm_image"), columns=["case_id", "answer"])
        for cid, ans in nj.iter_rows():
            cases[(cid, True)] = ([], ans, None)
    many: list[str] = []
    if config_file(dataset_dir, "diagnoses").exists():
        many = load_config(dataset_dir, "diagnoses")["diagnosis"].to_list()
    return cases, many


@dataclass
class Context:
    """What a scorer needs besides the release: the dataset, the model layer's settings, its options.

    ``options`` holds what a scorer reads of its own (a judge's ``mode``, ``dimensions``, ...; the
    call settings ``concurrency``, ``max_retries``, ``timeout``; ``workers`` of the history metrics; ``protocol``: the
    scored run's protocol options, :attr:`craftmd.release.Protocol.options`, which the MCQ rules read the order of the
    options from).
    """

    dataset_dir: Path | None = None
    base_url: str | None = None
    cache: object = None
    progress: bool = True
    allow_self: bool = False  # an LLM grader or judge may score its own model (recorded; never ranked by)
    options: dict = field(default_factory=dict)

    def dataset(self, scorer: str) -> Path:
        if self.dataset_dir is None:
            raise CraftMDError(f"scorer {scorer} needs the built dataset (--dataset DIR)")
        return Path(self.dataset_dir)

    @cached_property
    def answer_keys(self) -> tuple[dict, list[str]]:
        return load_cases(self.dataset("an answer scorer"))

    @property
    def cases(self) -> dict:
        """``{(case_id, with_image): (choices, answer, paper_answer)}`` (:func:`load_cases`)."""
        return self.answer_keys[0]

    @property
    def many(self) -> list[str]:
        """The many-choice options (the dataset's diagnoses config)."""
        return self.answer_keys[1]


def answer_formats(release, *, images: bool = True) -> set[str]:
    """The answer formats a release holds (of text cases only, without ``images``)."""
    t = release.table("answers", columns=["format", "with_image"])
    if not images:
        t = t.filter(pa.compute.invert(t.column("with_image")))
    return set(t.column("format").unique().to_pylist())


#: What a scorer scores, and the release table that holds it (a case scorer reads the dataset).
UNITS = {"answer": "answers", "conversation": "conversations", "case": None}


class Scorer:
    """One way of scoring a release: subclass it, set the class attributes, write :meth:`run`
    (an answer scorer: :meth:`score`), and register it with :func:`register_scorer`."""

    name: str
    unit: str = "answer"  # answer | conversation | case
    formats: tuple[str, ...] = ()  # an answer scorer: the answer formats it scores
    #: the datasets whose cases it reads (their answer keys, texts, configs): it scores the releases of any task that poses
    #: them (None: any dataset's)
    datasets: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = (
        None  # a task's own scorer: the tasks whose releases it scores (None: any release with its unit's table)
    )
    metrics: tuple[str, ...] = ("correct",)
    calls_model: bool = False
    about: str = ""  # one line for `craftmd score --list`
    #: Record keys counting failed calls a re-run would ask again (the request cache never stores a failure).
    retry_keys: tuple[str, ...] = ("failures", "transient_failures")

    def identity(self) -> dict | None:
        """What the release records about the scorer; None when its scores cannot be re-derived (always re-run)."""
        return None

    def writes(self) -> tuple[str, ...]:
        """The scorer names its rows and records carry."""
        return (self.name,)

    def fits(self, task) -> str | None:
        """Why the scorer does not score the releases of ``task`` (a :class:`craftmd.tasks.Task`) at all, by what it
        reads (a short reason), or None when it may."""
        if self.tasks is not None and task.name not in self.tasks:
            return f"not a release of {', '.join(self.tasks)} (task {task.name})"
        if self.datasets is not None and task.dataset not in self.datasets:
            return f"not a release of {', '.join(self.datasets)}'s cases (task {task.name} poses {task.dataset}'s)"
        if self.formats and not set(self.formats) & set(task.formats):
            return f"no {'/'.join(self.formats)} answers in task {task.name}"
        return None

    def applies(self, release) -> str | None:
        """Why the scorer does not apply to ``release`` (a short reason), or None when it does."""
        why = self.fits(release.task)
        if why is not None:
            return why
        table = UNITS[self.unit]
        if table and not release.has(table):
            return f"no {table}.parquet"
        if table and not release.rows(table):  # a run of settings without a conversation (vignette): nothing to score
            return f"no {table} (its {table}.parquet is empty)"
        if self.formats and not set(self.formats) & answer_formats(release):
            return f"no {'/'.join(self.formats)} answers"
        return None

    def inputs(self, release, ctx: Context) -> dict:
        """The hashes of what the scores are made from: the release's scored file and the dataset configs read."""
        return grading_inputs(release.manifest, ctx.dataset(self.name))

    def expected(self, release, ctx: Context) -> dict[str, dict] | None:
        """What the release's records must hold for the scores to be current: for each scorer name it writes, its
        identity now (None: scores that cannot be re-derived, always made again)."""
        ident = self.identity()
        return None if ident is None else {name: ident for name in self.writes()}

    def pinned(self, record: dict) -> dict:
        """The part of a record that :meth:`expected` is compared with (a judge leaves out what happened, such as the
        response format the server accepted)."""
        return record

    def current(self, release, ctx: Context) -> bool:
        """The one staleness rule: the release holds a record for every name the scorer writes, each with the
        identity expected now, the inputs it would read now, and no failed call a re-run would ask again; then
        running it again could not change the scores."""
        want = self.expected(release, ctx)
        if want is None:
            return False
        inputs = self.inputs(release, ctx)
        records = release.scorer_records()
        for name, ident in want.items():
            rec = records.get(name)
            if rec is None or rec.get("inputs") != inputs or any(rec.get(k) for k in self.retry_keys):
                return False
            held = self.pinned(rec)
            if any(held.get(k) != v for k, v in ident.items()):
                return False
        return True

    def check(self, release, ctx: Context) -> None:
        """Refuse, with one line, what the scorer must not run on ``release`` (checked for every scorer before any runs)."""

    def run(self, release, ctx: Context) -> ScorerResult:
        """Score ``release``: its rows and each written scorer name's record, its ``inputs`` included. This one runs an
        answer scorer's :meth:`score` over the release's answers of its formats; a conversation or case scorer writes
        its own."""
        if self.unit != "answer":
            raise NotImplementedError(f"scorer {self.name}: a {self.unit} scorer writes its own run()")
        answers = pl.from_arrow(release.table("answers"))
        check_answer_cases(answers, ctx)
        out = ScoreRows()
        counts = self.score(answers.filter(pl.col("format").is_in(self.formats)).to_dicts(), ctx, out)
        return ScorerResult(out.table(), {self.name: dict(self.record(), **counts, inputs=self.inputs(release, ctx))})

    def score(self, rows: list[dict], ctx: Context, out: ScoreRows) -> dict:
        """An answer scorer: score answer ``rows`` of its formats into ``out`` (a new one each run, made into the
        result's rows by :meth:`run`); returns what its record adds to :meth:`record` (counts)."""
        raise NotImplementedError

    def estimate(self, release, ctx: Context) -> dict | None:
        """What a run would send (calls, tokens) without sending it; None for a scorer that calls no model."""
        return None

    def record(self) -> dict:
        return dict(self.identity() or {})


class McqRule(Scorer):
    formats = MCQ_FORMATS
    datasets = (CRAFTMD.name,)  # its answer keys and options

    def __init__(self, rule: str):
        self.name = rule
        self.about = (
            "the published MCQ rule: right when the recorded key's text appears in the answer"
            if rule == "paper"
            else "the strict MCQ rule: the answer must resolve to exactly one option, the dataset's answer"
        )

    def applies(self, release):
        why = super().applies(release)
        if why is None and not set(self.formats) & answer_formats(release, images=False):
            return "MCQ answers of image cases only (no options to match)"
        return why

    def identity(self) -> dict:
        from craftmd.scoring.mcq import RULES_VERSION

        return {"rule": self.name, "rules_version": RULES_VERSION}

    def run(self, release, ctx):
        import copy

        from craftmd.release import protocol_of

        # the order the release's questions showed their options in (-T answer_order): a letter names one of those
        protocol = protocol_of(release.manifest)
        ctx = copy.copy(ctx)  # (the dataset it has read stays read)
        ctx.options = {**ctx.options, "protocol": dict(protocol.options) if protocol is not None else {}}
        return super().run(release, ctx)

    def score(self, rows, ctx, out):
        from tqdm import tqdm

        from craftmd.scoring.mcq import grade_mcq
        from craftmd.answer_order import release_order, shown

        order, seed = release_order(ctx.options.get("protocol"))  # the run's protocol options (inspect: its -T options)
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
            choices = shown(choices, row["case_id"], row["trial"], row["format"], order, seed)
            out.add(row, self.name, Verdict(*grade_mcq(row["response"], choices, answer, self.name)))
            n += 1
        return {"graded": n}


class Offline(Scorer):
    name = "offline"
    formats = ("frq", "top3")
    datasets = (CRAFTMD.name,)  # its answer keys
    about = "the offline FRQ grader: synonym table and matching rules, no model"

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
    datasets = (CRAFTMD.name,)  # its answer keys
    calls_model = True
    pattern = "llm:PROVIDER/MODEL"
    about = "the paper's two-step grader-AI through any chat model (never its own model unless --allow-self)"
    retry_keys = ("failures",)

    def __init__(self, name: str):
        from craftmd.scoring.llm_grader import parse_grader_name

        self.name = name
        self.model = parse_grader_name(name)

    def identity(self) -> dict:
        """The model, its prompts and sampling (the default prompt set): a release graded with them, no call failed, is
        current."""
        from craftmd.scoring.llm_grader import grader_record

        return grader_record(self.model)

    @staticmethod
    def prompt_set(ctx: Context) -> str:
        """The grader's prompt set: the option ``grader_prompts`` (``craftmd score --grader-prompts``), else the default."""
        from craftmd.scoring.llm_grader import PROMPT_SET, check_prompt_set

        return check_prompt_set(ctx.options.get("grader_prompts") or PROMPT_SET)

    def expected(self, release, ctx):
        from craftmd.scoring.llm_grader import grader_record

        return {self.name: grader_record(self.model, self.prompt_set(ctx))}

    def check(self, release, ctx):
        if self_graders(release.manifest, [self.name]) and not ctx.allow_self:
            raise CraftMDError(
                f"grader {self.name} would grade its own model ({release.manifest.model}); "
                "pick another grader, or pass --allow-self (the page then marks it and never ranks by it)"
            )

    def run(self, release, ctx):
        self.check(release, ctx)
        result = super().run(release, ctx)
        if self_graders(release.manifest, [self.name]):
            result.records[self.name]["self_graded"] = True
        return result

    def score(self, rows, ctx, out):
        """The grades, and what the record adds: the model's record, where it was called, the counts."""
        from craftmd.scoring.llm_grader import LLMGrader

        retries = ctx.options.get("max_retries")
        lg = LLMGrader(
            self.model,
            base_url=ctx.base_url,
            cache=ctx.cache,
            max_retries=6 if retries is None else retries,
            prompt_set=self.prompt_set(ctx),
        )
        pairs = [(row["response"], lg.answer_key(*ctx.cases[(row["case_id"], row["with_image"])][1:])) for row in rows]
        results = lg.grade_many(pairs, progress=ctx.progress)
        for row, r in zip(rows, results):
            out.add(row, self.name, llm_verdict(r))
        record = lg.record()
        if ctx.base_url or lg.server.get("service"):  # where it was called: a public URL, never a user:password or query
            record.update({k: v for k, v in lg.server.items() if v is not None})
        asked = sum(map(lg.asks, (p[0] for p in pairs)))  # answers sent to the model (the others need no call)
        unlisted = getattr(getattr(lg.caller, "counters", None), "unlisted", 0)  # the server lists no models
        if unlisted:
            record["model_named_by_reply_only"] = unlisted
        return dict(record, graded=len(rows), asked=asked, failures=sum(r.failed for r in results))


class Recorded(Scorer):
    """Labels recorded upstream: ingest writes them; they cannot be re-run."""

    name = RECORDED
    formats = ("frq",)
    datasets = (CRAFTMD.name,)
    about = "the GPT-4 grader-AI's labels recorded upstream (written by ingest; cannot be re-run)"


class ModuleScorer(Scorer):
    """A conversation scorer whose rules live in one module (imported when first used: its libraries are heavy), with its
    ``METRIC_NAMES``, ``identity()`` and ``inputs(release, dataset_dir)``; :meth:`scores` runs it."""

    unit = "conversation"
    module = ""

    @property
    def rules(self):
        return importlib.import_module(self.module)

    @property
    def metrics(self):
        return self.rules.METRIC_NAMES

    def identity(self):
        return self.rules.identity()

    def inputs(self, release, ctx):
        return self.rules.inputs(release, ctx.dataset(self.name))

    def scores(self, release, ctx) -> tuple[pa.Table, dict]:
        """The module's scores of ``release`` and their counts (the conversations, those scored and failed, ...)."""
        raise NotImplementedError

    def run(self, release, ctx):
        table, counts = self.scores(release, ctx)
        return ScorerResult(table, {self.name: dict(self.identity(), **counts, inputs=self.inputs(release, ctx))})


class History(ModuleScorer):
    name = "history"
    module = "craftmd.scoring.history"
    datasets = (CRAFTMD.name,)  # its vignettes, histories and MediQ facts
    about = "history taking without a model: ROUGE coverage of what the patient held, MediQ facts, turns, question diversity"

    def fits(self, task):
        """Only on a task with conversations the doctor opens: it reads them after the doctor's fixed opening line
        (:func:`craftmd.scoring.history.split_turns`), never a conversation that opens with the patient's request."""
        why = super().fits(task)
        if why is None and not set(task.conversations) - set(task.patient_led):
            return f"no conversation the doctor opens in task {task.name}"
        return why

    def scores(self, release, ctx):
        return self.rules.history_scores(
            release, ctx.dataset(self.name), workers=ctx.options.get("workers"), progress=ctx.progress
        )


class KeyInfo(ModuleScorer):
    name = "keyinfo"
    module = "craftmd.scoring.keyinfo"
    datasets = (CRAFTMD.name,)  # its keyinfo config
    about = "ROUGE-1 of the doctor's turns against the case's keys and of the patient's against its values (the keyinfo config)"

    def scores(self, release, ctx):
        return self.rules.keyinfo_scores(release, ctx.dataset(self.name))


class Judges(Scorer):
    """``judge:<provider/model>``: MedPI's rubric judge; the judges named in one run form one committee."""

    unit = "conversation"
    metrics = ("rubric_score", "judge_flag")
    calls_model = True
    pattern = "judge:PROVIDER/MODEL"
    about = (
        "MedPI's rubric judge over whole conversations, 1-4 per dimension that applies; several judges: "
        "also judge-committee, their median"
    )

    retry_keys = ("transient_failures",)

    def __init__(self, models: list[str], spec=None):
        from craftmd.models import parse_name

        for m in models:
            parse_name(m)
        self.models = list(dict.fromkeys(models))
        self.name = "judge:" + self.models[0] if len(self.models) == 1 else "judge-committee"
        self._spec = spec  # a JudgeSpec given whole (judges_stale), else made from the context
        self._units: tuple | None = None  # (release, its units): the conversations read once

    @classmethod
    def parse(cls, name: str) -> Judges:
        if "/" not in name[len("judge:") :]:
            raise CraftMDError(f"scorer {name!r}: expected judge:PROVIDER/MODEL, e.g. judge:openai/gpt-4o")
        return cls([name[len("judge:") :]])

    def spec(self, ctx: Context):
        from dataclasses import fields

        from craftmd.scoring.judge import JudgeSpec

        if self._spec is not None:
            return self._spec
        known = {f.name for f in fields(JudgeSpec)} - {"models", "base_url", "cache", "force", "progress"}
        return JudgeSpec(
            models=self.models,
            base_url=ctx.base_url,
            cache=ctx.cache,
            force=ctx.allow_self,
            progress=ctx.progress,
            **{k: v for k, v in ctx.options.items() if k in known and v is not None},
        )

    def writes(self):
        """``judge:MODEL`` per judge (``#seedK`` added with ``seeds`` > 1) and, for several, ``judge-committee``."""
        return tuple(f"judge:{m}" for m in self.models) + (("judge-committee",) if len(self.models) > 1 else ())

    def _selection(self, ctx: Context) -> tuple[list[str] | None, list[str] | None]:
        return ctx.options.get("conversations"), ctx.options.get("cases")

    def units(self, release, ctx: Context) -> list:
        """The release's conversations to judge (:func:`craftmd.scoring.judge.read_units`), read once per release."""
        from craftmd.scoring.judge import read_units

        if self._units is None or self._units[0] is not release:
            conversations, cases = self._selection(ctx)
            packet = self.spec(ctx).flags is not None
            units = read_units(release, ctx.dataset_dir, conversations=conversations, cases=cases, packet=packet)
            self._units = (release, units)
        return self._units[1]

    def check(self, release, ctx):
        from craftmd.scoring.judge import check_own_family

        check_own_family(release, self.spec(ctx))

    def expected(self, release, ctx):
        """Each judge's settings as asked (catalog, prompts, mode, model, server, sampling, dimensions) and, for a
        committee, its members."""
        from craftmd.scoring.judge import Judge, MemberState, pinned

        spec = self.spec(ctx)
        judge = Judge(spec)
        want = {m.name: pinned(judge.identity(MemberState(m, spec.response_format))) for m in judge.members}
        if len(judge.members) > 1:
            want["judge-committee"] = {"members": [m.name for m in judge.members]}
        return want

    def pinned(self, record):
        from craftmd.scoring.judge import pinned

        return pinned(record)

    def inputs(self, release, ctx):
        """The conversations file, the objectives judged by and the selection (:func:`craftmd.scoring.judge.run_inputs`)."""
        from craftmd.scoring.judge import run_inputs

        return run_inputs(release, self.units(release, ctx), *self._selection(ctx))

    def run(self, release, ctx):
        """The judges' scores and records, and the run's summary (calls, tokens, cost); the family check is
        :meth:`check`'s, done by ``craftmd score`` before any scorer runs."""
        from craftmd.scoring.judge import judge_units

        table, records, summary = judge_units(release, self.spec(ctx), self.units(release, ctx), self.inputs(release, ctx))
        return ScorerResult(table, records, summary)

    def estimate(self, release, ctx):
        from craftmd.scoring.judge import Judge

        return {"release": release.id, **Judge(self.spec(ctx)).estimate(self.units(release, ctx))}


class Meld(Scorer):
    """MELD of the release's own model (its doctor): per case of the dataset's text configs, how nearly the model
    writes the second half of the vignette from the first (:func:`craftmd.scoring.meld.run_meld`, the paper's rules)."""

    name = "meld"
    unit = "case"
    metrics = ("meld_similarity", "meld_flagged")
    calls_model = True
    about = (
        "contamination (MELD) of the release's own model: 1 - normalised edit distance of its completion of each "
        "vignette's first half to the true second half; flagged at >= 0.95"
    )

    @staticmethod
    def model(release) -> str:
        return (release.manifest.roles.get("doctor") or {}).get("model") or release.manifest.model

    def settings(self, release, ctx: Context) -> dict:
        from craftmd.scoring.meld import PROMPT_SET, check_prompt_set

        o = ctx.options
        return dict(
            temperature=o.get("temperature", 0.0),
            max_tokens=o.get("max_tokens") or 1024,
            seed=o.get("seed", 0),
            concurrency=o.get("concurrency", 8),
            cases=o.get("cases"),
            prompt_set=check_prompt_set(o.get("meld_prompts") or PROMPT_SET),
        )

    def configs(self, ctx: Context) -> tuple[str, ...]:
        """MELD's per-source configs that the dataset has."""
        from craftmd.dataset import config_file
        from craftmd.scoring.meld import DEFAULT_CONFIGS

        return tuple(c for c in DEFAULT_CONFIGS if config_file(ctx.dataset(self.name), c).exists())

    def expected(self, release, ctx):
        from craftmd.models import Sampling
        from craftmd.scoring.meld import SIMILARITY_DEFINITION, THRESHOLD, prompt_record

        s = self.settings(release, ctx)
        sampling = Sampling(temperature=s["temperature"], top_p=1.0, max_tokens=s["max_tokens"], seed=s["seed"]).to_dict()
        return {
            self.name: {
                "prompt": prompt_record(s["prompt_set"]),
                "sampling": sampling,
                "split": "chars",
                "similarity": SIMILARITY_DEFINITION,
                "threshold": THRESHOLD,
            }
        }

    def inputs(self, release, ctx) -> dict:
        configs, cases = self.configs(ctx), ctx.options.get("cases")
        return {
            "model": self.model(release),
            "configs": list(configs),
            "dataset_sha256": dataset_fingerprint(ctx.dataset(self.name), configs),
            "cases": sorted(cases) if cases else "all",
        }

    def run(self, release, ctx):
        from craftmd.scoring.meld import SCORER, meld, scorer_record, to_scores

        s = self.settings(release, ctx)
        cases, summary = meld(
            ctx.dataset(self.name),
            self.model(release),
            base_url=ctx.base_url,
            cache=ctx.cache,
            configs=self.configs(ctx),
            cases=s["cases"],
            temperature=s["temperature"],
            max_tokens=s["max_tokens"],
            seed=s["seed"],
            concurrency=s["concurrency"],
            progress=ctx.progress,
            prompt_set=s["prompt_set"],
        )
        record = scorer_record(summary)
        record.pop("dataset")
        failures = cases.filter(pl.col("similarity").is_null()).height
        record.update(cases=cases.height, failures=failures, inputs=self.inputs(release, ctx))
        return ScorerResult(to_scores(cases), {SCORER: record})


#: name -> factory; ``llm:<provider/model>`` and ``judge:<provider/model>`` names are made by :data:`PATTERNS`.
SCORERS: Registry = Registry("scorer")
SCORERS.update(
    {
        "paper": lambda: McqRule("paper"),
        "strict": lambda: McqRule("strict"),
        "offline": Offline,
        "history": History,
        "keyinfo": KeyInfo,
        "meld": Meld,
    }
)
#: name prefix -> the class that makes a scorer of a name with it.
PATTERNS = {"llm:": LLM, "judge:": Judges.parse}


def register_scorer(name: str, factory) -> None:
    """Add a scorer (a task's own): ``factory()`` returns a :class:`Scorer` whose ``name`` is ``name``."""
    if name in (RECORDED, "judge-committee") or name.startswith((*PATTERNS, CLAIM_PREFIX)):
        raise CraftMDError(f"scorer name {name!r} is reserved")
    SCORERS.register(name, factory)


def known() -> str:
    return ", ".join([*sorted(SCORERS), "llm:PROVIDER/MODEL", "judge:PROVIDER/MODEL"])


def get_scorer(name: str) -> Scorer:
    """The scorer called ``name`` (``paper``, ``strict``, ``offline``, ``history``, ``keyinfo``, ``meld``,
    ``llm:PROVIDER/MODEL``, ``judge:PROVIDER/MODEL``, or a registered one)."""
    if name in SCORERS:
        return SCORERS[name]()
    for prefix, make in PATTERNS.items():
        if name.startswith(prefix):
            return make(name)
    if name == RECORDED:
        raise CraftMDError(f"scorer {name!r} is the recorded upstream label; it cannot be re-run")
    if name.startswith(CLAIM_PREFIX):
        raise CraftMDError(
            f"scorer {name!r} holds the scores an ingested log claimed; run {name.removeprefix(CLAIM_PREFIX)!r} to compute them"
        )
    raise CraftMDError(f"unknown scorer {name!r}; known: {known()}")


def check_scorers(names: list[str]) -> list[str]:
    """Validate scorer names; returns them de-duplicated, in order."""
    if not names:
        raise CraftMDError(f"no scorer given ({known()})")
    out = []
    for n in names:
        get_scorer(n)
        if n not in out:
            out.append(n)
    return out


def scorers(names: list[str]) -> list[Scorer]:
    """The scorers called ``names``, in order; the judges among them made one committee (in the first judge's place)."""
    out: list[Scorer] = []
    judges: list[str] = []
    for n in check_scorers(names):
        s = get_scorer(n)
        if isinstance(s, Judges):
            if not judges:
                out.append(s)
            judges += s.models
        else:
            out.append(s)
    return [Judges(judges) if isinstance(s, Judges) else s for s in out]


def listing() -> list[dict]:
    """Every registered scorer: its name, unit, what it applies to, the metrics it writes, whether it calls a model."""
    import craftmd.tasks  # noqa: F401  (the built-in tasks register their scorers' tasks)

    rows = []
    entries = [(n, SCORERS[n]()) for n in sorted(SCORERS)] + [(c.pattern, c) for c in (LLM, Judges)] + [(RECORDED, Recorded)]
    for name, s in entries:
        rows.append(
            {
                "scorer": name,
                "unit": s.unit,
                "tasks": list(s.tasks) if s.tasks else "any",
                "datasets": list(s.datasets) if s.datasets else "any",
                "formats": list(s.formats),
                "metrics": list(s.metrics),
                "calls_model": s.calls_model,
                "about": s.about,
            }
        )
    return rows


# -- who grades whom, and whose figure stands on the board ---------------------------------------


def rank_frq(graders: list[str], *, self_graders: set[str] = frozenset()) -> list[str]:
    """FRQ graders, best first: measured agreement with people (highest first), then unmeasured ones;
    graders that grade their own model last. The first is the one the board shows."""
    from craftmd.scoring.measured import measured_agreement

    agree = measured_agreement()

    def key(g: str):
        measured = g in agree
        return (g in self_graders, not measured, -(agree[g]["agreement"] if measured else 0.0), g)

    return sorted(graders, key=key)


def judges_stale(
    release_dir: Path | str,
    spec,
    *,
    dataset_dir: Path | str | None = None,
    conversations: list[str] | None = None,
    cases: list[str] | None = None,
) -> bool:
    """Whether judging ``release_dir`` with ``spec`` could change its scores: a judge's record missing, made from other
    inputs (conversations, objectives, selection), by another catalog, prompt set or setting, or with transient failures
    a re-run would ask again (the one staleness rule of :meth:`craftmd.scoring.scorers.Scorer.current`)."""
    from craftmd.release import read_release

    ctx = Context(None if dataset_dir is None else Path(dataset_dir), options={"conversations": conversations, "cases": cases})
    return not Judges(spec.models, spec=spec).current(read_release(release_dir), ctx)


def check_answer_cases(answers: pl.DataFrame, ctx: Context) -> None:
    """A one-line error when an answer's case is not in the dataset."""
    unknown = sorted({c for c, w in answers.select("case_id", "with_image").iter_rows() if (c, w) not in ctx.cases})
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CraftMDError(f"answer for case {unknown[0]}{more} not in the dataset at {ctx.dataset_dir}")


def self_graders(manifest, graders: list[str]) -> list[str]:
    """Those of ``graders`` that would grade the release's own model."""
    doctor = manifest.roles.get("doctor") or {}
    fam = doctor.get("family")
    models = {manifest.model, doctor.get("model") or manifest.model}
    return [g for g in graders if any(grades_itself(g, m, fam) for m in models)]


__all__ = [
    "Scorer",
    "Verdict",
    "ScoreRows",
    "Context",
    "scores_from_grades",
    "get_scorer",
    "register_scorer",
    "SCORERS",
    "check_scorers",
    "scorers",
    "listing",
    "UNITS",
    "rank_frq",
    "grades_itself",
    "family",
    "load_cases",
    "judges_stale",
    "dataset_inputs",
    "grading_inputs",
    "check_answer_cases",
    "self_graders",
    "MCQ_RULES",
    "MCQ_FORMATS",
    "RECORDED",
]
