"""The episode core: a task's own protocol as reset/step, with no RL library.

An episode is one job of the task's own generation runner (:mod:`craftmd.generation.runner`): the same
conversation loop, the same patient prompts and model, the same ending rules, the same release rows.
Only the doctor is different: instead of a model called by the runner, each request the protocol makes of
the doctor becomes an *observation* (the doctor's view: OpenAI messages), and :meth:`Episodes.step` is the
doctor's reply. Every other role (the patient, CRAFT-MD's summarizer, the consultation's solver) is a model
the user binds as everywhere else (``openai-api/<service>/<model>``, through
:class:`~craftmd.models.connect.Connections`). When the job ends, its rows are scored by the task's own
scorers (:mod:`craftmd.scoring.scorers`, the code ``craftmd score`` runs, on a release written by
:func:`craftmd.release.write_release`), and the reward is the weighted sum of the scores
(:data:`DEFAULT_WEIGHTS`; ``reward_weights=`` replaces them). :meth:`Episodes.write_release` writes every
finished episode as one release; ``craftmd score`` of it gives the rewards the episodes gave, to the bit.

The core is async (:meth:`Episodes.reset`, :meth:`Episodes.step`); :class:`SyncEpisodes` runs it on a loop of
its own in a thread, for the synchronous APIs of the RL libraries (:mod:`craftmd.envs.openenv`).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from craftmd import CraftMDError

#: task -> (the experiment an episode runs, the split -> dataset config).
TASKS = {
    "craftmd": {"experiment": "multiturn:frq", "splits": {"test": "all", "train": "craftmd_train"}},
    "consultation": {"experiment": "consult_100:frq", "splits": {"test": "all", "train": "consult_train"}},
}
#: task -> the reward's weights, by ``scorer/metric`` (``{grader}``: the grader named by ``grader=``).
DEFAULT_WEIGHTS = {
    "craftmd": {"{grader}/correct": 1.0},
    "consultation": {"{grader}/correct": 1.0},
}
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


def _runner_class(task: str):
    from craftmd.generation.runner import runner_for
    from craftmd.tasks import get_task

    base = runner_for(get_task(task))

    class EpisodeRunner(base):
        """The task's runner with the doctor outside it: its requests go to the episode, not to a model."""

        def roles(self):
            return {a: n for a, n in super().roles().items() if a != "doctor"}

        def call(self, agent):
            if agent == "doctor":
                return self.doctor_call
            return super().call(agent)

    return EpisodeRunner


class Episodes:
    """The episodes of one task and split: ``await reset(i)`` gives the doctor's first view of case ``i``,
    ``await step(text)`` answers it, until ``done``."""

    def __init__(self, task: str, split: str, options: Options):
        if task not in TASKS:
            raise CraftMDError(f"unknown task {task!r} for an environment; known: {', '.join(TASKS)}")
        splits = TASKS[task]["splits"]
        if split not in splits:
            raise CraftMDError(f"unknown split {split!r}; known: {', '.join(splits)}")
        from craftmd.dataset import config_file
        from craftmd.generation.runner import GenerateSpec
        from craftmd.scoring.scorers import get_scorer

        o = options
        self.task, self.split, self.options = task, split, o
        config = splits[split]
        if not Path(o.dataset).is_dir():
            raise CraftMDError(f"dataset {o.dataset} does not exist: run craftmd build --out {o.dataset}")
        if not config_file(o.dataset, config).exists():
            raise CraftMDError(f"split {split!r} of {task} (config {config}) is not built in {o.dataset}: run craftmd build --out {o.dataset}")
        if (task, split) == ("consultation", "train"):  # consult_train's rows are dialogues, not samples the runner poses
            raise CraftMDError("split 'train' of consultation (consult_train) is not an environment yet: its cases are not samples "
                               "the runner poses nor answer keys craftmd score grades; use split='test'")
        if not o.patient:
            raise CraftMDError(f"the {task} environment needs its patient bound: patient='openai-api/<service>/<model>'")
        if task == "consultation" and not o.solver:
            raise CraftMDError("the consultation environment needs its solver bound: solver='openai-api/<service>/<model>'")
        grader = get_scorer(o.grader)  # an unknown grader: one line
        if grader.unit != "answer":
            raise CraftMDError(f"grader {o.grader!r} does not grade answers")
        weights = o.reward_weights if o.reward_weights is not None else {
            k.format(grader=o.grader): v for k, v in DEFAULT_WEIGHTS[task].items()}
        self.weights = check_weights(weights)
        self.scorers = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in self.weights))
        fmt = TASKS[task]["experiment"].split(":")[1]
        for key in self.weights:
            name, metric = key.rsplit("/", 1)
            s = get_scorer(name)  # an unknown scorer: one line
            if (s.tasks is not None and task not in s.tasks) or (s.unit == "answer" and s.formats and fmt not in s.formats):
                raise CraftMDError(f"reward weight {key!r}: scorer {name} does not score this environment's episodes ({task}, {fmt} answers)")
            written = (*s.metrics, *getattr(getattr(s, "rules", None), "DIALOGUE_METRICS", ()),
                       *getattr(getattr(s, "rules", None), "SHARE_METRICS", ()))
            if metric not in written:
                raise CraftMDError(f"reward weight {key!r}: scorer {name} writes {', '.join(written)}, not {metric}")
        self.spec = GenerateSpec(dataset=Path(o.dataset), out=Path(tempfile.gettempdir()) / "craftmd-env", doctor=o.doctor,
                                 patient=o.patient, task=task, roles={k: v for k, v in (("summarizer", o.summarizer), ("solver", o.solver)) if v},
                                 config=config, cases=o.cases, experiments=[TASKS[task]["experiment"]], options={"max_turns": o.max_turns},
                                 max_tokens=o.max_tokens, temperature=o.temperature, seed=o.seed, base_url=o.base_url,
                                 cache=o.cache, progress=False, overwrite=True)
        self.runner = _runner_class(task)(self.spec)
        self.jobs = self.runner.jobs()
        if not self.jobs:
            raise CraftMDError(f"no case of split {split!r} can be posed as an episode of {task}")
        self.episode_rows: dict[str, dict[str, list[dict]]] = {}  # job id -> its latest episode's release rows
        self.plays: dict[int, int] = {}  # job index -> episodes started
        self.rewards: list[dict] = []  # per finished episode: its job id, scores and reward
        self._conn = None
        self._job = None

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
        n = self.plays[index] = self.plays.get(index, -1) + 1
        case, _, flag = self.jobs[index]
        self._current = (case, n % MAX_TRIALS, flag)
        self._job = asyncio.ensure_future(self.runner.run_job(self._current))
        return await self._next()

    async def step(self, text: str) -> Step:
        """The doctor's reply to the last view."""
        if self._job is None or self._job.done():
            raise CraftMDError("no episode in progress: call reset first")
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
        job_id = self.runner.job_id(self._current)
        with tempfile.TemporaryDirectory(prefix="craftmd-episode-") as tmp:
            scores = self.score(self.write(Path(tmp) / "episode", rows))
        reward, missing = 0.0, []
        for key, w in self.weights.items():
            values = scores.get(key)
            if not values or any(v is None for v in values):
                missing.append(key)
                continue
            reward += w * sum(values) / len(values)
        self.episode_rows[job_id] = rows
        info = {"job": job_id, "scores": scores}
        failed = [f"{r['status']}: {r['error']}" for r in rows.get("answers", []) if r["status"] != "ok"]
        if failed:  # the task's scorers grade a failed answer by their own rule (the reward is theirs); said here
            info["failed"] = failed
        if missing:
            info["error"] = f"no score for {', '.join(missing)} (the episode's conversation or answer failed)"
        self.rewards.append({**info, "reward": None if missing else reward})
        return Step(None, True, None if missing else reward, info)

    def score(self, release_dir: Path) -> dict[str, list[float | None]]:
        """``scorer/metric`` -> its values in ``release_dir``, by the scorers ``craftmd score`` runs."""
        from craftmd.release import read_release
        from craftmd.scoring.scorers import Context, scorers

        rel = read_release(release_dir)
        ctx = Context(self.spec.dataset, base_url=self.spec.base_url, progress=False)
        out: dict[str, list] = {}
        for s in scorers(self.scorers):
            why = s.applies(rel)
            if why is not None:
                continue
            for r in s.run(rel, ctx).rows.to_pylist():
                out.setdefault(f"{r['scorer']}/{r['metric']}", []).append(r["value"])
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
        doctor = self.options.doctor  # the policy under training: answered through step(), not called by the runner
        record.models = {"doctor": doctor, **record.models}
        record.roles = {"doctor": {"model": doctor, "base_url": None, "sampling": record.sampling.get("doctor", {})}, **record.roles}
        record.notes = {**record.notes, "environment": f"craftmd.envs: {self.task} on split {self.split}; the doctor is the policy "
                                                        "under training, its replies given to step()"}
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
    """:class:`Episodes` for synchronous callers: its coroutines run on an event loop of its own, in a thread."""

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


def episodes(task: str, split: str = "test", **options) -> Episodes:
    """The library-independent environment of ``task`` on ``split`` (options: :class:`Options`' fields)."""
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise CraftMDError(f"unknown environment option {unknown[0]!r}; known: {', '.join(sorted(known))}")
    if "dataset" not in options:
        raise CraftMDError("an environment needs the built dataset: dataset='DIR' (craftmd build --out DIR)")
    options["dataset"] = Path(options["dataset"])
    return Episodes(task, split, replace(Options(dataset=options["dataset"]), **options))


__all__ = ["Episodes", "SyncEpisodes", "Step", "Options", "episodes", "check_weights", "TASKS", "DEFAULT_WEIGHTS", "POLICY"]
