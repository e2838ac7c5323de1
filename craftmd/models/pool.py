"""Server pools: one service served by several OpenAI-compatible servers.

``<SERVICE>_BASE_URL`` may list several servers, comma-separated
(``LOCAL_BASE_URL=http://gpu0:8000/v1,http://gpu1:8000/v1``): ``openai-api/<service>/<model>``
is then a :class:`PoolModel`, one client per server, and the run spreads its work over them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from craftmd import CraftMDError

from .base import (
    EMPTY,
    ERROR_CHARS,
    FOREIGN,
    MALFORMED,
    REDIRECT,
    ChatModel,
    Completion,
    Message,
    Sampling,
    TransientError,
    scrub,
)
from .calls import CONVERSATION, Slots
from .openai import OpenAIModel

#: Reasons that take a server out of its pool at once (nothing listens there; another model answers).
REFUSED = "connection refused"
#: Replies in a row that are no answer (empty, malformed) after which a server is taken out.
BAD_LIMIT = 3
#: The longest a server of a pool may take to list its models before the run starts without it (seconds).
CHECK_TIMEOUT = 10.0
#: Host names that are this machine.
LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def server_key(url: str) -> str:
    """A server URL as one server: scheme and host lower-cased, the default port and a trailing slash dropped, and
    ``localhost`` / ``127.0.0.1`` / ``::1`` as one host."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    port = parts.port if parts.port not in ({"http": 80, "https": 443}.get(scheme), None) else None
    if host in LOOPBACK:
        host = "localhost"
    elif ":" in host:
        host = f"[{host}]"
    return urlunsplit((scheme, host + (f":{port}" if port else ""), parts.path.rstrip("/"), parts.query, ""))


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
    bad: int = 0  # replies in a row that were no answer
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
        return {
            "url": self.url,
            "calls": self.calls,
            "busy_s": round(self.busy_s, 3),
            "busy_share": self.busy_share,
            "dead": self.dead,
        }


class Pool:
    """The servers of one service and the routing state every model of the service shares.

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
    - **Only servers that answer start.** Before the first call (``Connections.check``) every server is
      asked for its model list, side by side and for at most :data:`CHECK_TIMEOUT` seconds: one that
      refuses, hangs or does not serve the model is reported on stderr and taken out, and the run goes on
      with the others (all down: one line naming the first reason).
    - **A server that fails takes no new work.** A refused connection takes it out at once; a
      5xx, a timeout, a dropped connection or a body that is not a chat completion (an HTML page)
      takes it out when a request has used up its retries on it. A reply naming another model takes
      it out at once; :data:`BAD_LIMIT` replies in a row that are no answer (empty) take it out too,
      and a request given one moves at once to a server it has not tried. Its conversations move to
      the others, and their pending requests (those in flight and those waiting for it) start over
      there. The last server left is never taken out: with none to move to, a request fails as it
      would against one server.
    - **A server is listed once**: ``url`` and ``url/``, a host's case, a default port, and
      ``localhost``, ``127.0.0.1`` and ``::1`` name one server (:func:`server_key`); a second spelling is
      dropped (:func:`craftmd.models.endpoint_of`).
    """

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

    def _least_busy(self, avoid=()) -> Member:
        live = [m for m in self.members if not m.dead]
        return min([m for m in live if m not in avoid] or live, key=lambda m: (m.load(), m.calls, m.index))

    def enter(self, avoid=()) -> Member:
        """The server the next request goes to (counted as queued there until :meth:`leave`); not one of ``avoid`` (the
        servers that gave this request no answer) while another is live."""
        pin = CONVERSATION.get()
        if avoid and any(not m.dead and m not in avoid for m in self.members):
            m = self._least_busy(avoid)  # this request only: the conversation stays pinned where it was
        elif pin is None:
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

    def answered(self, m: Member) -> None:
        """``m`` gave an answer: its run of replies that were no answer ends."""
        m.bad = 0

    def other(self, m: Member, tried) -> bool:
        """Whether a live server other than ``m`` and those in ``tried`` is left."""
        return any(not x.dead and x is not m and x not in tried for x in self.members)

    def failed(self, m: Member, error: TransientError, exhausted: bool) -> bool:
        """After a failed attempt on ``m``: True when ``m`` takes no more work and the request moves to another server."""
        if m.dead:
            return True
        if error.reason in (EMPTY, MALFORMED):
            m.bad += 1
        gone = error.reason.startswith("HTTP 5") or error.reason in ("timeout", "connection error", MALFORMED)
        fatal = error.reason in (REFUSED, FOREIGN, REDIRECT) or (exhausted and gone) or m.bad >= BAD_LIMIT
        if not fatal or sum(not x.dead for x in self.members) < 2:
            return False
        self.take_out(m, f"{error.reason}: {error.message}" if error.message else error.reason)
        return True

    def take_out(self, m: Member, why: str, *, report: bool = True) -> None:
        """``m`` takes no more work; said on stderr (once) unless ``report`` is False."""
        if m.dead is None and report:
            print(
                f"warning: {m.url} taken out of its pool ({scrub(why)[:ERROR_CHARS]}); the run goes on with the others",
                file=sys.stderr,
            )
        m.dead = scrub(why)[:ERROR_CHARS]

    def describe(self) -> list[dict]:
        return [m.describe() for m in self.members]


class PoolModel(ChatModel):
    """``openai-api/<service>/<model>`` served by every server listed in ``<SERVICE>_BASE_URL``.

    The pool is one service to the cache: a request is keyed by the service, not by which
    server answered (:attr:`PoolModel.cache_server`), so a resumed run over a pool of another
    shape sends nothing twice. Which server answered is not recorded in the release, so a run
    over a pool writes the same bytes as a run over one server.
    """

    provider = "openai-api"

    def __init__(
        self,
        model: str,
        urls: list[str],
        *,
        service: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        key_var: str = "OPENAI_API_KEY",
        limit: int = 32,
    ):
        super().__init__(model)
        self.service = service
        self.clients = [
            OpenAIModel(model, base_url=u, api_key=api_key, timeout=timeout, service=service, key_var=key_var) for u in urls
        ]
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

    @property
    def keys(self) -> tuple[str, ...]:
        return self.clients[0].keys

    async def check(self) -> None:
        """Every server asked for its model list, side by side (at most :data:`CHECK_TIMEOUT` s each): one that does not
        answer or does not serve the model is reported and taken out; one line when none is left."""

        async def one(c: OpenAIModel) -> str | None:
            try:
                await asyncio.wait_for(
                    c.check(),
                    min(CHECK_TIMEOUT, c.client.timeout if isinstance(c.client.timeout, (int, float)) else CHECK_TIMEOUT),
                )
            except asyncio.TimeoutError:
                return f"no model list within {CHECK_TIMEOUT:g} s from {c.server}"
            except CraftMDError as exc:
                return str(exc)
            return None

        live = [m for m in self.pool.members if not m.dead]
        why = await asyncio.gather(*(one(self.clients[m.index]) for m in live))
        if all(why):
            raise CraftMDError(f"no server of {self.service.upper().replace('-', '_')}_BASE_URL answers: {why[0]}")
        for m, w in zip(live, why):
            if w:
                self.pool.take_out(m, w)

    @property
    def down(self) -> dict[str, str]:
        """The servers taken out so far: URL -> why."""
        return {m.url: m.dead for m in self.pool.members if m.dead}

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
