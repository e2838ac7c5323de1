"""``craftmd generate``: run the CRAFT-MD experiments for a model and write a release.

One job per (case, trial, image flag): the standard conversation, the history-only
conversation where the exam set-ups ask for it, the summary, and every selected
(setting, format) question. Jobs run side by side under asyncio; inside a job the
turns of a conversation run in order and the questions that only need the case run
at once. Every request goes through a :class:`~craftmd.models.calls.Caller`
(cache, bounded concurrency, capped retries), so a killed run resumes without
repeating a finished call and a re-run over a full cache writes the same bytes.

Every failed request keeps its reason in the release (the ``error`` column of
conversations and answers; an answer that could not be asked because its conversation
or summary failed carries that failure's reason). The progress bar moves per request;
it, the end summary and the manifest read one set of counts (:class:`Counts`).
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import queue
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from craftmd import CraftMDError
from craftmd.dataset import config_file, load_config
from craftmd.atomic import sha256_file
from craftmd.release import ANSWERS_SCHEMA, CONVERSATIONS_SCHEMA, Manifest, write_release

from craftmd.models.calls import Caller, Counts
from craftmd.models.connect import CallSettings, Connections, check_names
from craftmd.models.pool import in_conversation
from craftmd.models import Sampling, parse_name
from craftmd.samples import Sample, load_samples
from craftmd.tasks import Task
from craftmd.tasks.diagnosis import TASK

from .shards import in_shard, mark
from .protocol import DEFAULT_PROMPT_SET, Conversation, PromptSet, Protocol

#: The settings read from the standard conversation, and from the history-only one (the task's matrix says).
CONVERSATION_SETTINGS = tuple(dict.fromkeys(e.setting for e in TASK.experiments if e.conversation == "standard"))
NO_EXAM_SETTINGS = tuple(dict.fromkeys(e.setting for e in TASK.experiments if e.conversation == "no_exam"))
AGENTS = ("doctor", "patient", "summarizer")


def default_cache() -> Path:
    """``$CRAFTMD_CACHE/requests.sqlite`` (default ``~/.cache/craftmd``), beside the source download cache."""
    from craftmd.source import cache_dir

    return cache_dir() / "requests.sqlite"


@dataclass
class GenerateSpec:
    dataset: Path
    out: Path
    doctor: str
    patient: str
    summarizer: str | None = None
    solver: str | None = None  # the consultation task's fixed solver
    task: str = "craftmd"  # craftmd (CRAFT-MD's protocol) or consultation (generation.consult)
    config: str = "all"
    cases: list[str] | None = None
    trials: int = 1
    experiments: list[str] | None = None
    max_turns: int = 60
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    base_url: str | None = None  # openai/ models' server (openai-api/<service>/ models read <SERVICE>_BASE_URL)
    api_key: str | None = None  # used for the calls, never recorded
    concurrency: int = 32  # requests in flight per server (shared out among worker processes)
    server_concurrency: dict[str, int] = field(default_factory=dict)  # per service ('openai' for openai/ models)
    workers: int = 1  # processes; the client's per-request CPU, not the server, bounds a fast local server
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    price: tuple[float, float] | None = None  # USD per million tokens in, out
    cache: Path | None = None
    prompt_set: str | None = None  # default: the task's own (craftmd-v1; consult-v1)
    shard: tuple[int, int] | None = None  # (k, K): only the samples of shard k of K (generation.shards) [scale]
    overwrite: bool = False
    progress: bool = True


def throttled(fn, interval: float = 0.1):
    """``fn`` as a tick that runs it at most once per ``interval`` seconds (the bar needs no more)."""
    last = [-interval]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= interval:
            last[0] = now
            fn()

    return tick


#: The one-line counts shown by the progress bar (the summary spells the same numbers out).
def progress_text(c: Counts, answers_done: int, answers_total: int) -> str:
    return (f"answers {answers_done}/{answers_total} sent={c.calls} cached={c.cache_hits} dedup={c.deduplicated} "
            f"retries={c.retries} fail={c.failures} tok_in={c.tokens_in:,} tok_out={c.tokens_out:,}")


@dataclass
class GenerateReport:
    path: Path
    conversations: int
    answers: int
    answer_status: dict
    tallies: dict[str, Counts]  # per agent
    counts: Counts  # the whole run: the tallies summed, with the callers' retries and peak in flight
    wall_s: float
    failed_conversations: int = 0
    cost: float | None = None
    notes: tuple[str, ...] = ()  # lines the task adds to the summary

    # The run's counts by name (tests, benchmarks and the summary read these).
    requests = property(lambda self: self.counts.requests)
    calls = property(lambda self: self.counts.calls)
    cache_hits = property(lambda self: self.counts.cache_hits)
    deduplicated = property(lambda self: self.counts.deduplicated)
    retries = property(lambda self: self.counts.retries)
    failures = property(lambda self: self.counts.failures)
    peak_in_flight = property(lambda self: self.counts.peak_in_flight)
    batches = property(lambda self: self.counts.batches)

    def summary(self) -> str:
        c = self.counts
        lines = [
            f"release      {self.path}",
            f"produced     {self.conversations} conversations ({self.failed_conversations} failed), {self.answers} answers "
            + "(" + ", ".join(f"{k} {v}" for k, v in sorted(self.answer_status.items())) + ")",
            f"requests     {c.requests}: {c.calls} sent, {c.cache_hits} from cache, {c.deduplicated} deduplicated "
            f"(identical to one in flight); {c.retries} retries, peak {c.peak_in_flight} in flight, {self.wall_s:.1f} s",
        ]
        if c.failures:
            lines.append(f"failed       {c.failures} requests (reasons in the error column of answers.parquet and conversations.parquet):")
            for label, n in sorted(c.reasons.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"             {n:>6} × {label}")
        else:
            lines.append("failed       0 requests")
        lines.append("tokens       agent        requests    in            out")
        for agent, t in self.tallies.items():
            lines.append(f"             {agent:<12} {t.requests:>8}    {t.tokens_in:>12,}  {t.tokens_out:>12,}")
        lines.append(f"             {'total':<12} {c.requests:>8}    {c.tokens_in:>12,}  {c.tokens_out:>12,}")
        lines += list(self.notes)
        if self.cost is not None:
            lines.append(f"cost         ${self.cost:,.2f} at the given price per million tokens (all agents, whole release)")
        return "\n".join(lines)


# --- input ------------------------------------------------------------------------------
def parse_experiments(names: list[str] | None, task: Task = TASK) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``multiturn,frq`` → (settings, formats); a name may be a setting, a format or setting:format."""
    if not names:
        return task.settings, task.formats
    settings, formats = [], []
    for raw in names:
        for part in raw.split(":"):
            part = part.strip()
            if part in task.settings:
                settings.append(part)
            elif part in task.formats:
                formats.append(part)
            else:
                raise CraftMDError(f"unknown experiment {part!r}; settings: {', '.join(task.settings)}; formats: {', '.join(task.formats)}")
    keep = lambda xs, order: tuple(x for x in order if x in xs)  # noqa: E731
    return keep(settings, task.settings) or task.settings, keep(formats, task.formats) or task.formats


def load_cases(dataset: Path, config: str, ids: list[str] | None) -> tuple[list[Sample], str]:
    """The selected samples (natural id order) and a sha256 of the dataset file they come from."""
    return load_samples(dataset, config, ids), sha256_file(config_file(dataset, config))


def load_diagnoses(dataset: Path) -> list[str]:
    try:
        df = load_config(dataset, "diagnoses")
    except CraftMDError:
        return []
    return [d for d in df["diagnosis"].to_list() if d]


# --- the run ----------------------------------------------------------------------------
def check_run(spec) -> None:
    """The checks every generation run (CRAFT-MD, consultation, encounters) makes before it calls anything."""
    if spec.trials < 1:
        raise CraftMDError("--trials must be at least 1")
    if spec.concurrency < 1:
        raise CraftMDError("--concurrency must be at least 1")
    if Path(spec.out).exists() and not spec.overwrite:
        raise CraftMDError(f"{spec.out} exists (pass --overwrite to replace it)")


class Engine:
    task = TASK
    agents = AGENTS
    default_prompt_set = DEFAULT_PROMPT_SET

    def __init__(self, spec: GenerateSpec):
        self.spec = spec
        self.settings, self.formats = parse_experiments(spec.experiments, self.task)
        check_names((getattr(spec, agent) for agent in self.agents), self.call_settings())  # a missing variable: one line, now
        if spec.max_turns < 1:
            raise CraftMDError("--max-turns must be at least 1")
        check_run(spec)
        self.prompts = PromptSet(spec.prompt_set or self.default_prompt_set)
        self.protocol = Protocol(self.prompts, spec.max_turns)
        self.cases, self.dataset_sha = load_cases(Path(spec.dataset), spec.config, spec.cases)
        if not self.cases:
            raise CraftMDError(f"no cases selected from config {spec.config!r}")
        self.many = load_diagnoses(Path(spec.dataset)) if "mcq_many" in self.formats else []
        self.agent_names = self.roles()
        self.tallies = {a: Counts() for a in self.agents}
        self.callers: dict[str, Caller] = {}
        self.servers: dict[str, dict] = {}  # model name -> where it is called ({base_url, service}; for the manifest)
        self.answers_done = 0
        self._tick = lambda: None  # called after every request and every answer (the progress bar)

    def roles(self) -> dict[str, str]:
        """agent -> provider/model."""
        spec = self.spec
        return {"doctor": spec.doctor, "patient": spec.patient, "summarizer": spec.summarizer or spec.patient}

    # which experiments a case allows: the cells of the task's matrix whose needs the case meets
    def plan(self, case: Sample, with_image: bool) -> list[tuple[str, str]]:
        image_case = case.source == "nejm_image"
        out = []
        for s in self.settings:
            for f in self.formats:
                e = self.task.experiment(s, f)
                if e is None or (image_case and not e.image):
                    continue
                if e.exam and not (case.has_exam and case.history):
                    continue
                if e.options == "choices4" and len(case.choices) != 4:
                    continue
                if e.options == "diagnoses" and not self.many:
                    continue
                out.append((s, f))
        return out

    def jobs(self) -> list[tuple[Sample, int, bool]]:
        out = []
        for case in self.cases:
            flags = (False, True) if case.source == "nejm_image" and case.image is not None else (False,)
            for trial in range(self.spec.trials):
                for flag in flags:
                    if self.plan(case, flag):
                        out.append((case, trial, flag))
        return out

    def call_settings(self, concurrency: int | None = None) -> CallSettings:
        """How this run calls its models (``concurrency``: this process's share per server)."""
        s = self.spec
        return CallSettings(base_url=s.base_url, api_key=s.api_key, timeout=s.timeout, max_retries=s.max_retries, backoff=s.backoff,
                            concurrency=concurrency or s.concurrency, server_concurrency=s.server_concurrency, seed=s.seed,
                            cache=s.cache or default_cache())

    async def check_models(self) -> None:
        """Server reachable and model served, for every agent's model; before any chat call."""
        names = list(dict.fromkeys(self.agent_names.values()))
        async with Connections(replace(self.call_settings(), cache=None), names) as conn:
            self.servers = {n: conn.server(n) for n in names}
            await conn.check()

    def sampling(self, trial: int) -> Sampling:
        s = self.spec
        return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed + trial)

    def _agent_call(self, agent: str):
        caller = self.callers[self.agent_names[agent]]
        tally = self.tallies[agent]

        async def call(messages, sampling, priority: int = 0):
            c = await caller(messages, sampling, priority, counts=tally)
            self._tick()
            return c

        return call

    async def run_job(self, case: Sample, trial: int, with_image: bool) -> tuple[list[dict], list[dict]]:
        plan = self.plan(case, with_image)
        need = {s for s, _ in plan}
        sampling = self.sampling(trial)
        doctor, patient, summarizer = (self._agent_call(a) for a in AGENTS)
        answers: list[dict] = []
        conversations: list[dict] = []

        async def ask(setting: str, fmt: str, conv: Conversation | None = None, summary: str | None = None,
                      blocked: tuple[str, str | None] | None = None) -> None:
            """One question; ``blocked`` = (status, reason) of the conversation or summary it needs, when that failed."""
            row = {"case_id": case.case_id, "trial": trial, "setting": setting, "format": fmt, "with_image": with_image}
            if blocked:
                answers.append({**row, "response": None, "status": blocked[0], "error": blocked[1]})
            else:
                msgs = self.protocol.question_messages(case, setting, fmt, with_image, conv=conv, summary=summary, many_options=self.many)
                c = await doctor(msgs, sampling, 1)  # nothing waits on a question: turns go first
                ok = c.status == "ok"
                answers.append({**row, "response": c.text if ok else None, "status": c.status, "error": None if ok else c.error})
            self.answers_done += 1
            self._tick()

        def record(kind: str, conv: Conversation, summary: str | None) -> None:
            conversations.append({
                "case_id": case.case_id, "trial": trial, "conversation": kind, "with_image": with_image,
                "messages": conv.record(), "summary": summary, "n_turns": conv.n_turns, "ended": conv.ended,
                "error": conv.error if conv.ended in ("refusal", "error") else None,
            })

        def failure(conv: Conversation, what: str) -> tuple[str, str] | None:
            if conv.ended not in ("refusal", "error"):
                return None
            return conv.ended, f"the {what} failed: {conv.error or conv.ended}"

        async def standard() -> None:
            conv = await self.protocol.converse(case, case.vignette, with_image, doctor, patient, sampling, sampling)
            failed = failure(conv, "conversation")
            summary, summary_failed = None, failed
            if "summarized" in need and not failed:
                c = await summarizer(self.protocol.summarizer_messages(conv), sampling)
                summary = c.text.strip() if c.status == "ok" else None
                summary_failed = None if c.status == "ok" else (c.status, f"the summary failed: {c.error or c.status}")
            record("standard", conv, summary)
            tasks = []
            for s, f in plan:
                if s == "summarized":
                    tasks.append(ask(s, f, summary=summary, blocked=summary_failed))
                elif s == "singleturn":  # needs only the patient's first answer
                    tasks.append(ask(s, f, conv=conv, blocked=None if len(conv.turns) >= 2 else failed))
                elif s in ("multiturn", "multiturn_plus_exam"):
                    tasks.append(ask(s, f, conv=conv, blocked=failed))
            await asyncio.gather(*tasks)

        async def no_exam() -> None:
            conv = await self.protocol.converse(case, case.history, with_image, doctor, patient, sampling, sampling)
            record("no_exam", conv, None)
            failed = failure(conv, "history-only conversation")
            await asyncio.gather(*(ask(s, f, conv=conv, blocked=failed) for s, f in plan if s in NO_EXAM_SETTINGS))

        work = [ask(s, f) for s, f in plan if TASK.experiment(s, f).conversation is None]
        if need & set(CONVERSATION_SETTINGS):
            work.append(standard())
        if need & set(NO_EXAM_SETTINGS):
            work.append(no_exam())
        await asyncio.gather(*work)
        return conversations, answers

    def snapshot(self) -> Counts:
        """This process's counts so far: the agents' tallies summed, with the callers' retries and peak in flight."""
        total = Counts.total(self.tallies.values())
        total.retries = sum(c.counters.retries for c in self.callers.values())
        total.peak_in_flight = sum(c.counters.peak_in_flight for c in self.callers.values())
        total.batches = [b for c in self.callers.values() for b in c.counters.batches]
        return total

    async def execute(self, jobs, concurrency: int, tick) -> tuple[list[dict], list[dict]]:
        """Run ``jobs`` side by side; ``tick()`` after every request and every answer. Returns the rows."""
        names = list(dict.fromkeys(self.agent_names.values()))
        conn = Connections(self.call_settings(concurrency), names)
        self.callers = {name: conn.caller(name) for name in names}
        limit = asyncio.Semaphore(max(conn.capacity * 2, 256 if conn.batches else 1))  # [scale] capacity: every server of a pool
        conversations: list[dict] = []
        answers: list[dict] = []

        async def one(job) -> None:
            async with limit:
                conv_rows, answer_rows = await in_conversation(self.run_job(*job))  # [scale] one server of a pool per job
            conversations.extend(conv_rows)
            answers.extend(answer_rows)

        self._tick = tick
        async with conn:
            await asyncio.gather(*(one(j) for j in jobs))
        return conversations, answers

    def _shard(self, jobs, index: int, workers: int, results, progress) -> None:
        """A worker process: every ``workers``-th job from ``index``, its share of the concurrency."""
        tick = throttled(lambda: progress.put((index, self.snapshot(), self.answers_done)))
        try:
            share = max(1, self.spec.concurrency // workers)
            out = asyncio.run(self.execute(jobs[index::workers], share, tick))
            results.put((index, out, self.tallies, self.snapshot(), None))
        except BaseException as exc:  # noqa: BLE001 - reported by the parent as one line
            results.put((index, None, None, None, f"{type(exc).__name__}: {exc}"))

    def run(self) -> GenerateReport:
        spec = self.spec
        start = time.monotonic()
        jobs = self.jobs()
        if not jobs:
            raise CraftMDError(f"none of the experiments {', '.join(self.settings)} × {', '.join(self.formats)} applies to the selected cases")
        jobs = [j for j in jobs if in_shard(j[0].case_id, spec.shard)]  # [scale] --shard k/K
        asyncio.run(self.check_models())  # fails here, before any chat call, on a bad server or model
        batching = any(parse_name(n).provider == "vllm" for n in self.agent_names.values())
        workers = 1 if batching else max(1, min(spec.workers, len(jobs)))
        answers_total = sum(len(self.plan(case, flag)) for case, _, flag in jobs)
        # One tick per request: the bar counts requests (no total: a conversation's length is not known
        # ahead) and shows the answers done of all planned, and the counts the summary ends with.
        bar = tqdm(unit="req", desc="generate", disable=not spec.progress, file=sys.stderr, dynamic_ncols=True, mininterval=0.2)
        latest: dict[int, tuple[Counts, int]] = {}

        def show(index: int, counts: Counts, answers_done: int) -> None:
            latest[index] = (counts, answers_done)
            if bar.disable:
                return
            total = Counts.total(c for c, _ in latest.values())
            bar.n = total.requests
            bar.set_postfix_str(progress_text(total, sum(a for _, a in latest.values()), answers_total), refresh=False)
            bar.refresh()

        try:
            if workers == 1:
                tick = throttled(lambda: show(0, self.snapshot(), self.answers_done))
                conversations, answers = asyncio.run(self.execute(jobs, spec.concurrency, tick))
                counts = self.snapshot()
                show(0, counts, len(answers))
            else:
                conversations, answers, counts = self._run_processes(jobs, workers, show)
        finally:
            bar.close()
        path = write_release(spec.out, mark(self.manifest(jobs), spec.shard), {  # [scale] mark: the shard it is
            "conversations": pa.Table.from_pylist(conversations, CONVERSATIONS_SCHEMA),
            "answers": pa.Table.from_pylist(answers, ANSWERS_SCHEMA),
        }, overwrite=spec.overwrite)
        status: dict[str, int] = {}
        for a in answers:
            status[a["status"]] = status.get(a["status"], 0) + 1
        cost = None
        if spec.price:
            cost = (counts.tokens_in * spec.price[0] + counts.tokens_out * spec.price[1]) / 1e6
        return GenerateReport(
            path=path, conversations=len(conversations), answers=len(answers), answer_status=status, tallies=self.tallies,
            counts=counts, wall_s=time.monotonic() - start, cost=cost,
            failed_conversations=sum(c["ended"] in ("refusal", "error") for c in conversations),
        )

    def _run_processes(self, jobs, workers: int, show):
        """Split the jobs over forked worker processes (one event loop each, one shared cache)."""
        ctx = multiprocessing.get_context("fork")
        results, progress = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=self._shard, args=(jobs, i, workers, results, progress), daemon=True) for i in range(workers)]
        for p in procs:
            p.start()
        # pyarrow imports pandas on its first conversion (~0.4 s); do it while the workers run, not after.
        pa.array([""])
        conversations, answers, counts, errors, finished = [], [], Counts(), [], 0
        try:
            while finished < workers:
                while not progress.empty():
                    show(*progress.get())
                try:
                    index, out, tallies, final, error = results.get(timeout=0.2)
                except queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        raise CraftMDError("a generation worker process died") from None
                    continue
                finished += 1
                if error:
                    errors.append(error)
                    continue
                conversations += out[0]
                answers += out[1]
                counts.merge(final)
                for agent, t in tallies.items():
                    self.tallies[agent].merge(t)
                show(index, final, len(out[1]))
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join()
        if errors:
            raise CraftMDError(f"generation worker failed: {errors[0]}")
        return conversations, answers, counts

    def manifest(self, jobs) -> Manifest:
        spec = self.spec
        per_agent = {**Sampling(spec.temperature, spec.top_p, spec.max_tokens, spec.seed).to_dict(), "seed_rule": "seed + trial"}
        sampling = {a: dict(per_agent) for a in self.agents}
        ids = hashlib.sha256("\n".join(c.case_id for c in self.cases).encode()).hexdigest()
        total = Counts.total(self.tallies.values())
        return Manifest(
            release=Path(spec.out).name,
            kind="generated",
            task=self.task.name,
            model=spec.doctor,
            source={"dataset_config": spec.config, "dataset_sha256": self.dataset_sha, "case_ids_sha256": ids, "cases": len(self.cases)},
            prompt_set=self.prompts.describe(),
            sampling=sampling,
            seed=spec.seed,
            models=dict(self.agent_names),
            roles={a: {"model": n, **self.servers.get(n, {"base_url": None}), "sampling": sampling[a]} for a, n in self.agent_names.items()},
            counts={
                "cases": len(self.cases),
                "trials": spec.trials,
                "jobs": len(jobs),
                "requests": {a: t.requests for a, t in self.tallies.items()},
                "tokens_in": {a: t.tokens_in for a, t in self.tallies.items()},
                "tokens_out": {a: t.tokens_out for a, t in self.tallies.items()},
                "refusals": total.refusals,
                "failures": total.failures,
                "failures_by_reason": dict(sorted(total.reasons.items())),
            },
            notes={
                "settings": list(self.settings),
                "formats": list(self.formats),
                "max_turns": spec.max_turns,
                "providers": {a: parse_name(n).provider for a, n in self.agent_names.items()},
                "protocol": "CRAFT-MD (Johri et al., Nature Medicine 2025); see the prompt set's README for verbatim vs reconstructed prompts",
            },
        )


def generate(spec: GenerateSpec) -> GenerateReport:
    """Validate everything (one-line errors, nothing written), run, write the release."""
    if spec.task == "consultation":
        from .consult import ConsultEngine

        engine = ConsultEngine(spec)
    elif spec.task == "craftmd":
        engine = Engine(spec)
    else:
        raise CraftMDError(f"unknown task {spec.task!r} for generation; known: craftmd, consultation")
    return engine.run()
