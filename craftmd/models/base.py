"""One small model interface for every provider.

A provider is one file in this folder with one ``ChatModel`` subclass. The engine only
ever calls ``chat`` (one request) or ``chat_many`` (a batch, for providers that batch,
such as vLLM's offline engine). Retries, caching and counters live in
:mod:`craftmd.models.calls`, not here: a provider makes exactly one attempt and
either returns a :class:`Completion` or raises :class:`TransientError` for a failure
worth retrying (408, 409, 429, 5xx, timeout, dropped connection, a malformed body).

A failed request always keeps its reason: ``Completion.reason`` is a short key that
groups like failures (``HTTP 400 context_length_exceeded``, ``timeout``) and
``Completion.error`` is ``"<reason>: <message>"`` cut to :data:`ERROR_CHARS`. A failure
the provider returns (a 4xx such as a context overflow) is *deterministic*: the same
request fails the same way, so it is cached like an answer; one that exhausted its
retries is *transient* (``transient=True``) and is tried again by the next run.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Literal

from craftmd import CraftMDError

#: A chat message in the OpenAI format; ``content`` is a string or a list of content parts.
Message = dict[str, Any]
Status = Literal["ok", "refusal", "error"]
#: The most characters of a failure's reason and message kept in a Completion (and a release).
ERROR_CHARS = 300


@dataclass(frozen=True)
class Sampling:
    """Generation settings sent with every request (always explicit: vLLM's default max_tokens is 16)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0
    #: The OpenAI ``response_format`` to request (JSON text, e.g. a json_schema), or None. Left out of
    #: :meth:`to_dict` (and so of the cache key) when None, so requests without one keep their keys.
    response_format: str | None = None
    #: The JSON reply asked for (:func:`craftmd.models.formats.structured`: JSON text of its schema, name and the
    #: first format to try), or None. The :class:`~craftmd.models.calls.Caller` turns it into the ``response_format``
    #: its server takes (json_schema, json_object or none) before the request is keyed or sent; left out of
    #: :meth:`to_dict` when None.
    schema: str | None = None

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}  # scalars only: no deep copy
        for name in ("response_format", "schema"):
            if d[name] is None:
                del d[name]
        return d

    def with_seed(self, seed: int) -> Sampling:
        return replace(self, seed=seed)


@dataclass(frozen=True)
class Completion:
    """What one request returned. ``text`` is None unless the model produced text."""

    text: str | None
    status: Status
    finish_reason: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    error: str | None = None  # "<reason>: <message>" when status is error (or a refusal with a reason)
    reason: str | None = None  # the short key that groups like failures, e.g. "HTTP 400 context_length_exceeded"
    transient: bool = False  # failed after capped retries: not cached, a re-run tries again
    model: str | None = None  # the model the server says answered (its reply's ``model``); None where unknown or cached before
    #: The server lists no models (no ``/v1/models``): that the reply came from the model asked rests on its ``model``
    #: field alone (recorded as ``model_named_by_reply_only``; left out of :meth:`to_dict` when False).
    unlisted: bool = False

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}  # scalars only: no deep copy
        if not d["unlisted"]:  # (the cache's rows of servers that list their models stay as they were)
            del d["unlisted"]
        return d

    def scrubbed(self, keys=()) -> Completion:
        """This completion with every key taken out of what is stored (:func:`scrub`): its error, reason and model name
        in full, its text of the known keys only (a reply's words are kept)."""
        known = secrets(keys)  # once for the four texts
        out = {k: scrub(getattr(self, k), known=known) for k in ("error", "reason", "model")}
        out["text"] = scrub(self.text, known=known, patterns=False)
        if all(out[k] == getattr(self, k) for k in out):
            return self
        return replace(self, **out)

    @classmethod
    def from_dict(cls, d: dict) -> Completion:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def failure(cls, reason: str, message: str = "", *, transient: bool = False, **kw) -> Completion:
        """A failed request that keeps its reason (and message, cut to ERROR_CHARS)."""
        error = scrub(f"{reason}: {message}" if message else reason)  # before it is cut: no half key survives
        return cls(None, "error", error=error[:ERROR_CHARS], reason=scrub(reason)[:ERROR_CHARS], transient=transient, **kw)


#: The reasons of a reply that came (HTTP 200) but is no answer: no text, or another model's. Never cached (a fixed
#: server is asked again); tried once more on one server; a pool moves the request to another server at once, and
#: a server that keeps sending them is taken out (:mod:`.pool`).
EMPTY = "empty reply"
FOREIGN = "reply from another model"
#: A server that answered with a redirect (to another host, or anywhere): never followed, so no prompt goes elsewhere and
#: no other server's answer counts as the model's.
REDIRECT = "redirect not followed"
#: A body that is not a chat completion (an HTML page, a cut-off body, no ``choices``).
MALFORMED = "malformed response"
BAD_REPLIES = (EMPTY, FOREIGN, MALFORMED)

#: What shows nothing on its own: spaces and separators, control and format characters (zero-width space and joiners,
#: the word joiner, the byte-order mark), combining marks with nothing to mark, unassigned and private code points.
_UNSEEN = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn", "Mn", "Me"})
#: Letters and symbols drawn blank: the braille pattern blank, the Hangul fillers, the Mongolian vowel separator.
_BLANK = frozenset("\u2800\u3164\u115f\u1160\uffa0\u180e")


def visible(text: str) -> bool:
    """Whether ``text`` shows anything: one character that is not blank (:data:`_UNSEEN`, :data:`_BLANK`)."""
    return any(c not in _BLANK and unicodedata.category(c) not in _UNSEEN for c in text)


class TransientError(Exception):
    """A failure worth retrying: rate limit, server error, timeout, dropped connection, malformed body, empty reply.

    ``reason`` is the short key that groups like failures (``HTTP 503``, ``timeout``);
    ``retry_after`` the seconds the server asked to wait (its ``Retry-After``), when it said;
    ``model`` the model name the reply gave, when there was a reply.
    """

    def __init__(self, reason: str, message: str = "", retry_after: float | None = None, model: str | None = None):
        self.reason, self.message, self.retry_after, self.model = reason, scrub(message), retry_after, model
        super().__init__(f"{reason}: {self.message}" if self.message else reason)


# --- keys never stored ---------------------------------------------------------------------
#: Environment variables whose values are keys (every key comes from one: ``OPENAI_API_KEY``, ``<SERVICE>_API_KEY``,
#: ``HF_TOKEN``, …).
KEY_VARS = re.compile(r"(?:KEY|TOKEN|SECRET|PASSWORD)$", re.I)
KEY_SUFFIXES = (b"KEY", b"TOKEN", b"SECRET", b"PASSWORD")
#: Credentials as they appear in server text: an echoed ``Authorization`` header (a Bearer token, Basic credentials),
#: an API-key header's value, an OpenAI-style key.
CREDENTIALS = (
    (re.compile(r"(?i)\bbearer\s+[^\s\"',;]+"), "Bearer [token]"),
    (re.compile(r"(?i)\bbasic\s+(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/=]{8,}"), "Basic [credentials]"),
    (re.compile(r"(?i)\b((?:x-)?(?:api|goog-api|subscription)[-_]?key[\"']?\s*[:=]\s*[\"']?)(?!\[)[^\s\"',;]+"), r"\1[API key]"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "[API key]"),
)
#: Control characters in server text: a terminal escape (``ESC [ 2 J``), a bell, a carriage return, the C1 controls and the
#: bidirectional overrides, none of which may reach a terminal or a release. Taken out of a reply (its newlines and tabs
#: kept) and, with the line breaks, out of everything else a server says (an error is one line).
CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
LINE_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def secrets(keys=()) -> list[str]:
    """The keys a stored text must not hold: every key in the environment and ``keys`` (8 characters or more: a local
    server's placeholder such as ``EMPTY`` is no key), longest first."""
    data = getattr(os.environ, "_data", None)  # POSIX: the raw bytes, read without decoding every variable (a hot path)
    if data and isinstance(next(iter(data)), bytes):
        found = {os.fsdecode(v) for k, v in data.items() if k.upper().endswith(KEY_SUFFIXES) and len(v) >= 8}
    else:
        found = {v for k, v in os.environ.items() if KEY_VARS.search(k) and len(v) >= 8}
    found.update(k for k in keys if k and len(k) >= 8)
    return sorted(found, key=lambda k: (-len(k), k))


def scrub(text, keys=(), *, patterns: bool = True, known: list[str] | None = None):
    """The one scrubber of every text that is stored (an error, a reason, a model name, a header, a cached body):
    ``text`` with every key (:func:`secrets`) replaced by ``[API key]`` and, unless ``patterns`` is False (a reply's own
    words), every credential-shaped string (:data:`CREDENTIALS`); its control characters taken out (:data:`CONTROLS`:
    a reply keeps its newlines and tabs; other server text becomes one line). None and non-text pass through.
    ``known``: the keys, when :func:`secrets` was already asked."""
    if not isinstance(text, str) or not text:
        return text
    text = LINE_CONTROLS.sub(" ", text) if patterns else CONTROLS.sub("", text)
    for key in secrets(keys) if known is None else known:
        if key in text:
            text = text.replace(key, "[API key]")
    if patterns:
        for rx, sub in CREDENTIALS:
            text = rx.sub(sub, text)
    return text


class ChatModel(ABC):
    """A chat model named ``provider/model``."""

    provider: str = ""
    #: True when the provider serves many requests best as one batch (``chat_many``).
    batches: bool = False
    #: The server that answers (its base URL, never credentials), part of the request cache key;
    #: None for an engine in this process.
    server: str | None = None

    def __init__(self, model: str):
        self.model = model

    @property
    def cache_server(self) -> str | None:
        """What the request cache keys this model's server by (default: its base URL)."""
        return self.server

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @abstractmethod
    async def chat(self, messages: list[Message], sampling: Sampling) -> Completion:
        """One attempt at one request."""

    async def chat_many(self, batch: list[list[Message]], sampling: Sampling | list[Sampling]) -> list[Completion]:
        """Many requests; the default sends them side by side. ``sampling`` may be one per request."""
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(batch)
        return list(await asyncio.gather(*(self.chat(m, s) for m, s in zip(batch, samplings))))

    async def check(self) -> None:
        """Raise CraftMDError when the model cannot serve (unreachable server, unknown model)."""

    async def aclose(self) -> None:
        """Release connections."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys this model sends (taken out of what is stored beside the environment's, :func:`scrub`)."""
        return ()

    def describe(self) -> dict:
        """What goes into a release manifest about this model (never credentials)."""
        return {"name": self.name, "provider": self.provider, "model": self.model}


#: The most bytes one reply body may hold once decoded (:mod:`craftmd.models.body` cuts it off there): a model list or an error's body
#: (16 MiB); a chat request sets its own for the request it sends (:func:`craftmd.models.openai.reply_bytes`).
BODY_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("craftmd_body_limit", default=16 << 20)


class BodyRefused(CraftMDError):
    """A reply body :mod:`craftmd.models.body` read no further: too large once decoded (:class:`BodyTooLarge`), or sent
    in a content encoding the request did not ask for (:class:`UnaskedEncoding`)."""


class BodyTooLarge(BodyRefused):
    """A reply body that passed :data:`BODY_LIMIT` once decoded (read no further: :mod:`craftmd.models.body`)."""

    def __init__(self, limit: int, encoding: str | None):
        self.limit, self.encoding = limit, encoding
        sent = f"sent {encoding}-encoded, " if encoding else ""
        super().__init__(f"the reply's body passed {limit:,} bytes ({sent}decoded a piece at a time); read no further")


class UnaskedEncoding(BodyRefused):
    """A reply body in a content encoding the request did not accept (``br``, ``zstd``, ...): not one byte of it is
    decoded (:data:`craftmd.models.body.ACCEPT_ENCODING`)."""

    def __init__(self, encoding: str, accepted: str):
        self.encoding = encoding
        super().__init__(f"the reply's body was sent {encoding}-encoded, which the request did not accept ({accepted}); not read")
