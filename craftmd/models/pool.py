"""Server pools: one service served by several OpenAI-compatible servers.

``<SERVICE>_BASE_URL`` may list several servers, comma-separated
(``LOCAL_BASE_URL=http://gpu0:8000/v1,http://gpu1:8000/v1``): ``openai-api/<service>/<model>``
is then a :class:`PoolModel`, one client per server, and the run spreads its work over them.

- **A conversation stays on one server.** The runner runs each conversation (a CRAFT-MD job,
  an encounter) inside :func:`in_conversation` (the context variable
  :data:`craftmd.models.calls.CONVERSATION` holds its :class:`Pin`); its first request pins it
  to a server, and every later turn, summary and question of it goes there, so the server's
  prefix cache reuses the history it already holds. When it ends, its server is free for the
  next. (A runner that only names its conversations, a string in the variable, gets them
  pinned too, counted by their waiting requests alone.)
- **The least-busy server takes the next conversation**: the one with the fewest pinned
  conversations and waiting requests for its concurrency limit (``--concurrency
  SERVICE=N`` is each server's own limit). A request outside any conversation (a judge, a
  grader, a memory-tagging step) goes to the least-busy server too.
- **A server that fails takes no new work.** A refused connection takes it out at once; a
  5xx, a timeout or a dropped connection takes it out when a request has used up its
  retries on it. Its conversations move to the others, and their pending requests (those
  in flight and those waiting for it) start over there. The last server left is never
  taken out: with none to move to, a request fails as it would against one server.

The pool is one service to the cache: a request is keyed by the service, not by which
server answered (:attr:`PoolModel.cache_server`), so a resumed run over a pool of another
shape sends nothing twice. Which server answered is not recorded in the release, so a run
over a pool writes the same bytes as a run over one server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from craftmd import CraftMDError

from .base import ERROR_CHARS, ChatModel, Completion, Message, Sampling, TransientError
from .calls import CONVERSATION, Slots
from .openai import OpenAIModel

#: Reasons that take a server out of its pool at once (nothing listens there).
REFUSED = "connection refused"


class Pin:
    """The server one conversation is pinned to, in each pool it calls."""

    def __init__(self) -> None:
        self.members: dict[int, Member] = {}  # id(pool) -> member

    def close(self) -> None:
        for m in self.members.values():
            m.conversations -= 1
        self.members.clear()


async def in_conversation(work):
    """Await ``work`` (a coroutine) as one conversation: its requests stay on one server of each pool (the runner
    bounds the conversations in flight, so that each server is given its next one when it has room for it)."""
    pin = Pin()
    token = CONVERSATION.set(pin)
    try:
        return await work
    finally:
        CONVERSATION.reset(token)
        pin.close()


@dataclass(eq=False)
class Member:
    """One server of a pool, with its own concurrency limit and what it is doing."""

    index: int
    url: str  # public (no credentials)
    limit: int
    slots: Slots = field(repr=False)
    conversations: int = 0  # pinned here and not finished
    queued: int = 0  # requests routed here, waiting for a slot or in flight
    in_flight: int = 0
    calls: int = 0  # attempts sent (retries included)
    busy_s: float = 0.0  # time with at least one request in flight
    dead: str | None = None  # why it takes no more work
    first: float | None = None  # time.monotonic() of its first request sent, and of its last answer
    last: float | None = None
    _since: float = field(default=0.0, repr=False)

    def load(self) -> float:
        return (self.conversations + self.queued) / self.limit

    def started(self) -> None:
        self.calls += 1
        self.in_flight += 1
        if self.in_flight == 1:
            self._since = time.monotonic()
            if self.first is None:
                self.first = self._since

    def finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.last = time.monotonic()
            self.busy_s += self.last - self._since

    @property
    def busy_share(self) -> float | None:
        """Its busy time over the span from its first request to its last answer (None before it served)."""
        span = (self.last or 0.0) - (self.first or 0.0)
        return self.busy_s / span if self.first is not None and self.last is not None and span > 0 else None

    def describe(self) -> dict:
        return {"url": self.url, "calls": self.calls, "busy_s": round(self.busy_s, 3), "busy_share": self.busy_share, "dead": self.dead}


class Pool:
    """The servers of one service and the routing state every model of the service shares."""

    def __init__(self, urls: list[str], limit: int):
        if limit < 1:
            raise CraftMDError("a server's concurrency must be at least 1")
        self.members = [Member(i, u, limit, Slots(limit)) for i, u in enumerate(urls)]
        self._named: dict[str, Member] = {}  # conversations named by a string in CONVERSATION -> their server

    def __len__(self) -> int:
        return len(self.members)

    @property
    def capacity(self) -> int:
        """Requests the pool's live servers take at once."""
        return sum(m.limit for m in self.members if not m.dead)

    def _least_busy(self) -> Member:
        return min((m for m in self.members if not m.dead), key=lambda m: (m.load(), m.calls, m.index))

    def enter(self) -> Member:
        """The server the next request goes to (counted as queued there until :meth:`leave`)."""
        pin = CONVERSATION.get()
        if pin is None:
            m = self._least_busy()
        elif not isinstance(pin, Pin):  # a conversation known by name only (no end): pinned, counted by its requests
            m = self._named.get(pin)
            if m is None or m.dead:
                m = self._named[pin] = self._least_busy()
        else:
            m = pin.members.get(id(self))
            if m is None or m.dead:
                if m is not None:
                    m.conversations -= 1  # the conversation moves
                m = self._least_busy()
                m.conversations += 1
                pin.members[id(self)] = m
        m.queued += 1
        return m

    def leave(self, m: Member) -> None:
        m.queued -= 1

    def failed(self, m: Member, error: TransientError, exhausted: bool) -> bool:
        """After a failed attempt on ``m``: True when ``m`` takes no more work and the request moves to another server."""
        if m.dead:
            return True
        gone = error.reason.startswith("HTTP 5") or error.reason in ("timeout", "connection error")
        fatal = error.reason == REFUSED or (exhausted and gone)
        if not fatal or sum(not x.dead for x in self.members) < 2:
            return False
        m.dead = f"{error.reason}: {error.message}"[:ERROR_CHARS] if error.message else error.reason
        return True

    def describe(self) -> list[dict]:
        return [m.describe() for m in self.members]


class PoolModel(ChatModel):
    """``openai-api/<service>/<model>`` served by every server listed in ``<SERVICE>_BASE_URL``."""

    provider = "openai-api"

    def __init__(self, model: str, urls: list[str], *, service: str, api_key: str | None = None, timeout: float = 120.0,
                 key_var: str = "OPENAI_API_KEY", limit: int = 32):
        super().__init__(model)
        self.service = service
        self.clients = [OpenAIModel(model, base_url=u, api_key=api_key, timeout=timeout, service=service, key_var=key_var) for u in urls]
        self.server = ",".join(c.server for c in self.clients)
        self.pool_urls = [c.server for c in self.clients]
        #: The routing state; :class:`~craftmd.models.connect.Connections` gives every model of one service the same pool.
        self.pool = Pool(self.pool_urls, limit)

    @property
    def name(self) -> str:
        return f"openai-api/{self.service}/{self.model}"

    @property
    def cache_server(self) -> str:
        return f"service:{self.service}"

    def client(self, m: Member) -> OpenAIModel:
        return self.clients[m.index]

    def describe(self) -> dict:
        return {**super().describe(), "base_url": self.server, "service": self.service, "servers": len(self.clients)}

    async def check(self) -> None:
        for c in self.clients:
            await c.check()

    async def chat(self, messages: list[Message], sampling: Sampling) -> Completion:
        """One attempt on the server :meth:`Pool.enter` picks (the :class:`~craftmd.models.calls.Caller` adds slots,
        retries and moving off a failed server)."""
        m = self.pool.enter()
        try:
            return await self.client(m).chat(messages, sampling)
        finally:
            self.pool.leave(m)

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()
