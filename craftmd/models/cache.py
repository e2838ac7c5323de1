"""The request cache: every request and what the model said, on disk, forever.

The cache *is* the record of what a model said: it never expires, and a re-run over a
full cache makes no call. One SQLite file, WAL journal, one row per request committed
as soon as the answer arrives, so a run killed with ``kill -9`` loses at most the calls
in flight. What a re-run would get again is stored: answers, refusals and deterministic
failures (a 4xx such as a context overflow, with its reason); transient failures (a
request that ran out of retries) and replies that are no answer (empty, another model's) are
not, so the next run tries them again. Every response stored has passed the one scrubber
(:func:`craftmd.models.base.scrub`): no key is written.

The key is built from the provider, the server (its base URL, without credentials: the
same model name on two servers is two models), the model, the messages and the sampling
settings. API keys never reach it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

from craftmd import CraftMDError

from .base import Completion, Message, Sampling

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    request TEXT NOT NULL,     -- JSON: messages and sampling
    response TEXT NOT NULL     -- JSON: the Completion
)
"""


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def request_key(
    provider: str, model: str, messages: list[Message], sampling: Sampling, server: str | None = None
) -> tuple[str, str]:
    """The request as canonical JSON (provider, server, model, messages, sampling) and its sha256, the cache key.

    ``server`` is left out of the JSON when None (an in-process engine), so such keys are as before."""
    request = {"provider": provider, "model": model, "messages": messages, "sampling": sampling.to_dict()}
    if server is not None:
        request["server"] = server
    payload = canonical(request)
    return hashlib.sha256(payload.encode()).hexdigest(), payload


#: Seconds an opening waits for other processes that hold the cache's file.
OPEN_WAIT = 30

#: The validator of a stored reply (:meth:`RequestCache._stored`), made when first needed.
_STORED = None


class RequestCache:
    """A SQLite request cache, safe for concurrent asyncio tasks, threads and processes."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + OPEN_WAIT
        while True:
            self._db = None
            try:
                self._db = sqlite3.connect(self.path, timeout=OPEN_WAIT, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process
                self._db.execute(SCHEMA)
                break
            except sqlite3.OperationalError as exc:
                # Processes opening one new cache at once: SQLite answers the switch to WAL "database is locked"
                # without waiting for the busy timeout; the next try finds it done.
                if self._db is not None:
                    self._db.close()
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise CraftMDError(f"{self.path}: not a usable request cache ({exc})") from None
                time.sleep(0.05)
            except sqlite3.DatabaseError as exc:
                raise CraftMDError(f"{self.path}: not a usable request cache ({exc})") from None
        self._lock = threading.Lock()

    def _sql(self, sql: str, params: tuple = (), rows: str = "") -> list | tuple | None:
        """Run one statement (``rows``: ``one`` or ``all`` to fetch); a damaged cache is one line naming the file."""
        try:
            with self._lock:
                cur = self._db.execute(sql, params)
                return cur.fetchone() if rows == "one" else cur.fetchall() if rows == "all" else None
        except sqlite3.DatabaseError as exc:
            damaged = not isinstance(exc, sqlite3.OperationalError) or "malformed" in str(exc)
            hint = "; it is damaged: move it away (a new cache starts empty) or restore a copy" if damaged else ""
            raise CraftMDError(f"{self.path}: request cache: {exc}{hint}") from None

    def get(self, key: str) -> Completion | None:
        row = self._sql("SELECT response FROM requests WHERE key = ?", (key,), "one")
        return self._stored(row[0]) if row else None

    def _stored(self, raw) -> Completion:
        """A stored reply, checked field by field (types, status) where it enters: a row that is not one is one line."""
        from pydantic import TypeAdapter, ValidationError

        global _STORED
        if _STORED is None:
            _STORED = TypeAdapter(Completion)
        try:
            if not isinstance(raw, (str, bytes)):
                raise TypeError(type(raw).__name__)
            return _STORED.validate_json(raw, strict=True)
        except (ValidationError, TypeError) as exc:
            why = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": f"a {exc} value"}
            where = ".".join(map(str, why["loc"])) or "the row"
            raise CraftMDError(
                f"{self.path}: request cache: a stored reply is not one ({where}: {why['msg']}); it is damaged: move it "
                "away (a new cache starts empty) or restore a copy"
            ) from None

    def put(self, key: str, provider: str, model: str, request: str, completion: Completion, *, replace: bool = False) -> None:
        """Store ``completion`` for the request ``request_key`` gave as ``(key, request)`` (``replace``: over a row that
        holds no answer)."""
        self._sql(
            f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO requests (key, provider, model, request, response) VALUES (?, ?, ?, ?, ?)",
            (key, provider, model, request, canonical(completion.to_dict())),
        )

    def __len__(self) -> int:
        return self._sql("SELECT count(*) FROM requests", (), "one")[0]

    def requests(self) -> list[dict]:
        """Every cached request as {provider, server, model, messages, sampling, response}."""
        rows = self._sql("SELECT provider, model, request, response FROM requests ORDER BY key", (), "all")
        out = []
        for provider, model, req, resp in rows:
            r = json.loads(req)
            out.append(
                {
                    "provider": provider,
                    "server": r.get("server"),
                    "model": model,
                    "messages": r["messages"],
                    "sampling": r["sampling"],
                    "response": json.loads(resp),
                }
            )
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RequestCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
