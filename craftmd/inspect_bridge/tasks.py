"""Every craftmd task under ``inspect eval``: one factory, :func:`inspect_task`, for the built-in tasks and task files.

One inspect sample per job of the task's protocol (CRAFT-MD: a case and image flag); an epoch is a trial, seeded
``seed + trial`` as in a release. The solver is the protocol's own ``run_job`` on a runner built with inspect's
models as its roles (``Runner(spec, calls=...)``); the scorers are the package's answer scorers, the history metrics
and, with a ``grader`` role, the paper's LLM grader. A sample's store keeps its release rows, a score's metadata its
score rows, so ``craftmd ingest --inspect`` turns the log into a release with nothing recomputed.
"""

from __future__ import annotations

import math
import os
from functools import cached_property
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset
from inspect_ai.dataset import Sample as InspectSample
from inspect_ai.model import GenerateConfig, Model, ModelOutput, get_model, messages_from_openai
from inspect_ai.scorer import Score, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, TaskState, solver

from craftmd import CraftMDError
from craftmd.generation.runner import GenerateSpec, runner_for
from craftmd.models.base import Completion

from . import STORE_KEY

IMAGE_SUFFIX = "+image"
#: The -T options every task takes, as the spec's fields (text -> value); ``scorers`` is the bridge's own.
COMMON = ("dataset", "config", "cases", "experiments", "prompt_set", "temperature", "top_p", "max_tokens", "seed", "scorers")
#: The sampling every call carries unless the task is told otherwise (craftmd generate's defaults).
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": 0}
#: Where each dataset is when ``-T dataset`` is not given: (environment variable, folder, what makes it).
DATASETS = {"craftmd": ("CRAFTMD_DATASET", "out/data", "make build"), "medpi": ("CRAFTMD_PACKETS", "out/medpi", "make packets")}


def id_list(value) -> list[str] | None:
    """``-T cases=a,b`` (text) or a YAML list → ids; None for all."""
    if value is None or value == "":
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()] or None


def _text(value) -> str:
    """An option's value as the text ``-T`` gave (inspect reads ``-T`` values as YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _number(kind):
    def parse(key: str, value):
        try:
            if isinstance(value, bool) or (kind is int and isinstance(value, float)):
                raise ValueError(value)
            return kind(value)
        except (TypeError, ValueError):
            raise CraftMDError(f"-T {key}={_text(value)}: expected {'a whole number' if kind is int else 'a number'}") from None

    return parse


def _flag(key: str, value) -> bool:
    text = _text(value).lower()
    if text not in ("true", "false", "yes", "no", "1", "0"):
        raise CraftMDError(f"-T {key}={_text(value)}: expected true or false")
    return text in ("true", "yes", "1")


#: -T text -> spec value, for the options every task takes (the task's own go to its options class).
PARSE = {
    "config": lambda k, v: str(v),
    "cases": lambda k, v: id_list(v),
    "prompt_set": lambda k, v: str(v) if v else None,
    "temperature": _number(float),
    "top_p": _number(float),
    "max_tokens": _number(int),
    "seed": _number(int),
    "experiments": lambda k, v: id_list(v),
}


def own_options(task, given: dict) -> dict:
    """The task's own -T options, through its options class (``TASK.parse_options``: unknown keys and bad values are one
    line naming the known ones)."""
    return {"options": task.parse_options({k: _text(v) for k, v in given.items()})}


def dataset_dir(task, value) -> Path:
    """``-T dataset=DIR``, else the task's dataset where ``make`` puts it; one line when there is none."""
    var, folder, make = DATASETS.get(task.dataset, ("CRAFTMD_DATASET", "out/data", "make build"))
    if value:
        path = Path(value)
    elif os.environ.get(var):
        path = Path(os.environ[var])
    else:
        path = Path(folder)
        if not path.exists():  # the checkout's own, from anywhere
            path = Path(__file__).resolve().parents[2] / folder
    if not path.is_dir():
        raise CraftMDError(f"no {task.dataset} dataset at {path} ({make}, or -T dataset=DIR)")
    return path


def spec_for(task, doctor: str, options: dict) -> tuple[GenerateSpec, list[str] | None]:
    """The task's spec from inspect's -T options (one place), and the scorers ``-T scorers=…`` names."""
    given = {k: v for k, v in options.items() if v is not None}
    common = {k: PARSE[k](k, given.pop(k)) for k in COMMON if k in given and k not in ("dataset", "scorers")}
    dataset, scorers = dataset_dir(task, given.pop("dataset", None)), id_list(given.pop("scorers", None))
    spec = GenerateSpec(
        dataset=dataset, out=None, doctor=doctor, task=task.name, progress=False, **common, **own_options(task, given)
    )
    return spec, scorers  # out=None: a runner on given calls writes no release


# --- inspect's models as the protocol's roles ------------------------------------------------------
def as_call(model: Model):
    """An inspect model as a role's call: ``await call(messages, sampling, priority=0) -> Completion``."""

    async def call(messages, sampling, priority: int = 0) -> Completion:
        config = GenerateConfig(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, seed=sampling.seed
        )
        try:
            out = await model.generate(await messages_from_openai(messages), config=config)
        except Exception as exc:  # noqa: BLE001 - a call that failed after inspect's retries is kept as data
            return Completion.failure(type(exc).__name__, " ".join(str(exc).split()))
        usage = out.usage
        tin, tout = (usage.input_tokens, usage.output_tokens) if usage else (0, 0)
        stop = out.stop_reason
        if out.error:
            return Completion.failure("error", out.error, finish_reason=stop, tokens_in=tin, tokens_out=tout)
        text = out.completion
        if stop == "content_filter":
            return Completion(
                text or None,
                "refusal",
                "content_filter",
                tin,
                tout,
                error="content_filter: the server blocked the answer",
                reason="content_filter",
                model=out.model,
            )
        return Completion(text, "ok", stop, tin, tout, model=out.model)

    return call


def role_model(role: str, default: Model | None = None, *, required: bool = False) -> Model | None:
    """The model bound to ``--model-role role=…``; ``default`` when none is (one line when ``required``)."""
    from inspect_ai.model import model_roles

    bound = model_roles().get(role)
    if isinstance(bound, list):
        bound = bound[0] if bound else None
    if bound is None and required:
        raise CraftMDError(f"this task needs a {role}: --model-role {role}=PROVIDER/MODEL")
    return bound if bound is not None else default


def role_models(task, agents: tuple[str, ...]) -> dict[str, Model]:
    """Each role's inspect model: the doctor is the model under test, every other its ``--model-role``, else the
    model of the role it defaults to (``Role.default``; the patient: the model under test)."""
    declared = {r.name: r for r in task.roles}
    models = {"doctor": get_model()}
    for agent in dict.fromkeys(a for a in agents if a != "doctor"):
        role = declared[agent]
        default = role.default or ("doctor" if agent == "patient" else None)  # under inspect the patient is the model under test
        model = role_model(agent, models.get(default) if default else None, required=role.required and default is None)
        if model is not None:
            models[agent] = model
    return models


def task_file_sha256(task) -> str | None:
    """The sha256 of the task file that defines ``task`` (None for a built-in one): what its releases record, so that
    only the same file reads them (:func:`craftmd.release.release_task`)."""
    import hashlib
    import sys

    from craftmd.tasks import TASK_FILES

    if task.name in TASK_FILES:
        return TASK_FILES[task.name][1]
    module = getattr(task.protocol, "__module__", None) or ""
    if module.split(".")[0] == "craftmd":
        return None
    # the file its protocol's methods were compiled from (inspect loads a task file as a module it does not keep)
    own = vars(task.protocol).values() if isinstance(task.protocol, type) else ()
    files = [v.__code__.co_filename for v in own if hasattr(v, "__code__")]
    file = files[0] if files else getattr(sys.modules.get(module), "__file__", None)
    return hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None


def with_trial(job, trial: int):
    """``job`` (a protocol's ``(sample, trial, …)``) for ``trial``."""
    return (job[0], trial, *job[2:])


# --- one task run ------------------------------------------------------------------------------------
class Run:
    """One task run under inspect: the protocol's runner on inspect's models, its jobs (one per sample), the scoring context."""

    def __init__(self, task, options: dict):
        self.task = task
        self.doctor = get_model()
        self.spec, self.scorers = spec_for(task, str(self.doctor), options)
        cls = runner_for(task)
        self.models = role_models(task, tuple(r.name for r in task.roles))
        self.runner = cls(self.spec, calls={a: as_call(m) for a, m in self.models.items()})
        jobs = self.runner.jobs()  # trial 0 of each: a sample; an epoch is a trial
        self.jobs = {self.sample_id(j): j for j in jobs}
        if not jobs:
            raise CraftMDError(self.runner.no_jobs_message())
        if len(self.jobs) != len(jobs):
            raise CraftMDError(f"the {task.name} task poses one sample in several jobs of a trial; inspect runs a job per sample")

    def sample_id(self, job) -> str:
        """The inspect sample a job is: its sample's id, ``+image`` when it poses the image."""
        return self.runner.sample_id(job) + (IMAGE_SUFFIX if len(job) > 2 and job[2] is True else "")

    def samples(self) -> list[InspectSample]:
        out = []
        for sid, job in self.jobs.items():
            s = job[0]
            text = getattr(s, "vignette", None) or (s.get("encounter_reason") if isinstance(s, dict) else None) or sid
            meta = {"case_id": self.runner.sample_id(job), **({"with_image": job[2]} if len(job) > 2 else {})}
            out.append(InspectSample(id=sid, input=text, target=getattr(s, "answer", None) or "", metadata=meta))
        return out

    def keys(self) -> list[str]:
        """Every ``setting/format`` this run can pose (an answer score's dict keys)."""
        settings, formats = getattr(self.runner, "settings", None), getattr(self.runner, "formats", None)
        return [
            f"{e.setting}/{e.format}"
            for e in self.task.experiments
            if (settings is None or e.setting in settings) and (formats is None or e.format in formats)
        ]

    @cached_property
    def context(self):
        from craftmd.scoring.scorers import Context

        # the protocol's options the scorers read (the order the MCQ options were shown in)
        return Context(self.spec.dataset, progress=False, options={"protocol": self.task.protocol_options(self.runner.options)})

    @property
    def sampling(self) -> dict:
        return {k: getattr(self.spec, k) for k in SAMPLING}

    def describe(self) -> dict:
        """What the log's metadata records for ingest: the task, dataset, prompt set, options, sampling (no paths)."""
        r, spec = self.runner, self.spec
        opts = spec.options.model_dump(mode="json")
        if hasattr(r, "settings"):
            opts.update(settings=list(r.settings), formats=list(r.formats))
        config = "packets" if self.task.dataset == "medpi" else spec.config
        return {
            "task": self.task.name,
            "version": self.task.version,  # its comparability version (the release's protocol)
            "task_sha256": task_file_sha256(self.task),
            "config": config,
            "dataset_sha256": getattr(r, "dataset_sha", None),
            "prompt_set": r.prompts.describe(),
            "images": r.shows_images(),  # whether a job shows the doctor a case's image (the protocol's images)
            "sampling": self.sampling,
            "cases": sorted({r.sample_id(j) for j in self.jobs.values()}),
            **opts,
            "doctor_base_url": _base_url(self.doctor),
            "roles": {a: {"model": str(m), "base_url": _base_url(m)} for a, m in self.models.items() if a in r.agents},
        }


def release_rows(state: TaskState) -> dict:
    """The release rows a sample produced (conversations, answers, the task's own tables)."""
    return state.store.get(STORE_KEY) or {"conversations": [], "answers": []}


def _output(rows: dict) -> str:
    """A sample's output as inspect shows it: each answer, else how each conversation ended."""
    if rows.get("answers"):
        return "\n\n".join(
            f"[{a['setting']}/{a['format']}] {a['response'] if a['status'] == 'ok' else a['status']}" for a in rows["answers"]
        )
    return "; ".join(f"{c['conversation']}: {c['ended']}" for c in rows.get("conversations", ()))


def protocol(run: Run):
    """The task's protocol for one job (sample × epoch) as an inspect solver: its rows in the sample's store."""

    @solver(name="protocol")
    def _protocol():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            job = with_trial(run.jobs[str(state.sample_id)], state.epoch - 1)
            made = {**await run.runner.run_job(job), **await run.runner.job_tables(job)}
            rows = {
                name: run.runner.table(name, r).to_pylist() for name, r in made.items()
            }  # the columns a protocol leaves out filled
            state.store.set(STORE_KEY, rows)
            conversations = rows.get("conversations") or []
            if conversations and conversations[0]["messages"]:  # what inspect view shows: the first conversation
                state.messages = await messages_from_openai(conversations[0]["messages"])
            state.output = ModelOutput.from_content(str(run.doctor), _output(rows))
            return state

        return solve

    return _protocol()


# --- the package's scorers ---------------------------------------------------------------------------
def _value(rows: list[dict], keys: list[str]) -> dict[str, float]:
    """A score's value: ``setting/format`` -> the answer's score (NaN where not posed or not produced)."""
    value = dict.fromkeys(keys, math.nan)
    for r in rows:
        if r["value"] is not None:
            value[f"{r['setting']}/{r['format']}"] = r["value"]
    return value


async def _grade(run: Run, grader, name: str, rows: list[dict], out) -> tuple[dict, dict]:
    """The LLM grader's verdicts on ``rows`` into ``out``: (counts, record)."""
    from craftmd.scoring.scorers import llm_verdict

    failures = 0
    for row in rows:
        r = await grader.grade_one(
            row["response"], grader.answer_key(*run.context.cases[(row["case_id"], row["with_image"])][1:])
        )
        out.add(row, name, llm_verdict(r))
        failures += r.failed
    return {"graded": len(rows), "failures": failures}, grader.record()


def answer_scorer(run: Run, name: str, grader: Model | None = None):
    """A package answer scorer (``paper``, ``strict``, ``offline``, a task's own; ``llm:<grader role>``) as an inspect scorer."""
    from craftmd.scoring.llm_grader import LLMGrader
    from craftmd.scoring.scorers import ScoreRows, get_scorer

    pkg = get_scorer(name) if grader is None else None
    formats = pkg.formats if pkg else ("frq",)
    keys = [k for k in run.keys() if k.split("/")[1] in formats]
    llm = LLMGrader(str(grader), call=as_call(grader)) if grader is not None else None  # one per task run

    @scorer(metrics={"*": [mean(), stderr()]}, name="llm" if grader is not None else name)
    def _scorer():
        async def score(state: TaskState, target: Target) -> Score:
            rows = [a for a in release_rows(state).get("answers", []) if a["format"] in formats]
            out = ScoreRows()
            if pkg is not None:
                counts, record = pkg.score(rows, run.context, out), pkg.record()
            else:
                counts, record = await _grade(run, llm, name, rows, out)
            scored = out.table().to_pylist()
            return Score(value=_value(scored, keys), metadata={STORE_KEY: {"rows": scored, "record": record, "counts": counts}})

        return score

    return _scorer()


def _history_rows(run: Run, convs: list[dict]) -> list[dict]:
    """The history metrics' score rows of a sample's conversations (a failed conversation: its metrics failed)."""
    from craftmd.scoring import history as H

    refs = H._references(run.spec.dataset, {(c["case_id"], c["with_image"], c["conversation"]) for c in convs})
    rows = []
    for c in convs:
        key = {k: c[k] for k in ("case_id", "trial", "conversation", "with_image")}
        if c["ended"] == "error":
            rows += [
                dict(key, scorer=H.SCORER, metric=m, value=None, label=None, detail=H._FAILED[1], status=H._FAILED[0])
                for m in H.METRIC_NAMES
            ]
            continue
        msgs = c["messages"]
        for metric, value, detail in H.score_conversation(
            [m["role"] for m in msgs], [m["content"] for m in msgs], refs[(c["case_id"], c["with_image"], c["conversation"])]
        ):
            rows.append(dict(key, scorer=H.SCORER, metric=metric, value=value, label=None, detail=detail, status="ok"))
    return rows


def history_scorer(run: Run):
    """The history metrics (:mod:`craftmd.scoring.history`) of each conversation a sample produced."""
    from craftmd.scoring import history as H

    @scorer(metrics={"*": [mean(), stderr()]}, name=H.SCORER)
    def _scorer():
        async def score(state: TaskState, target: Target) -> Score:
            convs = release_rows(state).get("conversations", [])
            rows = _history_rows(run, convs)
            value = dict.fromkeys(H.METRIC_NAMES, math.nan)
            for r in rows if convs else ():  # the first conversation's (standard or consult): what the log's metrics average
                if r["conversation"] == convs[0]["conversation"] and r["value"] is not None:
                    value[r["metric"]] = r["value"]
            failed = sum(c["ended"] == "error" for c in convs)
            facts = len(
                {(r["trial"], r["conversation"]) for r in rows if r["metric"] == "patient_fact_recall" and r["status"] == "ok"}
            )
            counts = {"conversations": len(convs), "scored": len(convs) - failed, "failed": failed, "with_facts": facts}
            return Score(value=value, metadata={STORE_KEY: {"rows": rows, "record": H.identity(), "counts": counts}})

        return score

    return _scorer()


def scorers(run: Run) -> list:
    """The task's answer scorers (its defaults, or ``-T scorers=…``), the LLM grader with a ``grader`` role, and the
    history metrics where they apply. A scorer of whole conversations or cases runs on the ingested release."""
    from craftmd.scoring.scorers import get_scorer

    names = list(dict.fromkeys(run.scorers or [*run.task.scorers, "history"]))
    history = "history" in names and get_scorer("history").fits(run.task) is None
    answer = [n for n in names if n != "history" and get_scorer(n).unit == "answer"]
    named = [n for n in run.scorers or () if n != "history" and n not in answer]
    if named:
        raise CraftMDError(f"-T scorers: {named[0]} does not score answers; run it with craftmd score on the ingested release")
    grader = role_model("grader")
    if answer or grader is not None:
        run.context.cases  # noqa: B018 - the graders' keys, read now: a dataset that cannot be graded is one line before any call
    out = [answer_scorer(run, n) for n in answer]
    if grader is not None:
        out.append(answer_scorer(run, f"llm:{grader}", grader))
    return out + ([history_scorer(run)] if history else [])


def _base_url(model: Model) -> str | None:
    """Where a model is called (a public URL: no user:password, query or fragment), if it has a server."""
    from craftmd.models.openai import public_url

    url = getattr(model.api, "base_url", None)
    return public_url(str(url)) if url else None


def inspect_task(task, **options) -> Task:
    """The inspect task of a craftmd task (a :class:`craftmd.tasks.Task`, a registered name or a task file), its -T
    ``options`` the spec's: ``dataset``, ``config``, ``cases``, ``prompt_set``, the sampling, ``scorers`` and the task's own."""
    if isinstance(task, (str, Path)):
        from craftmd.tasks import get_task

        task = get_task(str(task))
    run = Run(task, options)
    return Task(
        dataset=MemoryDataset(run.samples(), name=f"{task.dataset}:{run.describe()['config']}"),
        solver=protocol(run),
        scorer=scorers(run),
        config=GenerateConfig(**run.sampling),
        metadata={STORE_KEY: run.describe()},
        version=1,
    )


def builtin(name: str):
    """The inspect task ``craftmd/<name>`` of the built-in task ``name``: :func:`inspect_task` under inspect's ``@task``,
    described as the task describes itself."""
    from craftmd.tasks import get_task

    def make(**options) -> Task:
        return inspect_task(name, **options)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = get_task(name).description
    return task(name=name)(make)


def register_builtin() -> dict:
    """Every built-in task under inspect (``inspect eval craftmd/<name>``), one factory each: name -> its inspect task."""
    from craftmd.tasks import BUILTIN

    return {name: builtin(name) for name in BUILTIN}
