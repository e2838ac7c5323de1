"""The OpenEnv adapter: :class:`DoctorEnvironment` is an ``openenv.core.Environment`` over the episode core.

An action is the doctor's reply (:class:`DoctorAction`: ``message``); an observation is the doctor's view of
the conversation (:class:`DoctorObservation`: ``messages``, OpenAI chat messages where the patient speaks as
``user``), with ``done`` and ``reward`` (the task's scorers, weighted) when the episode ends and, in
``metadata``, the episode's job and scores. ``reset(seed=i)`` poses case ``i`` of the split (modulo its size);
``reset()`` the next case in order. Serve it with OpenEnv's own server (``openenv.core.env_server.create_app``).

A client's mistake (a step before a reset: the server's stateless HTTP ``/step`` starts from a new environment) is an
HTTP 409 with one line, not a 500; no error a client reads names a local path (:meth:`~.core.Episodes.public`).
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
        step = self._guarded(self._core.reset, index)
        job = self.episodes.runner.job_id(self.episodes.current)  # case_id/trial: a case played again is its next trial
        self._state = State(episode_id=episode_id or job, step_count=0)
        return self._observe(step)

    def step(self, action: DoctorAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DoctorObservation:
        step = self._guarded(self._core.step, action.message)
        self._state.step_count += 1
        return self._observe(step)

    def _guarded(self, call, *args):
        """``call(*args)``; an error raised as its remote client may read it: a :class:`CraftMDError` (the client's
        mistake) as HTTP 409 with its one line, anything else as the server's failure; local paths never in either."""
        try:
            return call(*args)
        except CraftMDError as exc:
            raise _client_error(self.episodes.public(str(exc))) from None
        except Exception as exc:
            raise RuntimeError(self.episodes.public(f"{type(exc).__name__}: {exc}")) from exc

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


def _client_error(message: str) -> Exception:
    """The error a client's mistake is answered with: FastAPI's ``HTTPException`` (409, its one line) under OpenEnv's
    server; where FastAPI is not installed, a :class:`CraftMDError`."""
    try:
        from fastapi import HTTPException
    except ImportError:  # pragma: no cover - OpenEnv's server needs FastAPI
        return CraftMDError(message)
    return HTTPException(status_code=409, detail=message)


__all__ = ["DoctorEnvironment", "DoctorAction", "DoctorObservation"]
