"""Calling a model: cache first, bounded concurrency, capped retries, counters.

:class:`Caller` is the one door every request to a model goes through; :class:`Counts` says what became of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import json
import random
from dataclasses import dataclass, field

from .cache import RequestCache, request_key
from .base import BAD_REPLIES, EMPTY, FOREIGN, REDIRECT, ChatModel, Completion, Message, Sampling, TransientError, visible
from .formats import FORMATS, Formats, as_sent, refused, start_of

#: The longest a server's ``Retry-After`` makes a retry wait (seconds; or the caller's max_backoff, if longer).
RETRY_AFTER_CAP = 60.0


#: The conversation (job) a request belongs to, set by the runner at the start of each job: a server pool keeps a
#: conversation's requests on one member (its prefix cache holds the history). None outside a runner's job.
#: (A :class:`craftmd.models.pool.Pin`, set by ``pool.in_conversation``, also frees its server when the job ends.)
CONVERSATION: contextvars.ContextVar = contextvars.ContextVar("craftmd_conversation", default=None)


@dataclass
class Counts:
    """What became of requests; one set of counts for the progress bar, the summary and the manifest.

    Every request is counted once, by how it was served (:class:`Counts`): sent to the
    model, answered from the cache, or deduplicated (an identical request was already in
    flight and its answer is shared). ``requests = calls + cache_hits + deduplicated``.
    """

    requests: int = 0  # every request asked for: calls + cache_hits + deduplicated
    calls: int = 0  # sent to the model (a request retried counts once here; each retry in ``retries``)
    cache_hits: int = 0  # answered from the request cache
    deduplicated: int = 0  # an identical request was in flight: its answer is shared, no call made
    retries: int = 0
    tokens_in: int = 0  # of every request's answer, wherever it came from
    tokens_out: int = 0
    refusals: int = 0
    failures: int = 0  # requests that ended as status error (any source)
    reasons: dict[str, int] = field(default_factory=dict)  # failure label (see ``failure_label``) -> requests
    in_flight: int = 0
    peak_in_flight: int = 0
    batches: list[int] = field(default_factory=list)
    served: dict[str, int] = field(default_factory=dict)  # the model name a request's reply gave -> requests
    unlisted: int = 0  # answers whose model rests on the reply's name alone (the server lists no models: Completion.unlisted)

    SUMS = ("requests", "calls", "cache_hits", "deduplicated", "retries", "tokens_in", "tokens_out", "refusals", "failures",
            "unlisted")  # fmt: skip

    def add(self, c: Completion, source: str) -> None:
        """Count one request's outcome; ``source`` is ``calls``, ``cache_hits`` or ``deduplicated``."""
        self.requests += 1
        setattr(self, source, getattr(self, source) + 1)
        self.tokens_in += c.tokens_in or 0
        self.tokens_out += c.tokens_out or 0
        self.refusals += c.status == "refusal"
        if c.model:  # the name the reply gave (from the cache too: a re-run over a full cache records the same)
            self.served[c.model] = self.served.get(c.model, 0) + 1
        self.unlisted += c.unlisted
        if c.status == "error":
            self.failures += 1
            label = failure_label(c)
            self.reasons[label] = self.reasons.get(label, 0) + 1

    def merge(self, other: Counts) -> Counts:
        """Add ``other``'s counts to these (peaks add too: the processes ran side by side)."""
        for name in self.SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + v
        self.peak_in_flight += other.peak_in_flight
        self.batches += other.batches
        for named, n in other.served.items():
            self.served[named] = self.served.get(named, 0) + n
        return self

    @classmethod
    def total(cls, many) -> Counts:
        out = cls()
        for c in many:
            out.merge(c)
        return out


def no_answer(c: Completion) -> bool:
    """Whether a cached completion is an empty reply that earlier versions stored (as an answer with no text or none that
    shows, :func:`~.base.visible`, or as a deterministic failure ``no text``): never replayed, the request is asked again."""
    return (c.status == "ok" and not visible(c.text or "")) or (c.status == "error" and c.reason == "no text")


def failure_label(c: Completion) -> str:
    """How a failure is grouped in summaries: its reason and whether a re-run retries it."""
    kind = "transient: a re-run tries again" if c.transient else "deterministic: cached, a re-run sends nothing"
    return f"{c.reason or c.error or 'unknown'} ({kind})"


class Slots:
    """``n`` slots for concurrent requests, handed to waiters by (priority, arrival)."""

    def __init__(self, n: int):
        self.free = n
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    async def acquire(self, priority: int = 0) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot, then cancelled: give it on
                self.release()
            raise

    def release(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


class Caller:
    """The one door every request to a model goes through: cache first, bounded concurrency, capped retries, counters.

    ``Caller(model, cache)``: a cached answer is returned without a call. Otherwise the request waits for one of ``concurrency``
    slots, handed out by priority (lower first, then first come): the engine gives a
    conversation's turns priority 0 and the questions asked after it priority 1, so the
    long chains of dependent turns never queue behind questions that nothing waits on. A
    transient failure (408/409/429, 5xx, timeout, dropped connection, malformed body) is
    retried with exponential backoff and full jitter (never sooner than the server's
    ``Retry-After``, capped at :data:`RETRY_AFTER_CAP`), at most ``max_retries`` times; then
    it is recorded as a failure (status ``error``, ``transient``, with its reason), never
    retried forever, and not cached, so the next run tries it again. A deterministic
    failure (a 4xx such as a context overflow), a refusal and a content-filter block are
    answers the same request would get again: they are cached as such, so a re-run over a
    complete cache sends nothing.

    A model served by a pool of servers (:mod:`craftmd.models.pool`) sends each attempt to the
    server its pool picks, under that server's own slots; an attempt that fails there so badly
    that the server is taken out of the pool starts over on another, with its retries anew.

    A reply that is no answer (:data:`~craftmd.models.base.BAD_REPLIES`: empty, another model's, not a chat
    completion) is never cached: in a pool the request moves at once to a server it has not tried; on one
    server an empty or foreign reply is asked once more, then recorded as a transient failure (a re-run asks
    again). A deterministic refusal (a context overflow, a refused response format) is one try.

    A request that asks for JSON (``sampling.schema``, :func:`craftmd.models.formats.structured`) goes in the
    response format its server takes (:class:`~craftmd.models.formats.Formats`, one per server, shared by its
    callers): a refused format moves the server to the next one and the request goes again in it (counted as a
    retry), never the refused format again.

    Everything stored or returned passes the one scrubber (:meth:`~craftmd.models.base.Completion.scrubbed`): no key
    reaches the cache or a release. The model name each request's reply gave (an answer's, or the
    other model's of a failure) is counted (``Counts.served``), for the run's record.

    For a provider that batches (``model.batches``, vLLM offline), requests arriving from
    concurrent tasks are gathered for a moment and sent as one ``chat_many`` call, so every
    active conversation's next turn goes to the engine together.
    """

    def __init__(
        self,
        model: ChatModel,
        cache: RequestCache | None,
        *,
        concurrency: int = 8,
        max_retries: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        seed: int = 0,
        slots: Slots | None = None,
        formats: Formats | None = None,
    ):
        self.model = model
        self.cache = cache
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.counters = Counts()
        self._rng = random.Random(seed)  # jitter only; never affects what is generated
        self._slots = slots or Slots(concurrency)  # shared by every caller of one server (Connections)
        self.formats = formats or Formats()  # the server's response format, shared likewise
        self._pending: dict[str, asyncio.Future] = {}  # identical requests in flight share one call
        self._queue: list[tuple[list[Message], Sampling, asyncio.Future]] = []
        self._flush: asyncio.Task | None = None
        self._batch_lock: asyncio.Lock | None = None

    # Counters, readable as attributes (calls, cache_hits, tokens_in, tokens_out, retries, failures).
    def __getattr__(self, name):
        counters = self.__dict__.get("counters")
        if counters is not None and name in Counts.__dataclass_fields__:
            return getattr(counters, name)
        raise AttributeError(name)

    async def __call__(
        self, messages: list[Message], sampling: Sampling, priority: int = 0, counts: Counts | None = None
    ) -> Completion:
        """One request: from the cache, shared with an identical one in flight, or sent. ``counts`` (say, one
        agent's) counts it too, beside this caller's own counters."""
        if sampling.schema is not None:
            result, source = await self._structured(messages, sampling, priority)
        else:
            result, source = await self._get(messages, sampling, priority)
        self.counters.add(result, source)
        if counts is not None:
            counts.add(result, source)
        return result

    async def _get(self, messages: list[Message], sampling: Sampling, priority: int) -> tuple[Completion, str]:
        key, request = request_key(self.model.provider, self.model.model, messages, sampling, server=self.model.cache_server)
        stale = False
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None and not no_answer(hit):
                return hit, "cache_hits"
            stale = hit is not None  # an empty answer an older version stored: asked again, and replaced
        if key in self._pending:
            return await asyncio.shield(self._pending[key]), "deduplicated"
        fut = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            result = await (
                self._batched(messages, sampling) if self.model.batches else self._single(messages, sampling, priority)
            )
            result = result.scrubbed(self.model.keys)  # the one scrubber, before anything is stored
            if not result.transient and self.cache is not None:  # answers, refusals and deterministic failures
                self.cache.put(key, self.model.provider, self.model.model, request, result, replace=stale)
            fut.set_result(result)
            return result, "calls"
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._pending[key]

    async def _single(self, messages: list[Message], sampling: Sampling, priority: int) -> Completion:
        pool = getattr(self.model, "pool", None)  # a server pool (craftmd.models.pool): the request goes to one of its servers
        attempt = 0
        tried: set = set()  # the pool's servers that gave this request a reply that is no answer
        while True:
            member = pool.enter(tried) if pool is not None else None
            try:
                slots, model = (member.slots, self.model.client(member)) if member is not None else (self._slots, self.model)
                await slots.acquire(priority)
                self.counters.in_flight += 1
                self.counters.peak_in_flight = max(self.counters.peak_in_flight, self.counters.in_flight)
                try:
                    if member is not None and member.dead:  # taken out while this request waited for it
                        raise TransientError("server taken out of its pool", member.dead)
                    if member is not None:
                        member.started()
                    try:
                        result = await model.chat(messages, sampling)
                    finally:
                        if member is not None:
                            member.finished()
                    error = None
                except TransientError as exc:
                    error = exc
                finally:
                    self.counters.in_flight -= 1
                    slots.release()
            finally:
                if member is not None:
                    pool.leave(member)
            if error is None:
                if member is not None:
                    pool.answered(member)
                return result
            # an empty or foreign reply is asked once more at most (the same server says the same again)
            limit = min(self.max_retries, 1) if error.reason in (EMPTY, FOREIGN, REDIRECT) else self.max_retries
            if member is not None and pool.failed(member, error, attempt >= limit):
                attempt = 0  # that server takes no more work: the request starts over on another
                continue
            if member is not None and error.reason in BAD_REPLIES and pool.other(member, tried):
                tried.add(member)  # no answer there: the request goes to a server it has not tried, at once
                continue
            if attempt >= limit:
                return Completion.failure(
                    error.reason, f"gave up after {attempt + 1} attempts: {error.message}", transient=True, model=error.model
                )
            attempt += 1
            self.counters.retries += 1
            # Exponential backoff with full jitter, capped; never sooner than the server's Retry-After (capped too).
            delay = self._rng.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            if error.retry_after is not None:
                delay = max(delay, min(error.retry_after, max(self.max_backoff, RETRY_AFTER_CAP)))
            await asyncio.sleep(delay)

    async def _structured(self, messages: list[Message], sampling: Sampling, priority: int) -> tuple[Completion, str]:
        """A request for JSON in the response format its server takes (:mod:`.formats`): until a format has worked on
        the server, one such request at a time probes; a refused format moves the server on, once."""
        f, start = self.formats, start_of(sampling)
        if not f.recalled:  # the formats this server refused in an earlier run (a re-run over the cache sends nothing)
            f.recalled = True
            for kind in FORMATS[:-1] if self.cache is not None else ():
                hit = self.cache.get(self._format_key(kind)[0])
                if hit is not None:
                    f.refuse(kind, hit)
        while True:
            if f.settled:
                kind = FORMATS[max(start, f.level)]
                result, source = await self._get(messages, as_sent(sampling, kind), priority)
            else:
                async with f.lock:
                    kind = FORMATS[max(start, f.level)]
                    result, source = await self._get(messages, as_sent(sampling, kind), priority)
            if kind != "none" and refused(result):
                if kind not in f.refused and self.cache is not None:  # remembered for the server, not for this request alone
                    key, request = self._format_key(kind)
                    self.cache.put(key, self.model.provider, self.model.model, request, result)
                f.refuse(kind, result)
                self.counters.retries += 1  # asked again, in the next format
                continue
            f.answered(kind, result)
            return result, source

    def _format_key(self, kind: str) -> tuple[str, str]:
        """The cache's key (and request text) of the row that remembers that this model's server refused ``kind``."""
        return request_key(
            self.model.provider,
            self.model.model,
            [],
            Sampling(response_format=json.dumps({"refused": kind})),
            server=self.model.cache_server,
        )

    async def _batched(self, messages: list[Message], sampling: Sampling) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((messages, sampling, fut))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.ensure_future(self._flush_soon())
        return await fut

    async def _flush_soon(self) -> None:
        if self._batch_lock is None:
            self._batch_lock = asyncio.Lock()
        async with self._batch_lock:  # one engine call at a time; meanwhile the next batch gathers
            # Let every runnable task reach its next request before sending the batch.
            idle = 0
            while idle < 3:
                n = len(self._queue)
                await asyncio.sleep(0)
                idle = idle + 1 if len(self._queue) == n else 0
            batch, self._queue = self._queue, []
            self._flush = None  # requests from now on start the next batch
            await self._send(batch)

    async def _send(self, batch) -> None:
        self.counters.batches.append(len(batch))
        self.counters.in_flight += len(batch)
        self.counters.peak_in_flight = max(self.counters.peak_in_flight, self.counters.in_flight)
        try:
            results = await self.model.chat_many([m for m, _, _ in batch], [s for _, s, _ in batch])
        except BaseException as exc:
            for _, _, f in batch:
                if not f.done():
                    f.set_exception(exc)
            raise
        finally:
            self.counters.in_flight -= len(batch)
        for (_, _, f), r in zip(batch, results):
            f.set_result(r)
