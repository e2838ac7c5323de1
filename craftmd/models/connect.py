"""A run's connections to its models: the one place models, servers, the cache and callers are wired.

Every command that calls a model (generation of every task, ``llm:`` graders, key-value
extraction, judges, MELD) opens one :class:`Connections` with the run's
:class:`CallSettings` and asks it for a :class:`~craftmd.models.calls.Caller` per model name.
It builds one client per model name, one pool of request slots per *server* (so each server
has its own concurrency limit, however many roles or models share it; a service served by a
pool of servers shares one :class:`~craftmd.models.pool.Pool` among its models), one request cache,
and records each model's server (never a key). Every name is resolved when the connections
are opened, so a missing ``<SERVICE>_BASE_URL`` is named in one line before any call is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from craftmd import CraftMDError

from . import endpoint_of, get_model, parse_name
from .base import ChatModel
from .cache import RequestCache
from .calls import Caller, Counts, Slots
from .formats import Formats
from .pool import Pool, PoolModel
from .vllm import VLLMModel, plan_engines


@dataclass(frozen=True)
class CallSettings:
    """How a run calls its models (``--base-url``, ``--concurrency``, ``--timeout``, ``--max-retries``, ``--cache``)."""

    base_url: str | None = None  # openai/ models' server; openai-api/<service>/ models read <SERVICE>_BASE_URL
    api_key: str | None = field(default=None, repr=False)  # openai/ models' key (else OPENAI_API_KEY); never recorded
    timeout: float = 120.0
    max_retries: int = 6
    backoff: float = 0.5
    #: Servers of a pool found down before the run (URL -> why, :meth:`Connections.check`): taken out from the start.
    down: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 32  # requests in flight per server
    server_concurrency: Mapping[str, int] = field(default_factory=dict)  # per service name ('openai' for openai/ models)
    seed: int = 0  # the retries' jitter only
    cache: Path | str | RequestCache | None = None  # None: no cache
    engine_args: Mapping[str, Mapping] = field(default_factory=dict)  # vllm/ model name -> engine settings (vllm.plan_engines)

    @classmethod
    def of(cls, spec, **settings) -> CallSettings:
        """The settings a run's spec (a generation run's, a judge's) gives: its server, key, timeout, retries, concurrency
        and cache; ``settings`` add or replace."""
        given = dict(base_url=spec.base_url, api_key=spec.api_key, timeout=spec.timeout, max_retries=spec.max_retries,
                     concurrency=spec.concurrency, server_concurrency=spec.server_concurrency, cache=spec.cache)  # fmt: skip
        return cls(**(given | settings))

    def limit(self, model: ChatModel) -> int:
        key = getattr(model, "service", None) or model.provider
        n = self.server_concurrency.get(key, self.concurrency)
        if n < 1:
            raise CraftMDError(f"--concurrency for {key} must be at least 1")
        return n


class Connections:
    """``async with Connections(settings, names) as conn: caller = conn.caller(name)``."""

    def __init__(self, settings: CallSettings, names: Iterable[str] = ()):
        self.settings = settings
        self._models: dict[str, ChatModel] = {}
        self._callers: dict[str, Caller] = {}
        self._slots: dict[str, Slots] = {}
        self._formats: dict[str, Formats] = {}  # server -> the response format it takes (formats.py)
        self._pools: dict[str, Pool] = {}  # service -> its servers' routing state, shared by its models
        self._cache: RequestCache | None = None
        self._own_cache = False
        for name in dict.fromkeys(names):
            self.model(name)
        engines = [n for n, m in self._models.items() if isinstance(m, VLLMModel)]  # one GPU, shared by one rule
        for n, args in plan_engines(engines, settings.engine_args).items():
            self._models[n].configure(args)

    # --- wiring -----------------------------------------------------------------------
    def model(self, name: str) -> ChatModel:
        """The client for ``name`` (one per name; reads its server and key now)."""
        if name not in self._models:
            s = self.settings
            m = self._models[name] = get_model(name, base_url=s.base_url, api_key=s.api_key, timeout=s.timeout)
            if isinstance(m, PoolModel):  # every model of the service routes through one pool, each server with its limit
                if m.cache_server not in self._pools:
                    pool = self._pools[m.cache_server] = Pool(m.pool_urls, s.limit(m))
                    for member in pool.members:
                        if member.url in s.down and sum(not x.dead for x in pool.members) > 1:
                            pool.take_out(member, s.down[member.url], report=False)  # said when it was found down
                m.pool = self._pools[m.cache_server]
        return self._models[name]

    @property
    def cache(self) -> RequestCache | None:
        c = self.settings.cache
        if self._cache is None and c is not None:
            self._own_cache = not isinstance(c, RequestCache)
            self._cache = RequestCache(Path(c)) if self._own_cache else c
        return self._cache

    def caller(self, name: str) -> Caller:
        """The one door for ``name``'s requests: cache, its server's slots, capped retries."""
        if name not in self._callers:
            m, s = self.model(name), self.settings
            server = m.cache_server or m.name  # an in-process engine is its own server
            if server not in self._slots:
                self._slots[server] = Slots(s.limit(m))
                self._formats[server] = Formats()
            self._callers[name] = Caller(
                m,
                self.cache,
                concurrency=s.limit(m),
                max_retries=s.max_retries,
                backoff=s.backoff,
                seed=s.seed,
                slots=self._slots[server],
                formats=self._formats[server],
            )
        return self._callers[name]

    @property
    def capacity(self) -> int:
        """The most requests one service takes at once: its limit, times its servers for a pool."""
        return max(
            (self.settings.limit(m) * (len(m.pool) if isinstance(m, PoolModel) else 1) for m in self._models.values()),
            default=self.settings.concurrency,
        )

    @property
    def pools(self) -> dict[str, Pool]:
        """service -> the pool of servers it is spread over (services with several servers only)."""
        return {k.removeprefix("service:"): p for k, p in self._pools.items()}

    @property
    def callers(self) -> dict[str, Caller]:
        return dict(self._callers)

    # --- what a run record says ---------------------------------------------------------
    def server(self, name: str) -> dict:
        """Where ``name`` is called: ``{"base_url": URL or None, "service": NAME}`` (``service`` for openai-api only)."""
        m = self.model(name)
        out = {"base_url": m.server}
        if getattr(m, "service", None):
            out["service"] = m.service
        if isinstance(m, VLLMModel):
            out["engine"] = dict(m.engine_args)
        return out

    @property
    def down(self) -> dict[str, str]:
        """Servers of a pool taken out (URL -> why): to start a later connection of the same run without them."""
        return {u: w for m in self._models.values() if isinstance(m, PoolModel) for u, w in m.down.items()}

    def counts(self) -> Counts:
        """Every caller's counts together (the model names replies gave, by model asked, among them)."""
        return Counts.total(c.counters for c in self._callers.values())

    @property
    def batches(self) -> bool:
        return any(m.batches for m in self._models.values())

    # --- lifecycle ----------------------------------------------------------------------
    async def check(self) -> None:
        """Every model's server reachable and serving it, before any chat call (a pool: its servers that answer, the
        others reported and taken out, :attr:`down`)."""
        for m in self._models.values():
            await m.check()

    async def aclose(self) -> None:
        for m in self._models.values():
            await m.aclose()
        if self._own_cache and self._cache is not None:
            self._cache.close()
        self._cache = None

    async def __aenter__(self) -> Connections:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def check_names(names: Iterable[str | None], settings: CallSettings | None = None) -> None:
    """Each given name parses and has its server and key variables (one line for the first that does not);
    nothing is connected."""
    s = settings or CallSettings()
    for n in names:
        if n:
            parsed = parse_name(n)
            if parsed.provider != "vllm":
                endpoint_of(parsed, s.base_url, s.api_key)
