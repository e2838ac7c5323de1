"""The taskset (a task's cases on a split, as the package's environment server poses them) and the env that plays one
case as one episode: the doctor under evaluation or training is verifiers' agent, everyone else (the patient, the
solver, the judge) and the reward are the server's.

Each turn the doctor is sent what verifiers' OpenEnv environments send (``verifiers.v1.tasksets.openenv``): a JSON object
of the server's observation (the doctor's view of the conversation, OpenAI chat messages) and the action's schema; its
reply is read by verifiers' own ``parse_action``, as raw text, since the action has one required field (``message``).
The episode's reward is the server's (the task's own scorers, what ``craftmd score`` gives), recorded as
``craftmd_reward``; an episode the server could not score (no reward) or the doctor left before its end fails, it is not
given a score.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig
from verifiers.v1.tasksets.openenv.taskset import parse_action

from .server import ServerError, served, started, stop_all

#: This environment's id: ``vf-eval craftmd-verifiers`` imports this package.
ID = "craftmd-verifiers"


class CraftMDTasksetConfig(vf.TasksetConfig):
    craftmd_task: str = "craftmd"
    """The package's task (craftmd, consultation, encounters: the server names the ones it knows)."""
    split: str = "test"
    """``test``: the benchmark (the default for evaluation); ``train``: the task's training cases (``load_environment``'s
    default, for training)."""
    options: dict[str, Any] = {}
    """The environment's options (``craftmd.envs.load_environment``'s: ``dataset``, ``patient``, ``solver``, ``judge``,
    ``reward_weights``, ``cache``, ...), checked by the server."""
    python: str | None = None
    """The Python where ``craftmd[rl]`` is installed, which runs the server (default: ``$CRAFTMD_PYTHON``)."""
    base_url: str | None = None
    """A server already running (``python -m craftmd.envs.serve``) instead of one started for the run."""
    release: str | None = None
    """Where the server started for the run writes its episodes as a release when the run ends (``craftmd score`` of
    it gives the rewards back)."""
    startup_timeout: float = 900.0
    """Seconds the server may take to start (it opens the split and checks the options first)."""
    step_timeout: float = 900.0
    """Seconds one step may take (the patient's reply, or the scoring at an episode's end)."""


class CraftMDData(vf.TaskData):
    base_url: str
    """The server that plays the case."""
    seed: int
    """The case's position on the server's split (``reset(seed=...)`` poses it)."""


class CraftMDTask(vf.Task[CraftMDData]):
    """One case of the split; its reward is recorded by :class:`CraftMDEnv`."""


class CraftMDTaskset(vf.Taskset[CraftMDTask, CraftMDTasksetConfig]):
    def load(self) -> Iterator[CraftMDTask]:
        c = self.config
        if c.base_url:
            if c.options or c.python or c.release:
                raise ServerError("with base_url the server's options are its own: drop options, python and release")
            url = c.base_url.rstrip("/")
        else:
            url = started(c.python, c.craftmd_task, c.split, dict(c.options), c.release, c.startup_timeout).url
        info = served(url)
        if (info.get("task"), info.get("split")) != (c.craftmd_task, c.split):
            raise ServerError(
                f"{url} serves {info.get('task')} on split {info.get('split')}, not {c.craftmd_task} on split {c.split}"
            )
        for i, case in enumerate(info["cases"]):
            data = CraftMDData(id=case, name=f"{c.craftmd_task}/{c.split}/{case}", base_url=url, seed=i)
            yield CraftMDTask(data, c.task)


class CraftMDEnvConfig(vf.EnvConfig):
    doctor: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig())
    """The doctor: a plain chat (verifiers' ``null`` harness), no tools, no code run, in a local process."""


class CraftMDEnv(vf.Env[CraftMDEnvConfig]):
    async def run(self, task: CraftMDTask, agents) -> None:
        from openenv import GenericEnvClient

        data = task.data
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.get(f"{data.base_url}/schema")
            answer.raise_for_status()
        schema = answer.json()["action"]
        timeout = self.config.taskset.step_timeout
        async with GenericEnvClient(base_url=data.base_url, message_timeout_s=timeout) as client:
            result = await client.reset(seed=data.seed)
            async with agents.doctor.interaction(task) as talk:
                while not result.done:
                    said = await talk.turn(json.dumps({"observation": result.observation, "action_schema": schema}))
                    if said.terminated:
                        raise RuntimeError(f"the doctor stopped before the episode of {data.id} ended: no reward")
                    result = await client.step(parse_action(said.last_reply, schema))
                if result.reward is None:
                    raise RuntimeError(f"the server could not score the episode of {data.id} (its reward is None)")
                talk.trace.record_reward("craftmd_reward", float(result.reward))

    async def stop(self) -> None:
        """The servers started for the run stop; one that was asked for a release and wrote none fails the run."""
        failures = stop_all()
        if failures:
            raise ServerError(failures[0])


def load_environment(task: str = "craftmd", split: str = "train", **options: Any) -> CraftMDEnv:
    """The environment of ``task`` on ``split`` (``train`` by default: what a trainer loads; ``vf-eval`` evaluates on
    ``test`` by default). ``options``: the taskset's settings (``python``, ``base_url``, ``release``, ``startup_timeout``,
    ``step_timeout``), the rest the environment's own (``dataset``, ``patient``, ...)."""
    fields = set(CraftMDTasksetConfig.model_fields) - {"craftmd_task", "split", "options", "id", "task", "system_prompt"}
    own = {k: v for k, v in options.items() if k in fields}
    rest = {k: v for k, v in options.items() if k not in fields}
    taskset = {"id": ID, "craftmd_task": task, "split": split, "options": rest, **own}
    return vf.load_environment(vf.resolve_env_config({"taskset": taskset}))


__all__ = ["CraftMDTaskset", "CraftMDEnv", "load_environment"]
