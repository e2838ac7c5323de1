"""The one runner: every task's protocol runs here (``craftmd generate --task NAME``).

A task (:mod:`craftmd.tasks`) declares its roles and options and links its protocol, a :class:`Runner`
subclass that says only what is the task's own: one job's work (``run_job``, returning rows per release
table) and, where it needs them, its jobs (default: each sample × trial), what a job is expected to cost
(``estimate_job``) and what its run record adds (``record_extra``). The runner owns the rest, once for every task:

- the roles (the task's, bound by ``--role``), each on its own server (:class:`~craftmd.models.connect.Connections`: one
  client per model, one request-slot pool per server, the request cache, capped retries);
- the progress bar (requests, tokens, cost) and the end summary, from one set of counts;
- ``--estimate``: each role's calls, tokens and cost, printed before anything is sent;
- ``--budget USD``: no new job is started once the run's cost (at ``--price``) reaches it; the
  jobs not run are recorded as not run in the run record (never as a failure of the model);
- the progress (a tick after every request and every job), the release tables built from the
  job's rows, worker processes (``--workers``), resume (every finished call is in the cache), the
  run record and the release writer.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import multiprocessing
import queue
import sys
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from pydantic import BaseModel

from craftmd import CraftMDError
from craftmd.atomic import check_writable, sha256_file
from craftmd.dataset import config_file
from craftmd.models import Sampling, parse_name
from craftmd.models.calls import Counts
from craftmd.models.connect import CallSettings, Connections, check_names
from craftmd.models.pool import in_conversation
from craftmd.models.vllm import engine_args_by_model
from craftmd.release import RELEASE_HOLDS, RELEASE_OWNS, SCHEMAS, RunRecord, run_protocol, write_release
from craftmd.samples import Sample, load_samples
from craftmd.scoring.mcq import answer_rules
from craftmd.tasks import Task, get_task

from .protocol import PromptSet
from .shards import in_shard, mark

#: USD per million tokens in and out, by role ("*": every role without its own price).
Prices = dict[str, tuple[float, float]]


def default_cache() -> Path:
    """``$CRAFTMD_CACHE/requests.sqlite`` (default ``~/.cache/craftmd``), beside the source download cache."""
    from craftmd.source import cache_dir

    return cache_dir() / "requests.sqlite"


@dataclass
class GenerateSpec:
    """Everything a generation run is asked to do that every task shares (``craftmd generate``'s options); what is a
    task's own is in ``roles`` (its models beyond the doctor and the patient) and ``options`` (its options class)."""

    dataset: Path
    out: Path
    doctor: str  # the model under test (the role ``doctor``)
    task: str  # a registered task, or a task file (*.py)
    patient: str | None = None  # the role ``patient``, for the tasks that have one (``--patient``)
    roles: dict[str, str] = field(default_factory=dict)  # role -> provider/model (``--role``): the task's other roles
    options: BaseModel | dict = field(default_factory=dict)  # the task's options, or a dict of them (``-T key=value``)
    config: str = "all"
    cases: list[str] | None = None
    trials: int = 1
    experiments: list[str] | None = None
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    base_url: str | None = None  # openai/ models' server (openai-api/<service>/ models read <SERVICE>_BASE_URL)
    api_key: str | None = None  # used for the calls, never recorded
    concurrency: int = 32  # requests in flight per server (shared out among worker processes)
    server_concurrency: dict[str, int] = field(default_factory=dict)  # per service ('openai' for openai/ models)
    engine_args: dict[str, dict] = field(default_factory=dict)  # role ('*': every vllm/ role) -> vLLM engine settings
    workers: int = 1  # processes; the client's per-request CPU, not the server, bounds a fast local server
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    price: Prices | tuple[float, float] | None = None  # USD per million tokens in, out (one pair, or per role)
    budget: float | None = None  # USD: no new job once the cost at ``price`` reaches it
    shard: tuple[int, int] | None = None  # (k, K): only the samples of shard k of K (generation.shards)
    cache: Path | None = None
    prompt_set: str | None = None  # default: the task's own
    served: dict[str, dict] = field(default_factory=dict)  # model name -> what the run served it with (craftmd.models.serve)
    overwrite: bool = False
    progress: bool = True

    def prices(self) -> Prices:
        if self.price is None:
            return {}
        return dict(self.price) if isinstance(self.price, dict) else {"*": tuple(self.price)}


@dataclass
class Estimate:
    """What one role is expected to send: calls (expected, at most) and tokens (expected)."""

    calls: float = 0
    calls_max: float = 0
    tokens_in: float = 0
    tokens_out: float = 0

    def add(self, calls: float, tokens_in: float, tokens_out: float, calls_max: float | None = None) -> Estimate:
        self.calls += calls
        self.calls_max += calls if calls_max is None else calls_max
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        return self


def tokens(text: str | None) -> int:
    """A rough token count for estimates: four characters a token."""
    return len(text or "") // 4 + 1


def cost_of(prices: Prices, agent: str, tokens_in: float, tokens_out: float) -> float | None:
    p = prices.get(agent, prices.get("*"))
    return None if p is None else (tokens_in * p[0] + tokens_out * p[1]) / 1e6


def throttled(fn, interval: float = 0.1):
    """``fn`` as a tick that runs it at most once per ``interval`` seconds (the bar needs no more)."""
    last = [-interval]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] >= interval:
            last[0] = now
            fn()

    return tick


def progress_text(c: Counts, done: int, total: int, unit: str = "answers", cost: float | None = None) -> str:
    """The one-line counts shown by the progress bar (the summary spells the same numbers out)."""
    money = f" ${cost:,.2f}" if cost is not None else ""
    return (
        f"{unit} {done}/{total} sent={c.calls} cached={c.cache_hits} dedup={c.deduplicated} "
        f"retries={c.retries} fail={c.failures} tok_in={c.tokens_in:,} tok_out={c.tokens_out:,}{money}"
    )


def check_run(spec, release: bool = True) -> None:
    """The checks every generation run makes before it calls anything (``release``: and that its release can be written)."""
    from craftmd.release import MAX_TRIALS

    from .shards import valid_shard

    def number(x) -> bool:
        return type(x) in (int, float) and math.isfinite(x)

    if type(spec.trials) is not int or not 1 <= spec.trials <= MAX_TRIALS:
        raise CraftMDError(f"--trials {spec.trials!r}: a whole number of trials from 1 to {MAX_TRIALS}")
    if spec.concurrency < 1:
        raise CraftMDError("--concurrency must be at least 1")
    if type(spec.max_tokens) is not int or spec.max_tokens < 1:
        raise CraftMDError(f"--max-tokens {spec.max_tokens!r}: a whole number of at least 1")
    if not number(spec.timeout) or spec.timeout <= 0:
        raise CraftMDError(f"--timeout {spec.timeout!r}: a number of seconds more than 0")
    if not number(spec.temperature) or spec.temperature < 0:
        raise CraftMDError(f"--temperature {spec.temperature!r}: a finite sampling temperature of at least 0")
    if spec.shard is not None and not valid_shard(*spec.shard):
        raise CraftMDError(f"--shard {spec.shard!r}: expected k/K with 1 <= k <= K")
    for role, pair in spec.prices().items():
        if len(pair) != 2 or not all(number(x) and x >= 0 for x in pair):
            raise CraftMDError(
                f"--price {'' if role == '*' else role + '='}{pair!r}: IN,OUT in USD per million tokens, each finite and at least 0"
            )
    if spec.budget is not None:
        if not number(spec.budget) or spec.budget <= 0:
            raise CraftMDError("--budget must be a finite amount of USD more than 0")
        if not spec.prices():
            raise CraftMDError("--budget needs --price (USD per million tokens) to know what the run costs")
    if release:
        # exists without --overwrite, or cannot be written: said before the first call
        check_writable(spec.out, overwrite=spec.overwrite, owns=RELEASE_OWNS, holds=RELEASE_HOLDS)


@dataclass
class GenerateReport:
    path: Path | None
    produced: list[str]  # what the task's protocol made, one line each
    tallies: dict[str, Counts]  # per agent
    counts: Counts  # the whole run: the tallies summed, with the callers' retries and peak in flight
    wall_s: float
    rows: dict[str, list[dict]] = field(default_factory=dict)
    cost: float | None = None
    not_run: int = 0
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

    @property
    def conversations(self) -> int:
        return len(self.rows.get("conversations", ()))

    @property
    def failed_conversations(self) -> int:
        return sum(c["ended"] in ("refusal", "error") for c in self.rows.get("conversations", ()))

    @property
    def endings(self) -> dict[str, int]:
        """How the conversations ended, counted."""
        return tally(self.rows.get("conversations", ()), "ended")

    @property
    def answers(self) -> int:
        return len(self.rows.get("answers", ()))

    @property
    def answer_status(self) -> dict[str, int]:
        return tally(self.rows.get("answers", ()), "status")

    def summary(self) -> str:
        c = self.counts
        lines = [f"release      {self.path}"] + [f"produced     {p}" for p in self.produced]
        if self.not_run:
            lines.append(f"not run      {self.not_run} jobs: the --budget was reached (listed in the run record as not run)")
        lines.append(
            f"requests     {c.requests}: {c.calls} sent, {c.cache_hits} from cache, {c.deduplicated} deduplicated "
            f"(identical to one in flight); {c.retries} retries, peak {c.peak_in_flight} in flight, {self.wall_s:.1f} s"
        )
        if c.failures:
            lines.append(f"failed       {c.failures} requests (reasons in the error columns of the release's tables):")
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


def context_warnings(largest, windows) -> list[str]:
    """The calls that cannot fit their server's window, as a run's start says them."""
    from .context import too_long

    return [
        f"{t}: such calls will fail (context length exceeded); give the server a larger context"
        for t in too_long(largest, windows)
    ]


def tally(rows, key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[str(r[key])] = out.get(str(r[key]), 0) + 1
    return dict(sorted(out.items()))


class Runner:
    """A task's protocol on the one runner. A subclass sets ``default_prompt_set`` (and ``prompts_root``, where its
    prompt sets are) and writes ``run_job``; every other hook has a default that fits a task posed on samples."""

    default_prompt_set: str = ""
    prompts_root: Path | None = None  # where its prompt sets are (None: the package's generation/prompts)
    unit: str = "jobs"  # what the bar counts as done: a release table a job writes rows to (one unit a row), or jobs
    processes: bool = True  # may its jobs be split over worker processes

    def __init__(self, spec: GenerateSpec, *, calls: dict | None = None):
        """``calls`` (role -> async ``(messages, sampling) -> Completion``): the roles call those and the runner opens no
        connection (no servers, no request cache) and writes no release: another harness (inspect) runs its jobs."""
        self.spec = spec
        self.calls = calls
        self.task: Task = get_task(spec.task)
        self.options = self.task.parse_options(spec.options)
        self.down: dict[str, str] = {}  # servers of a pool found down by check_models (URL -> why): left out of the run
        check_run(spec, release=calls is None)
        self.agents = self.active_roles()
        if calls is None:
            self.agent_names = self.roles()
            required = {r.name for r in self.task.roles if r.required}
            # an optional role not given is not called
            self.agents = tuple(a for a in self.agents if a in self.agent_names or a in required)
            check_names(self.agent_names.values(), self.call_settings())  # a missing variable: one line, now
        else:
            missing = [a for a in self.agents if a not in calls]
            if missing:
                raise CraftMDError(f"the {self.task.name} task's roles {', '.join(missing)} were given no call")
            self.agent_names = {a: a for a in self.agents}
        name = spec.prompt_set or self.default_prompt_set
        self.prompts = PromptSet(name, self.prompts_root) if self.prompts_root else PromptSet(name)
        self.tallies = {a: Counts() for a in self.agents}
        self.callers: dict = {}
        self.servers: dict[str, dict] = {}  # model name -> where it is called ({base_url, service}; for the record)
        self.done = 0  # units of work done (the bar's count)
        self.not_run: list[str] = []  # jobs the budget left unstarted
        self._tick = lambda: None  # called after every request and every job done (the progress bar)
        self.largest: dict[tuple[str, str], tuple[int, int]] = {}  # (agent, what) -> its largest call: prompt, reply tokens

    # --- what a task says ---------------------------------------------------------------
    def active_roles(self) -> tuple[str, ...]:
        """The roles this run calls (default: every role of the task; encounters leaves its tagger out without tags)."""
        return tuple(r.name for r in self.task.roles)

    def roles(self) -> dict[str, str]:
        """role -> provider/model: the task's roles as the spec binds them (``--doctor``, ``--patient``, ``--role``), a
        default role's model where one is not given."""
        given = dict(self.spec.roles)
        for name in ("doctor", "patient"):
            short = getattr(self.spec, name)
            if short and given.get(name, short) != short:
                raise CraftMDError(f"--{name} {short} and --role {name}={given[name]} disagree: give one")
            if short:
                given[name] = short
        bound = self.task.bind_roles(given)
        return {a: bound[a] for a in self.agents if a in bound}

    @cached_property
    def cases(self) -> list[Sample]:
        """The selected samples of the task's dataset (``--config``, ``--cases``), in natural id order."""
        cases, self.dataset_sha = load_cases(Path(self.spec.dataset), self.spec.config, self.spec.cases, self.task.dataset)
        if not cases:
            raise CraftMDError(f"no cases selected from config {self.spec.config!r}")
        return cases

    def jobs(self) -> list:
        """Every selected sample × trial."""
        return [(case, trial) for case in self.cases for trial in range(self.spec.trials)]

    def sample_id(self, job) -> str:
        """The sample a job poses (what ``--shard`` hashes)."""
        return job[0].case_id

    def shard_jobs(self, jobs: list) -> list:
        """Those of ``jobs`` in this run's shard (all of them without ``--shard``)."""
        return [j for j in jobs if in_shard(self.sample_id(j), self.spec.shard)]

    def job_id(self, job) -> str:
        """A job's name in the run record (``case_id/trial``)."""
        return f"{job[0].case_id}/{job[1]}"

    def planned(self, job) -> int:
        """Units of work in ``job`` (the bar's total)."""
        return 1

    async def run_job(self, job) -> dict[str, list[dict]]:
        """One job's rows, by release table."""
        raise NotImplementedError

    async def job_tables(self, job) -> dict[str, list[dict]]:
        """Rows a job reads but does not make (encounters: its patient's memory tags, shared by the patient's trials),
        for a harness that keeps each job's rows apart (inspect's samples). None by default."""
        return {}

    def tables(self, rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
        """The release tables from the jobs' rows: the task's required tables, its conversations when it records any, and
        every table a job gave rows to (a column a row leaves out: null, or its default, :meth:`table`)."""
        names = [*self.task.required_tables, *(["conversations"] if self.task.conversations else []), *rows]
        return {name: self.table(name, rows.get(name, [])) for name in dict.fromkeys(names)}

    def table(self, name: str, rows: list[dict]) -> pa.Table:
        """One release table from rows, in its schema (the release's, or the task's own table's). A column a row leaves out
        is null, except ``with_image`` (false) and, for a task of one experiment, the answers' ``setting`` and ``format``."""
        schema = next((t.schema for t in self.task.extra_tables if t.name == name), SCHEMAS.get(name))
        if schema is None:
            raise CraftMDError(f"the {self.task.name} task's protocol gave rows to {name!r}, not a table of its releases")
        defaults = {"with_image": False}
        if name == "answers" and len(self.task.experiments) == 1:
            defaults.update(setting=self.task.experiments[0].setting, format=self.task.experiments[0].format)
        defaults = {k: v for k, v in defaults.items() if k in schema.names}
        return pa.Table.from_pylist([{**defaults, **r} for r in rows] if defaults else rows, schema)

    def estimate_job(self, job, est: dict[str, Estimate]) -> None:
        """Add what ``job`` is expected to send, per agent, to ``est`` (default: a call of each role, the sample's text in)."""
        text = getattr(job[0], "vignette", None) if isinstance(job, tuple) and job else None
        for agent in self.agents:
            est[agent].add(1, 100 + tokens(text), min(60, self.spec.max_tokens))
            self.note_call(agent, "call", 100 + tokens(text), self.spec.max_tokens)

    def produced(self, rows: dict[str, list[dict]]) -> list[str]:
        return [f"{len(v)} {k}" for k, v in rows.items()]

    def shows_images(self) -> bool:
        """Whether a job of the run (every shard's) shows the doctor a case's image: the protocol records it (an image
        run is never ranked with a text run). Default: no."""
        return False

    def record_extra(self, record: RunRecord, jobs) -> RunRecord:
        """What the task adds to the run record (default: the samples it posed, the dataset file's hash, its options)."""
        record = self.record_source(record)
        record.notes = {**record.notes, "options": self.options.model_dump(mode="json")}
        return record

    def record_source(self, record: RunRecord) -> RunRecord:
        """The samples the run posed (:attr:`cases`) and the hash of the dataset file they come from, in the run record."""
        if "cases" in self.__dict__:
            record.source = {
                "dataset_config": self.spec.config,
                "dataset_sha256": self.dataset_sha,
                "case_ids_sha256": case_ids_sha256(c.case_id for c in self.cases),
                "cases": len(self.cases),
            }
            record.counts = {"cases": len(self.cases), **record.counts}
        return record

    def notes(self) -> tuple[str, ...]:
        return ()

    # --- the machinery ------------------------------------------------------------------
    def call_settings(self, concurrency: int | None = None) -> CallSettings:
        """How this run calls its models (``concurrency``: this process's share per server)."""
        s = self.spec
        return CallSettings.of(
            s,
            backoff=s.backoff,
            down=self.down,
            concurrency=concurrency or s.concurrency,
            seed=s.seed,
            cache=s.cache or default_cache(),
            engine_args=engine_args_by_model(self.agent_names, s.engine_args),
        )

    def sampling(self, trial: int) -> Sampling:
        s = self.spec
        return Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed + trial)

    def model_names(self) -> list[str]:
        return list(dict.fromkeys(self.agent_names.values()))

    async def check_models(self) -> None:
        """Server reachable and model served, for every agent's model; before any chat call."""
        names = self.model_names()
        async with Connections(replace(self.call_settings(), cache=None), names) as conn:
            self.servers = {n: conn.server(n) for n in names}
            await conn.check()
            self.down = conn.down

    def call(self, agent: str):
        """``agent``'s model as the protocol's callable ``(messages, sampling, priority=0) -> Completion``."""
        tally = self.tallies[agent]
        if self.calls is not None:  # the harness's own call for the role
            given = self.calls[agent]

            async def call_given(messages, sampling, priority: int = 0):
                c = await given(messages, sampling)
                tally.add(c, "calls")
                self._tick()
                return c

            return call_given
        caller = self.callers[self.agent_names[agent]]

        async def call(messages, sampling, priority: int = 0):
            c = await caller(messages, sampling, priority, counts=tally)
            self._tick()
            return c

        return call

    async def ask(self, agent: str, system: str, user: str, sampling: Sampling, priority: int = 0):
        """One call of ``agent`` (:meth:`call`) with a system message and a user message: a protocol's simplest turn."""
        return await self.call(agent)(
            [{"role": "system", "content": system}, {"role": "user", "content": user}], sampling, priority
        )

    def cost(self, counts: dict[str, Counts] | None = None) -> float | None:
        prices = self.spec.prices()
        if not prices:
            return None
        parts = [cost_of(prices, a, t.tokens_in, t.tokens_out) for a, t in (counts or self.tallies).items()]
        return sum(p for p in parts if p is not None)

    def snapshot(self) -> Counts:
        """This process's counts so far: the agents' tallies summed, with the callers' retries and peak in flight."""
        total = Counts.total(self.tallies.values())
        total.retries = sum(c.counters.retries for c in self.callers.values())
        total.peak_in_flight = sum(c.counters.peak_in_flight for c in self.callers.values())
        total.batches = [b for c in self.callers.values() for b in c.counters.batches]
        return total

    async def execute(self, jobs, concurrency: int, tick) -> dict[str, list[dict]]:
        """Run ``jobs`` side by side; ``tick()`` after every request and every job done. Returns the rows by table."""
        names = self.model_names()
        conn = Connections(self.call_settings(concurrency), names)
        self.callers = {name: conn.caller(name) for name in names}
        # Jobs in flight: twice what the servers take at once (every server of a pool), so that a server is given its
        # next conversation when it has room for it.
        limit = asyncio.Semaphore(max(conn.capacity * 2, 256 if conn.batches else 1))
        rows: dict[str, list[dict]] = {}
        budget = self.spec.budget

        async def one(job) -> None:
            async with limit:
                if budget is not None and (self.cost() or 0.0) >= budget:
                    self.not_run.append(self.job_id(job))
                    return
                out = await in_conversation(self.run_job(job))  # its requests stay on one server of each pool
            for table, r in out.items():
                rows.setdefault(table, []).extend(r)
            self.done += len(out[self.unit]) if self.unit in out else 1
            tick()

        self._tick = tick
        async with conn:
            await self.before(conn)
            await asyncio.gather(*(one(j) for j in jobs))
        return rows

    async def before(self, conn: Connections) -> None:
        """Work a task does once the connections are open, before its jobs (encounters: the memory tags)."""

    def estimate(self, jobs: list) -> dict[str, Estimate]:
        """Each agent's expected calls and tokens for ``jobs`` (and each call kind's largest, :meth:`note_call`); nothing is sent."""
        est = {a: Estimate() for a in self.agents}
        self.largest = {}
        for job in jobs:
            self.estimate_job(job, est)
        return est

    def note_call(self, agent: str, what: str, prompt: float, reply: float) -> None:
        """Note one call of ``agent`` (``what``: a setting and format, a step) with ``prompt`` tokens and a ``reply`` budget;
        the largest of each kind is checked against its server's context window."""
        held = self.largest.get((agent, what))
        if held is None or prompt + reply > sum(held):
            self.largest[(agent, what)] = (int(prompt), int(reply))

    def windows(self) -> dict[str, tuple[int | None, str]]:
        """agent -> (its server's context window or None when the server does not say, the server); asks each server
        once (:func:`craftmd.generation.context.context_window`), sends no chat request."""
        from craftmd.models import endpoint_of
        from craftmd.models.openai import public_url

        from .context import context_window

        asked: dict[tuple[str, str], int | None] = {}
        out = {}
        for agent, name in self.agent_names.items():
            n = parse_name(name)
            if n.provider == "vllm":
                continue
            url, key, _ = endpoint_of(n, self.spec.base_url, self.spec.api_key)
            if not url:
                continue  # a hosted API: its window is the model's
            sizes = [asked.setdefault((u, n.model), context_window(u, n.model, key)) for u in url.split(",")]
            known = [w for w in sizes if w is not None]
            out[agent] = (min(known) if known else None, ", ".join(public_url(u) for u in url.split(",")))
        return out

    def context_lines(self) -> list[str]:
        """The estimate's lines on context: each agent's largest call and, where its server says its window, what does not fit."""
        windows = self.windows()
        lines = []
        for agent in self.agents:
            mine = {w: pr for (a, w), pr in self.largest.items() if a == agent}
            if not mine:
                continue
            what, (p, r) = max(mine.items(), key=lambda kv: (sum(kv[1]), kv[0]))
            window, where = windows.get(agent, (None, ""))
            said = (
                f"window {window:,} tokens at {where}"
                if window is not None
                else f"window not reported by {where}"
                if where
                else "window: the model's"
            )
            lines.append(f"{'largest':<12} {agent:<12} {what}: ~{p:,} prompt + {r:,} reply tokens ({said})")
        from .context import too_long

        lines += [f"{'too long':<12} {t}" for t in too_long(self.largest, windows)]
        return lines

    def estimate_text(self) -> str:
        jobs = self.shard_jobs(self.jobs())
        est = self.estimate(jobs)
        prices = self.spec.prices()
        lines = [
            f"estimate     task {self.task.name}: {len(jobs)} jobs; nothing was sent. Rough: 4 characters a token, "
            f"a typical conversation length (calls at most: every conversation to its cap)",
            "role         model                              calls (at most)          tokens in       tokens out    cost",
        ]
        total = 0.0
        for agent, e in est.items():
            c = cost_of(prices, agent, e.tokens_in, e.tokens_out)
            total += c or 0.0
            money = f"${c:,.2f}" if c is not None else "-"
            lines.append(
                f"{agent:<12} {self.agent_names[agent]:<34} {e.calls:>8,.0f} ({e.calls_max:>9,.0f})  "
                f"{e.tokens_in:>14,.0f}  {e.tokens_out:>14,.0f}    {money}"
            )
        if prices:
            lines.append(
                f"{'total':<12} {'':<34} {sum(e.calls for e in est.values()):>8,.0f}"
                f" ({sum(e.calls_max for e in est.values()):>9,.0f})  "
                f"{sum(e.tokens_in for e in est.values()):>14,.0f}  {sum(e.tokens_out for e in est.values()):>14,.0f}    "
                f"${total:,.2f}"
            )
        else:
            lines.append("cost         give --price IN,OUT (or ROLE=IN,OUT) in USD per million tokens for the cost")
        return "\n".join(lines + self.context_lines())

    def _worker(self, jobs, index: int, workers: int, results, progress) -> None:
        """A worker process: every ``workers``-th job from ``index``, its share of the concurrency."""
        tick = throttled(lambda: progress.put((index, self.snapshot(), self.done)))
        try:
            share = max(1, self.spec.concurrency // workers)
            if self.spec.budget is not None:
                self.spec = replace(self.spec, budget=self.spec.budget / workers)
            out = asyncio.run(self.execute(jobs[index::workers], share, tick))
            results.put((index, out, self.tallies, self.snapshot(), self.not_run, None))
        except BaseException as exc:  # noqa: BLE001 - reported by the parent as one line
            results.put((index, None, None, None, None, f"{type(exc).__name__}: {exc}"))

    def run(self) -> GenerateReport:
        if self.calls is not None:
            raise CraftMDError("a runner built on given calls runs its jobs for its harness (run_job); it writes no release")
        spec = self.spec
        start = time.monotonic()
        every = self.jobs()
        if not every:
            raise CraftMDError(self.no_jobs_message())
        jobs = self.shard_jobs(every)  # an empty shard writes an empty release (its merge still needs it)
        asyncio.run(self.check_models())  # fails here, before any chat call, on a bad server or model
        self.estimate(jobs)
        for line in context_warnings(self.largest, self.windows()):  # said before the first call: they will fail as too long
            print(f"warning: {line}", file=sys.stderr)
        batching = any(parse_name(n).provider == "vllm" for n in self.agent_names.values())
        workers = 1 if batching or not self.processes else max(1, min(spec.workers, len(jobs) or 1))
        total_units = sum(self.planned(j) for j in jobs)
        # One tick per request: the bar counts requests (no total: a conversation's length is not known
        # ahead) and shows the units done of all planned, and the counts the summary ends with.
        bar = tqdm(
            unit="req",
            desc=f"generate {self.task.name}",
            disable=not spec.progress,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.2,
        )
        latest: dict[int, tuple[Counts, int]] = {}

        def show(index: int, counts: Counts, done: int) -> None:
            latest[index] = (counts, done)
            if bar.disable:
                return
            total = Counts.total(c for c, _ in latest.values())
            bar.n = total.requests
            cost = self.cost() if workers == 1 else None
            bar.set_postfix_str(
                progress_text(total, sum(d for _, d in latest.values()), total_units, self.unit, cost), refresh=False
            )
            bar.refresh()

        try:
            if workers == 1:
                tick = throttled(lambda: show(0, self.snapshot(), self.done))
                rows = asyncio.run(self.execute(jobs, spec.concurrency, tick))
                counts = self.snapshot()
                show(0, counts, self.done)
            else:
                rows, counts = self._run_processes(jobs, workers, show)
        finally:
            bar.close()
        path = write_release(spec.out, mark(self.record(jobs, counts), spec.shard), self.tables(rows), overwrite=spec.overwrite)
        return GenerateReport(
            path=path,
            produced=self.produced(rows),
            tallies=self.tallies,
            counts=counts,
            wall_s=time.monotonic() - start,
            rows=rows,
            cost=self.cost(),
            not_run=len(self.not_run),
            notes=self.notes(),
        )

    def no_jobs_message(self) -> str:
        return "nothing to run for the selected samples"

    def _run_processes(self, jobs, workers: int, show):
        """Split the jobs over forked worker processes (one event loop each, one shared cache)."""
        ctx = multiprocessing.get_context("fork")
        results, progress = ctx.Queue(), ctx.Queue()
        procs = [
            ctx.Process(target=self._worker, args=(jobs, i, workers, results, progress), daemon=True) for i in range(workers)
        ]
        for p in procs:
            p.start()
        # pyarrow imports pandas on its first conversion (~0.4 s); do it while the workers run, not after.
        pa.array([""])
        rows: dict[str, list[dict]] = {}
        counts, errors, finished = Counts(), [], 0
        try:
            while finished < workers:
                while not progress.empty():
                    show(*progress.get())
                try:
                    index, out, tallies, final, not_run, error = results.get(timeout=0.2)
                except queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        raise CraftMDError("a generation worker process died") from None
                    continue
                finished += 1
                if error:
                    errors.append(error)
                    continue
                for table, r in out.items():
                    rows.setdefault(table, []).extend(r)
                counts.merge(final)
                self.not_run += not_run
                for agent, t in tallies.items():
                    self.tallies[agent].merge(t)
                show(index, final, sum(self.planned(j) for j in jobs[index::workers]))
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join()
        if errors:
            raise CraftMDError(f"generation worker failed: {errors[0]}")
        return rows, counts

    # --- the run record -------------------------------------------------------------------
    def record(self, jobs, counts: Counts) -> RunRecord:
        spec = self.spec
        per_agent = {**Sampling(spec.temperature, spec.top_p, spec.max_tokens, spec.seed).to_dict(), "seed_rule": "seed + trial"}
        sampling = {a: dict(per_agent) for a in self.agents}
        total = Counts.total(self.tallies.values())
        c = {
            "trials": spec.trials,
            "jobs": len(jobs),
            "requests": {a: t.requests for a, t in self.tallies.items()},
            "tokens_in": {a: t.tokens_in for a, t in self.tallies.items()},
            "tokens_out": {a: t.tokens_out for a, t in self.tallies.items()},
            "refusals": total.refusals,
            "failures": total.failures,
            "failures_by_reason": dict(sorted(total.reasons.items())),
            # per role, the model names its server's replies gave (a reply from another model is a failure, named here)
            "served_models": {a: dict(sorted(t.served.items())) for a, t in self.tallies.items() if t.served},
        }
        unlisted = {a: t.unlisted for a, t in self.tallies.items() if t.unlisted}
        if unlisted:  # per role, the answers whose model rests on the reply's name alone (the server lists no models)
            c["model_named_by_reply_only"] = unlisted
        if self.not_run:
            c["not_run"] = {
                "jobs": len(self.not_run),
                "ids": sorted(self.not_run),
                "why": f"the budget of ${spec.budget:,.2f} was reached",
            }
        record = RunRecord(
            release=Path(spec.out).name,
            kind="generated",
            task=self.task.name,
            model=spec.doctor,
            prompt_set=self.prompts.describe(),
            protocol=run_protocol(
                self.task,
                self.prompts.describe(),
                dict(self.agent_names),
                spec.trials,
                answer_rules(self.task),
                images=self.shows_images(),
                options=self.task.protocol_options(self.options),
            ),
            sampling=sampling,
            seed=spec.seed,
            models=dict(self.agent_names),
            roles={
                a: {
                    "model": n,
                    **self.servers.get(n, {"base_url": None}),
                    **({"served": spec.served[n]} if n in spec.served else {}),  # a local model the run started (--serve)
                    "sampling": sampling[a],
                }
                for a, n in self.agent_names.items()
            },
            counts=c,
            notes={"providers": {a: parse_name(n).provider for a, n in self.agent_names.items()}},
        )
        if spec.budget is not None:
            record.notes["budget_usd"] = spec.budget
        return self.record_extra(record, jobs)


def case_ids_sha256(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def load_cases(dataset: Path, config: str, ids: list[str] | None, name: str = "craftmd") -> tuple[list[Sample], str]:
    """The selected samples of dataset ``name`` (natural id order) and a sha256 of the dataset file they come from."""
    return load_samples(dataset, config, ids, name=name), sha256_file(config_file(dataset, config))


def answer_row(key: dict, completion=None, blocked: tuple[str, str | None] | None = None) -> dict:
    """An ``answers`` row: ``key`` (its key columns) and the completion's response, status and error; or, ``blocked`` =
    (status, reason), one that could not be asked because what it reads (a conversation, a summary) failed."""
    if blocked:
        return {**key, "response": None, "status": blocked[0], "error": blocked[1]}
    ok = completion.status == "ok"
    return {
        **key,
        "response": completion.text if ok else None,
        "status": completion.status,
        "error": None if ok else completion.error,
    }


def runner_for(task: Task) -> type[Runner]:
    """The task's protocol, a :class:`Runner` subclass."""
    proto = task.protocol
    if proto is None:
        raise CraftMDError(f"task {task.name!r} names no protocol to generate with")
    if not (isinstance(proto, type) and issubclass(proto, Runner)):
        raise CraftMDError(f"task {task.name!r}: its protocol {task.protocol!r} is not a generation Runner")
    return proto


def runner(spec: GenerateSpec) -> Runner:
    """The task's runner for ``spec``, validated (one-line errors, nothing written, nothing sent)."""
    return runner_for(get_task(spec.task))(spec)


def generate(spec: GenerateSpec) -> GenerateReport:
    """Validate everything (one-line errors, nothing written), run, write the release."""
    return runner(spec).run()


__all__ = [
    "GenerateSpec",
    "GenerateReport",
    "Runner",
    "Estimate",
    "generate",
    "runner",
    "runner_for",
    "default_cache",
    "check_run",
    "progress_text",
    "throttled",
    "tokens",
    "load_cases",
    "answer_row",
    "case_ids_sha256",
]
