"""The episode core: a task's own protocol as reset/step, with no RL library.

:class:`Episodes` runs the doctor's side of a task's generation job as an episode and scores it with the task's own
scorers; :class:`SyncEpisodes` runs it in a thread for the synchronous APIs of the RL libraries.
"""

from __future__ import annotations

import asyncio
import math
import re
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from craftmd import CraftMDError

#: The options of an environment that are its task's options, where the task has them (:attr:`craftmd.tasks.Task.options`).
TASK_OPTIONS = ("max_turns", "max_messages", "memory_tags")
#: The name the doctor under training has in a release's run record, unless ``doctor=`` names it.
POLICY = "openai-api/policy/policy"


def check_weights(weights, allowed: tuple[str, ...] | None = None) -> dict[str, float]:
    """``{"scorer/metric": weight}`` with every weight a finite number (one line for the first that is not)."""
    if not isinstance(weights, dict):
        raise CraftMDError(f"reward_weights must be a mapping of scorer/metric to a number, not {type(weights).__name__}")
    out = {}
    for key, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise CraftMDError(f"reward weight {key!r} is {w!r}, not a finite number")
        if not isinstance(key, str) or "/" not in key:
            raise CraftMDError(f"reward weight {key!r}: name it scorer/metric (e.g. offline/correct)")
        out[key] = float(w)
    if not out:
        raise CraftMDError("reward_weights is empty: the reward would be nothing")
    return out


@dataclass
class Step:
    """What the environment answers: the doctor's next view (None when done), whether the episode ended, and the
    reward (set when it ended; None when a scorer could not score: ``info["error"]`` says why). ``info["failed"]``
    lists the episode's answers that failed (a patient's refusal or error blocks the question): the task's scorers
    grade those by their own rule (the offline grader: not correct), as ``craftmd score`` does."""

    messages: list[dict] | None
    done: bool = False
    reward: float | None = None
    info: dict = field(default_factory=dict)


class Ledger:
    """What the episodes of one task, split and options share: each case's episodes started (its next episode is its next
    trial), the finished episodes' release rows and their rewards. Each :class:`Episodes` has one of its own unless given
    one: the environment server (:mod:`craftmd.envs.serve`) gives every session's environment the same, so concurrent
    sessions number a case's trials in one sequence and write their episodes as one release."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plays: dict[int, int] = {}  # job index -> episodes started
        self.episode_rows: dict[str, dict[str, list[dict]]] = {}  # job id -> its latest episode's release rows
        self.rewards: list[dict] = []  # per finished episode: its job id, scores and reward

    def next_trial(self, index: int) -> int:
        """The number of job ``index``'s episode now starting (0 for its first)."""
        with self.lock:
            n = self.plays[index] = self.plays.get(index, -1) + 1
        return n


@dataclass
class Options:
    """What ``load_environment`` takes besides the task and split (documented in the README, "Training environments")."""

    dataset: Path
    patient: str | None = None
    solver: str | None = None
    summarizer: str | None = None
    grader: str = "offline"
    reward_weights: dict | None = None
    doctor: str = POLICY
    cases: list[str] | None = None
    max_turns: int = 60
    max_tokens: int = 512
    temperature: float = 1.0
    seed: int = 0
    base_url: str | None = None
    cache: Path | None = None  # the patient's request cache (None: the runner's default, $CRAFTMD_CACHE)
    judge: str | None = None  # encounters: the rubric judge (required)
    judge_mode: str = "dimension"  # encounters: one judge call per dimension (the method's) or per category
    closer: str | None = None  # encounters: the closure classifier (default: the patient model)
    max_messages: int = 50  # encounters: the cap on messages, both sides
    memory_tags: bool = True  # encounters: the patient's memories tagged with emotions (one call per packet)
    allow_self: bool = False  # encounters: a judge of the doctor's own family may score (recorded; craftmd score --allow-self)
    judge_options: dict | None = None  # encounters: the judge's other settings, by JudgeSpec field (discussion_tokens, ...)
    roles: dict | None = None  # the task's other roles by name -> model (those without an option of their own above)
    task_options: dict | None = None  # the task's own options (-T key=value of craftmd generate) beyond those above


def _runner_class(task):
    from craftmd.generation.runner import runner_for

    base = runner_for(task)

    class EpisodeRunner(base):
        """The task's runner with the doctor outside it: its requests go to the episode, not to a model. Work a task
        does for all its jobs before they start (the encounters' memory tags) is done per episode, when its case is
        first played (:meth:`start`)."""

        finished_tags_only = True  # the encounters' memory tags: those of the episodes' finished taggings

        def roles(self):
            return {a: n for a, n in super().roles().items() if a != "doctor"}

        def call(self, agent):
            if agent == "doctor":
                return self.doctor_call
            return super().call(agent)

        async def before(self, conn) -> None:
            """Nothing for all the jobs at once (a training split may be large): :meth:`start` does it per case."""

        def start(self, job) -> None:
            """Before an episode of ``job``: the encounters' memory tags of its patient, once (shared by its trials)."""
            if hasattr(self, "memory_tags") and self.options.memory_tags:
                self.memory_tags(job[0])  # starts its patient's tagging once

    return EpisodeRunner


def encounter_weights(weights: dict[str, float]) -> dict[str, tuple[str, ...] | None]:
    """key -> the rubric dimensions it weighs (None: every one), for the encounters' ``judge/...`` keys (one line for a
    key that is not one)."""
    from craftmd.scoring.rubric import load_catalog

    catalog = load_catalog()
    out: dict[str, tuple[str, ...] | None] = {}
    for key in weights:
        scorer, _, what = key.partition("/")
        if scorer != "judge":
            raise CraftMDError(
                f"reward weight {key!r}: the encounters reward is the judge's: judge/rubric_score, or "
                "judge/<a dimension id, category or meta-category of the rubric>"
            )
        if what == "rubric_score":
            out[key] = None
            continue
        hit = tuple(d.id for d in catalog.dimensions if what in (d.id, d.category, d.meta_category))
        if not hit:
            raise CraftMDError(
                f"reward weight {key!r}: {what!r} is no dimension id, category or meta-category of the rubric "
                "(craftmd judge --catalog lists them)"
            )
        out[key] = hit
    return out


#: The judge's settings ``judge_options`` may give (:class:`craftmd.scoring.judge.JudgeSpec`'s fields, as ``craftmd score``'s
#: judge options: ``discussion_tokens`` is its ``--max-tokens``); the judge, its mode and dimensions are options of their own.
JUDGE_OPTIONS = (
    "seed",
    "temperature",
    "discussion_tokens",
    "score_tokens",
    "max_invalid",
    "response_format",
    "concurrency",
    "max_retries",
    "timeout",
)


def judge_settings(given: dict | None) -> dict:
    """``judge_options`` checked: known settings only (one line for the first that is not)."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise CraftMDError(f"judge_options must be a mapping of the judge's settings, not {type(given).__name__}")
    unknown = sorted(set(given) - set(JUDGE_OPTIONS))
    if unknown:
        raise CraftMDError(f"unknown judge option {unknown[0]!r}; known: {', '.join(JUDGE_OPTIONS)}")
    return dict(given)


class Episodes:
    """The episodes of one task and split: ``await reset(i)`` gives the doctor's first view of case ``i``,
    ``await step(text)`` answers it, until ``done``.

    An episode is one job of the task's own generation runner (:mod:`craftmd.generation.runner`): the same
    conversation loop, the same patient prompts and model, the same ending rules, the same release rows.
    Only the doctor is different: instead of a model called by the runner, each request the protocol makes of
    the doctor becomes an *observation* (the doctor's view: OpenAI messages), and :meth:`Episodes.step` is the
    doctor's reply. Every other role (the patient, CRAFT-MD's summarizer, the consultation's solver) is a model
    the user binds as everywhere else (``openai-api/<service>/<model>``, through
    :class:`~craftmd.models.connect.Connections`). When the job ends, its rows are scored by the task's own
    scorers (:mod:`craftmd.scoring.scorers`, the code ``craftmd score`` runs, on a release written by
    :func:`craftmd.release.write_release`), and the reward is the weighted sum of the scores
    (the task's, :attr:`craftmd.tasks.Environment.reward`; ``reward_weights=`` replaces them). :meth:`Episodes.write_release` writes every
    finished episode as one release; ``craftmd score`` of it gives the rewards the episodes gave, to the bit.

    A judged task (:attr:`craftmd.tasks.Environment.judged`: the encounters): the doctor opens and meets the task's own AI patient (its memories, their emotion
    tags, its affect after every doctor turn); the episode ends by the task's rules (either side closes with ``[END]``, or
    ``max_messages``); the closure classifier labels it; then the rubric judge (``judge=``, a role bound like the others)
    scores the conversation on the dimensions that apply to the packet's objective, as ``craftmd score --scorer judge:MODEL``
    does. The reward is ``sum(w * mean((score - 1) / 3))`` over the weights' keys: ``judge/rubric_score`` (every dimension
    that applies; the default, weight 1) or ``judge/<dimension id, category or meta-category>`` (those of them that apply; a
    key none of whose dimensions applies to the packet's objective adds nothing, ``info["not_applicable"]`` names it); the
    judge is asked only the dimensions the weights name.

    The splits (:mod:`craftmd.envs.splits`): ``test`` is the benchmark itself, ``train`` the task's training cases, posed
    from a view of the dataset folder in which they stand where the benchmark's cases would (:attr:`Episodes.dataset`).
    """

    def __init__(self, task: str, split: str, options: Options, ledger: Ledger | None = None):
        from .splits import SPLITS, environment_task, open_split

        self.definition = environment_task(task)  # the task, posed as an environment
        env = self.definition.environment

        if split not in SPLITS:
            raise CraftMDError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
        o = options
        self.task, self.split, self.options = task, split, o
        if o.base_url is not None:  # only an http(s) server: never a file:// URL or another scheme
            from craftmd.models import check_url

            check_url(o.base_url if isinstance(o.base_url, str) else repr(o.base_url), "base_url", "OPENAI_API_KEY")
        declared = [r.name for r in self.definition.roles]
        if o.roles is not None and not isinstance(o.roles, dict):
            raise CraftMDError(f"roles must be a mapping of role to model, not {type(o.roles).__name__}")
        for name in o.roles or {}:
            if name not in declared or name == "doctor":
                others = ", ".join(n for n in declared if n != "doctor")
                raise CraftMDError(f"roles: the {task} environment has no role {name!r} to bind; its roles: {others}")
        for role in self.definition.roles:  # its required roles bound (the doctor is the policy under training)
            bound = getattr(o, role.name, None) or (o.roles or {}).get(role.name)
            if role.name != "doctor" and role.required and not role.default and not bound:
                raise CraftMDError(
                    f"the {task} environment needs its {role.name} bound: {role.name}='openai-api/<service>/<model>'"
                )
        if env.judged and not o.judge:
            raise CraftMDError(f"the {task} environment needs its judge bound: judge='openai-api/<service>/<model>'")
        weights = o.reward_weights if o.reward_weights is not None else {k.format(grader=o.grader): v for k, v in env.reward}
        self.weights = check_weights(weights)
        if env.judged:
            self._check_judge(o)
        else:
            self._check_answer_weights(o)
        self.split_data = open_split(self.definition, split, o.dataset)  # not built, or a training case that is a benchmark case
        self.dataset = self.split_data.dataset
        self.spec = self._spec(o)
        self.runner = _runner_class(self.definition)(self.spec)
        if env.judged:
            from craftmd.models.connect import check_names

            check_names([o.judge], self.runner.call_settings())  # its server's variable unset: one line, now
        self.jobs = self.runner.jobs()
        if not self.jobs:
            raise CraftMDError(f"no case of split {split!r} can be posed as an episode of {task}")
        self.ledger = ledger or Ledger()
        self.episode_rows, self.plays, self.rewards = self.ledger.episode_rows, self.ledger.plays, self.ledger.rewards
        self._conn = None
        self._job = None
        self.current = None  # the job of the episode last started: (case, trial, ...), a case's n-th play its trial n

    def public(self, text: str) -> str:
        """An error's ``text`` as the environment's remote clients may read it (:func:`public_message`): no path of the
        dataset, its split's view, the cache, the temporary folder or the home folder."""
        o = self.options
        paths = [o.dataset, o.cache, getattr(self, "dataset", None), tempfile.gettempdir(), Path.home()]
        return public_message(text, [*paths, *(Path(p).resolve() for p in paths if p)])

    def _check_judge(self, o: Options) -> None:
        """The encounters' judge: its name, mode and settings checked now (one line), the dimensions the weights name."""
        self.selected = encounter_weights(self.weights)
        self.scorers = [f"judge:{o.judge}"]
        from craftmd.models import parse_name
        from craftmd.scoring.judge import MODES

        parse_name(o.judge)  # a malformed name: one line
        if o.judge_mode not in MODES:
            raise CraftMDError(f"judge_mode {o.judge_mode!r}: one of {', '.join(MODES)}")
        self.judge_options = judge_settings(o.judge_options)
        from craftmd.scoring.judge import JudgeSpec

        JudgeSpec(models=[o.judge], mode=o.judge_mode, **self.judge_options).check()  # a bad setting: one line, now
        every = any(v is None for v in self.selected.values())
        self.dimensions = None if every else sorted({d for v in self.selected.values() for d in v})

    def _spec(self, o: Options):
        """The generation spec of the task's own runner, the doctor and the other roles bound as ``o`` says."""
        from craftmd.generation.runner import GenerateSpec

        declared = {r.name for r in self.definition.roles}  # an option of another task's role is not this task's role
        given = (("summarizer", o.summarizer), ("solver", o.solver), ("closer", o.closer))
        roles = {**{k: v for k, v in given if v and k in declared}, **{k: v for k, v in (o.roles or {}).items() if v}}
        options = {k: getattr(o, k) for k in TASK_OPTIONS if k in self.definition.options.model_fields}
        if o.task_options is not None:
            if not isinstance(o.task_options, dict):
                raise CraftMDError(f"task_options must be a mapping of the task's options, not {type(o.task_options).__name__}")
            options.update(o.task_options)  # an unknown key or a bad value: one line (Task.parse_options)
        return GenerateSpec(
            dataset=self.dataset,
            out=Path(tempfile.gettempdir()) / "craftmd-env",
            doctor=o.doctor,
            patient=o.patient,
            task=self.task,
            roles=roles,
            options=options,
            config=self.split_data.config or "all",
            cases=o.cases,
            experiments=[self.definition.environment.experiment] if self.definition.environment.experiment else None,
            max_tokens=o.max_tokens,
            temperature=o.temperature,
            seed=o.seed,
            base_url=o.base_url,
            cache=o.cache,
            progress=False,
            overwrite=True,
        )

    def _check_answer_weights(self, o: Options) -> None:
        """A task rewarded by its answers' scorers (CRAFT-MD, the consultation): each weight names a scorer of the episode's
        answers (or the consultation's key recall) and a metric it writes."""
        from craftmd.scoring.scorers import get_scorer

        grader = get_scorer(o.grader)  # an unknown grader: one line
        if grader.unit != "answer":
            raise CraftMDError(f"grader {o.grader!r} does not grade answers")
        self.scorers = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in self.weights))
        fmt = self.definition.environment.experiment.split(":")[1]
        for key in self.weights:
            name, metric = key.rsplit("/", 1)
            s = get_scorer(name)  # an unknown scorer: one line
            if s.fits(self.definition) is not None or (s.unit == "answer" and s.formats and fmt not in s.formats):
                raise CraftMDError(
                    f"reward weight {key!r}: scorer {name} does not score this environment's episodes "
                    f"({self.task}, {fmt} answers)"
                )
            written = (
                *s.metrics,
                *getattr(getattr(s, "rules", None), "DIALOGUE_METRICS", ()),
                *getattr(getattr(s, "rules", None), "SHARE_METRICS", ()),
            )
            if metric not in written:
                raise CraftMDError(f"reward weight {key!r}: scorer {name} writes {', '.join(written)}, not {metric}")

    def case_id(self, index: int) -> str:
        """The case episode ``index`` poses (modulo the number of jobs, as :meth:`reset` takes it)."""
        return self.runner.sample_id(self.jobs[index % len(self.jobs)])

    def __len__(self) -> int:
        return len(self.jobs)

    # --- the episode --------------------------------------------------------------------------------
    async def _open(self) -> None:
        if self._conn is None:
            from craftmd.models.base import Completion
            from craftmd.models.connect import Connections

            names = self.runner.model_names()
            self._conn = Connections(self.runner.call_settings(), names)
            self.runner.callers = {n: self._conn.caller(n) for n in names}

            async def doctor(messages, sampling, priority: int = 0):
                self._asks.put_nowait([dict(m) for m in messages])
                return Completion(await self._replies.get(), "ok")

            self.runner.doctor_call = doctor

    async def reset(self, index: int) -> Step:
        """Start the episode of job ``index`` (taken modulo the number of jobs, so a trainer may count on)."""
        await self._open()
        if self._job is not None and not self._job.done():
            self._job.cancel()
        self._asks: asyncio.Queue = asyncio.Queue()
        self._replies: asyncio.Queue = asyncio.Queue()
        from craftmd.release import MAX_TRIALS

        # A case's n-th episode is its trial n (the patient's sampling seed is seed + trial, as in a run), so the
        # release holds each of its episodes; past the release's trials the oldest is replaced.
        index %= len(self.jobs)
        n = self.ledger.next_trial(index)
        job = self.jobs[index]
        self.current = (job[0], n % MAX_TRIALS, *job[2:])
        self.runner.start(self.current)
        self._job = asyncio.ensure_future(self.runner.run_job(self.current))
        return await self._next()

    async def step(self, text: str) -> Step:
        """The doctor's reply to the last view."""
        if self._job is None or self._job.done():
            raise CraftMDError(
                "no episode in progress: call reset first (an OpenEnv server's HTTP /step starts from a new environment: "
                "play episodes over its WebSocket session)"
            )
        if not isinstance(text, str):
            raise CraftMDError(f"the doctor's reply must be text, not {type(text).__name__}")
        self._replies.put_nowait(text)
        return await self._next()

    async def _next(self) -> Step:
        ask = asyncio.ensure_future(self._asks.get())
        await asyncio.wait({ask, self._job}, return_when=asyncio.FIRST_COMPLETED)
        if ask.done():
            return Step(ask.result())
        ask.cancel()
        rows = self._job.result()  # a protocol error propagates as it would in a run
        self._job = None
        return await asyncio.get_running_loop().run_in_executor(None, self._finish, rows)

    # --- the reward ---------------------------------------------------------------------------------
    def _finish(self, rows: dict[str, list[dict]]) -> Step:
        job_id = self.runner.job_id(self.current)
        with tempfile.TemporaryDirectory(prefix="craftmd-episode-") as tmp:
            scored = self.score(self.write(Path(tmp) / "episode", rows))
        info: dict = {"job": job_id}
        if self.definition.environment.judged:
            reward, missing = self._rubric_reward(scored, info)
            conv = rows["conversations"][0]
            info["ended"] = conv["ended"]
            if conv["ended"] in ("refusal", "error"):
                info["failed"] = [f"{conv['ended']}: {conv['error']}"]
        else:
            scores: dict[str, list] = {}
            for r in scored:
                scores.setdefault(f"{r['scorer']}/{r['metric']}", []).append(r["value"])
            info["scores"] = scores
            reward, missing = 0.0, []
            for key, w in self.weights.items():
                values = scores.get(key)
                if not values or any(v is None for v in values):
                    missing.append(key)
                    continue
                reward += w * sum(values) / len(values)
            failed = [f"{r['status']}: {r['error']}" for r in rows.get("answers", []) if r["status"] != "ok"]
            if failed:  # the task's scorers grade a failed answer by their own rule (the reward is theirs); said here
                info["failed"] = failed
        self.episode_rows[job_id] = rows
        if missing:
            info["error"] = f"no score for {', '.join(missing)} (the episode's conversation or answer failed)"
        self.rewards.append({**info, "reward": None if missing else reward})
        return Step(None, True, None if missing else reward, info)

    def _rubric_reward(self, scored: list[dict], info: dict) -> tuple[float, list[str]]:
        """The encounters' reward from the judge's rows: ``sum(w * fsum((s - 1) / 3) / n)`` over the weights' keys, each
        over its dimensions the judge scored (those that apply to the packet's objective)."""
        from craftmd.scoring.judge import METRIC

        by_dim = {r["dimension"]: r["value"] for r in scored if r["metric"] == METRIC}
        info["objective"] = self.current[0]["objective"]
        info["scores"] = by_dim
        reward, missing, skipped = 0.0, [], []
        for key, w in self.weights.items():
            dims = self.selected[key]
            values = [v for d, v in by_dim.items() if dims is None or d in dims]
            if not values:
                skipped.append(key)
            elif any(v is None for v in values):
                missing.append(key)
            else:
                reward += w * (math.fsum((v - 1.0) / 3.0 for v in values) / len(values))
        if skipped:
            info["not_applicable"] = skipped
        return reward, missing

    def score(self, release_dir: Path) -> list[dict]:
        """The score rows ``craftmd score`` writes for the reward's scorers in ``release_dir`` (a judge writes them into
        the release itself: they are read back from it)."""
        from craftmd.release import read_release
        from craftmd.scoring.scorers import Context, scorers

        rel = read_release(release_dir)
        o = self.options
        options = {}
        if self.definition.environment.judged:
            options = {**self.judge_options, "mode": o.judge_mode, "dimensions": self.dimensions}
        ctx = Context(
            self.dataset, base_url=self.spec.base_url, cache=o.cache, progress=False, allow_self=o.allow_self, options=options
        )
        out: list[dict] = []
        for s in scorers(self.scorers):
            if s.applies(rel) is not None:
                continue
            s.check(rel, ctx)
            rows = s.run(rel, ctx).rows  # only craftmd score writes: a scorer returns its rows
            out += [r for r in rows.to_pylist() if r["scorer"] in s.writes()]
        return out

    def write(self, out: Path, rows: dict[str, list[dict]] | None = None, overwrite: bool = False) -> Path:
        """The release of ``rows`` (default: every finished episode), written by the runner's writer."""
        from craftmd.models.calls import Counts
        from craftmd.release import write_release

        rows = self.rows if rows is None else rows
        runner = self.runner
        record = runner.record(self.jobs, Counts.total(runner.tallies.values()))
        record.release = Path(out).name
        trials = 1 + max((r["trial"] for t in rows.values() for r in t), default=0)
        record.counts = {**record.counts, "trials": trials}
        if record.protocol is not None:  # the episodes' trials, as the counts say
            record.protocol = record.protocol.model_copy(update={"trials": trials})
        doctor = self.options.doctor  # the policy under training: answered through step(), not called by the runner
        record.models = {"doctor": doctor, **record.models}
        record.roles = {
            "doctor": {"model": doctor, "base_url": None, "sampling": record.sampling.get("doctor", {})},
            **record.roles,
        }
        record.notes = {
            **record.notes,
            "environment": f"craftmd.envs: {self.task} on split {self.split}; the doctor is the policy "
            "under training, its replies given to step()",
        }
        return write_release(out, record, runner.tables(rows), overwrite=overwrite)

    @property
    def rows(self) -> dict[str, list[dict]]:
        """The release rows of every finished episode (each case's latest 63 episodes, in the order they finished)."""
        out: dict[str, list[dict]] = {}
        for rows in self.episode_rows.values():
            for table, r in rows.items():
                out.setdefault(table, []).extend(r)
        return out

    def write_release(self, out: Path | str, overwrite: bool = False) -> Path:
        """Every finished episode as one release (``craftmd score`` of it gives the episodes' rewards)."""
        if not self.episode_rows:
            raise CraftMDError("no finished episode to write")
        return self.write(Path(out), overwrite=overwrite)

    async def aclose(self) -> None:
        if self._job is not None and not self._job.done():
            self._job.cancel()
        if self._conn is not None:
            await self._conn.aclose()
            self._conn = None


class SyncEpisodes:
    """:class:`Episodes` for synchronous callers (the RL libraries' APIs, :mod:`craftmd.envs.openenv`): its coroutines run on
    an event loop of its own, in a thread."""

    def __init__(self, episodes: Episodes):
        self.episodes = episodes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="craftmd-env")
        self._thread.start()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reset(self, index: int) -> Step:
        return self._run(self.episodes.reset(index))

    def step(self, text: str) -> Step:
        return self._run(self.episodes.step(text))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self.episodes.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()


#: An absolute local path in a message (not a URL's path): ``/srv/data/all/test.parquet``, ``C:\\data``.
_LOCAL_PATH = re.compile(r"(?<![\w:/.~<>-])(?:~|[A-Za-z]:)?[/\\](?:[^\s'\"/\\]+[/\\])+[^\s'\"/\\,;)]*")


def public_message(text: str, paths=()) -> str:
    """``text`` as a remote client may read it: one line, every local path in it (``paths`` first, the folders it is
    known by, then any absolute path) shown as ``<path>``: a server never tells its clients where its files are."""
    for p in sorted({str(x) for x in paths if x}, key=len, reverse=True):
        text = text.replace(p, "<path>")
    text = re.sub(r"<path>[/\\][^\s'\",;)]*", "<path>", text)  # a file in a known folder: the folder alone
    return " ".join(_LOCAL_PATH.sub("<path>", text).split())


def episodes(task: str, split: str = "test", ledger: Ledger | None = None, **options) -> Episodes:
    """The library-independent environment of ``task`` on ``split`` (options: :class:`Options`' fields; ``ledger``: one
    shared with other environments of the same task, split and options, :class:`Ledger`)."""
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise CraftMDError(f"unknown environment option {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if "dataset" not in options:
        raise CraftMDError("an environment needs the built dataset: dataset='DIR' (craftmd build --out DIR)")
    options["dataset"] = Path(options["dataset"])
    return Episodes(task, split, replace(Options(dataset=options["dataset"]), **options), ledger)


__all__ = [
    "Episodes",
    "SyncEpisodes",
    "Step",
    "Options",
    "Ledger",
    "episodes",
    "public_message",
    "check_weights",
    "TASK_OPTIONS",
    "POLICY",
    "JUDGE_OPTIONS",
]
