"""The OpenEnv adapter: :class:`DoctorEnvironment` is an ``openenv.core.Environment`` over the episode core.

An action is the doctor's reply (:class:`DoctorAction`: ``message``); an observation is the doctor's view of
the conversation (:class:`DoctorObservation`: ``messages``, OpenAI chat messages where the patient speaks as
``user``), with ``done`` and ``reward`` (the task's scorers, weighted) when the episode ends and, in
``metadata``, the episode's job and scores. ``reset(seed=i)`` poses case ``i`` of the split (modulo its size);
``reset()`` the next case in order. Serve it with OpenEnv's own server (``openenv.core.env_server.create_app``).
"""

from __future__ import annotations

from typing import Any, Optional

from craftmd import CraftMDError

try:
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
except ImportError:  # pragma: no cover - the extra is missing
    raise CraftMDError("the training environments need OpenEnv: pip install 'craftmd[rl]' (make rl: .venv-rl)") from None

from .core import Episodes, Step, SyncEpisodes


class DoctorAction(Action):
    """The doctor's reply."""

    message: str


class DoctorObservation(Observation):
    """The doctor's view: the conversation so far as chat messages (empty when the episode has ended)."""

    messages: list[dict[str, Any]] = []


class DoctorEnvironment(Environment[DoctorAction, DoctorObservation, State]):
    """One task on one split; each instance has its own episodes (and its own patient connections)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, episodes: Episodes):
        super().__init__()
        self.episodes = episodes
        self._core = SyncEpisodes(episodes)
        self._state = State()
        self._next = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> DoctorObservation:
        index = self._next if seed is None else int(seed)
        self._next = index + 1
        step = self._core.reset(index)
        job = self.episodes.runner.job_id(self.episodes.jobs[index % len(self.episodes)])
        self._state = State(episode_id=episode_id or job, step_count=0)
        return self._observe(step)

    def step(self, action: DoctorAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DoctorObservation:
        step = self._core.step(action.message)
        self._state.step_count += 1
        return self._observe(step)

    @property
    def state(self) -> State:
        return self._state

    def _observe(self, step: Step) -> DoctorObservation:
        return DoctorObservation(messages=step.messages or [], done=step.done, reward=step.reward, metadata=step.info)

    def write_release(self, out, overwrite: bool = False):
        """Every finished episode as a release (``craftmd score`` of it gives the rewards these episodes gave)."""
        return self.episodes.write_release(out, overwrite=overwrite)

    def close(self) -> None:
        self._core.close()


__all__ = ["DoctorEnvironment", "DoctorAction", "DoctorObservation"]
