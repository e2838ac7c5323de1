"""``openai/<model>``: any OpenAI-compatible chat server through ``openai.AsyncOpenAI``.

:class:`OpenAIModel` sends a request and sorts what comes back: an answer, a deterministic failure (cached by the
caller) or a transient one (:class:`TransientError`, retried by :class:`craftmd.models.calls.Caller`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import sys
from dataclasses import replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit, urlunsplit

from craftmd import CraftMDError

from .base import (
    BODY_LIMIT,
    BodyRefused,
    BodyTooLarge,
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
    UnaskedEncoding,
    scrub,
    visible,
)
from .formats import FORMAT_REFUSED, REFUSAL_TEXT

#: HTTP statuses worth retrying.
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_TLS: ssl.SSLContext | None = None
#: Connections the client keeps open to one server (requests beyond wait for one).
MAX_CONNECTIONS = 1024
#: The SDK's telemetry headers (platform, runtime, retry count, read timeout), removed from every chat
#: request with ``openai.omit`` (the client's documented way to drop a default header): no server needs
#: them, and each one is normalised by httpx and again by aiohttp, and parsed by the server.
TELEMETRY_HEADERS = tuple(
    f"X-Stainless-{name}"
    for name in ("Lang", "Package-Version", "OS", "Arch", "Runtime", "Runtime-Version", "Async", "Retry-Count", "Read-Timeout")
)
#: Error codes a server uses for a content-filter block (Azure, OpenAI).
FILTER_CODES = {"content_filter", "content_policy_violation", "ResponsibleAIPolicyViolation"}
#: The most characters a reply may have per token of ``max_tokens`` (a generous bound: tokens average about 4): a server
#: that ignores max_tokens and sends megabytes gets a failure ``reply too long``, never a stored answer.
REPLY_CHARS_PER_TOKEN = 32
#: The most bytes a chat reply's body may hold, once decoded, per character of that bound (a character JSON-escapes to
#: at most 12 bytes, a reply may carry its text twice: content and reasoning), plus :data:`REPLY_OVERHEAD` for the rest
#: of the body: past it the body is read no further (:mod:`.body`), a gzip bomb included.
REPLY_BYTES_PER_CHAR = 24
REPLY_OVERHEAD = 1 << 20


def reply_bytes(max_tokens: int) -> int:
    """The most bytes a chat reply's body under ``max_tokens`` may hold once decoded (:data:`REPLY_BYTES_PER_CHAR`)."""
    return REPLY_BYTES_PER_CHAR * REPLY_CHARS_PER_TOKEN * max_tokens + REPLY_OVERHEAD


#: Names some servers give every reply whatever model answers (llama.cpp's server before it echoed the request's name):
#: no model's name when the server does not list it.
PLACEHOLDERS = {"gpt-3.5-turbo", "gpt-3.5-turbo-0613"}
#: A context overflow, as OpenAI, vLLM and llama.cpp word it (deterministic, whatever the status).
CONTEXT_TEXT = re.compile(
    r"(?i)context_length_exceeded|exceeds? the available context size|context window|maximum context length"
    r"|exceed_context_size"
)


def _sdk():
    """The openai SDK and its HTTP client (``httpx2``), imported when a model is first built: about 0.8 s that the
    commands calling no model (the analysis, the page, scoring by rule) never pay."""
    import httpx2
    import openai

    return openai, httpx2


class OpenAIModel(ChatModel):
    """An OpenAI-compatible chat server: a hosted API, Azure's OpenAI endpoint, a ``vllm serve`` server or the test suite's
    loopback server. ``base_url`` and ``api_key`` default to the client's usual
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; a local server needs no key. The client's own
    retries are switched off: :class:`craftmd.models.calls.Caller` retries.

    A 4xx answer other than 408/409/425/429 is a deterministic failure, returned as a failed
    :class:`Completion` with its status, error code and message (the caller caches it); a
    timeout, a dropped connection, a 408/409/425/429/5xx or a body that is not a chat
    completion raises :class:`TransientError` (with the server's ``Retry-After``, when it gave one).

    A refusal that the same request would meet again is a deterministic failure at once, one try, whatever
    its status: a context overflow (``context_length_exceeded``; llama.cpp's "exceeds the available context
    size", vLLM's "maximum context length") and a refused response format (an error naming
    ``response_format``, ``json_schema`` or a grammar: :mod:`.formats` moves the server to the next format).

    A reply that is no answer is a failure, never stored as one: content that shows nothing (empty, whitespace, zero-width
    or blank characters alone: :func:`~.base.visible`), ``null`` content, a tool call alone (:data:`~.base.EMPTY`), and a
    reply naming a model other than the one asked (:data:`~.base.FOREIGN`: neither the name asked, nor a dated snapshot
    of it, nor a name the server declares for it at ``/v1/models``: :func:`same_model`, :meth:`OpenAIModel.answers_as`).
    Both raise :class:`TransientError`: not cached, so a fixed server is asked again, and a pool moves the request to
    another server. A redirect is never followed (:data:`~.base.REDIRECT`): the prompts go to the server configured and
    nowhere else. A reply whose ``usage`` is not a token count (negative, fractional, not a number) is malformed.

    ``timeout`` is a deadline for the whole request, from connecting to the last byte of the body: a server that
    trickles its reply byte by byte is cut off when it passes, like one that never answers.

    Server text that is stored (an error's message, a reply, the model name a reply gives) goes through the one
    scrubber, :func:`craftmd.models.base.scrub`: no API key, no ``Bearer`` token. A reply longer than
    :data:`REPLY_CHARS_PER_TOKEN` characters per token of ``max_tokens`` (a server that ignored the limit) is a
    failure ``reply too long``, not an answer.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        service: str | None = None,
        key_var: str = "OPENAI_API_KEY",
    ):
        super().__init__(model)
        self.service = service  # openai-api/<service>/<model>: the service's name (its server from <SERVICE>_BASE_URL)
        if service is not None:
            self.provider = "openai-api"
        self.key_var = key_var  # where the key comes from, for messages (never the key)
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") if service is None else base_url
        key = api_key or (os.environ.get("OPENAI_API_KEY") if service is None else None)
        if not key:
            if self.base_url is None:
                raise CraftMDError("openai models need OPENAI_API_KEY (or --base-url for a local server)")
            key = "EMPTY"  # local OpenAI-compatible servers accept any key
        openai, httpx2 = _sdk()
        global _TLS
        if _TLS is None:  # one TLS context per process: building one reads the CA bundle (~0.1 s)
            _TLS = ssl.create_default_context()
        # aiohttp as the client's transport (openai's ``aiohttp`` extra): a few times less CPU per request
        # than the default httpx pool, which is what bounds a run against a fast local server.
        limits = httpx2.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
        from .body import BoundedClient  # every reply body bounded as it is decoded (a gzip bomb is cut off)

        http = BoundedClient(verify=_TLS, limits=limits, follow_redirects=False)
        self.timeout = timeout
        self.client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url, max_retries=0, timeout=timeout, http_client=http)
        # The endpoint as an absolute URL, joined once: a relative path is re-joined to the base URL
        # (two more URL parses) on every request.
        self._chat_url = endpoint(str(self.client.base_url), "chat/completions")
        self._options: openai.RequestOptions = {"headers": dict.fromkeys(TELEMETRY_HEADERS, openai.omit)}
        self.server = public_url(str(self.client.base_url))
        #: The models the server declares at /v1/models, each id with its names (:func:`declared_names`; read by
        #: :meth:`check`, or when a reply first names another model); None until read.
        self.declared: dict[str, set[str]] | None = None
        self._declaring = None
        self._said_unlisted = False  # the warning that the server lists no models, said once

    @property
    def name(self) -> str:
        return f"openai-api/{self.service}/{self.model}" if self.service else f"openai/{self.model}"

    @property
    def cache_server(self) -> str | None:
        """A service's requests are keyed by its name, not by which of its servers answered."""
        return f"service:{self.service}" if self.service else self.server

    def describe(self) -> dict:
        d = super().describe()
        d["base_url"] = self.server
        if self.service:
            d["service"] = self.service
        return d

    async def check(self) -> None:
        openai, httpx2 = _sdk()
        where = self.server
        url = endpoint(str(self.client.base_url), "models")
        try:
            async with asyncio.timeout(self.timeout):  # the deadline of every request
                page = await self.client.get(url, cast_to=httpx2.Response)
            entries = page.json()["data"]
            served = [str(m["id"]) for m in entries]
        except TimeoutError:
            raise CraftMDError(f"the server at {where} sent no model list within {self.timeout:g} s") from None
        except BodyRefused as exc:
            raise CraftMDError(f"{public_url(url)}: {self.scrub(str(exc))}") from None
        except (openai.APIConnectionError, openai.APITimeoutError):
            raise CraftMDError(f"cannot reach the model server at {where}") from None
        except openai.AuthenticationError:
            raise CraftMDError(f"the server at {where} refused the API key (set {self.key_var})") from None
        except openai.APIStatusError as exc:
            hint = ""
            if exc.status_code == 404 and not urlsplit(where).path.rstrip("/").endswith("/v1"):
                hint = f" (OpenAI-compatible servers serve under /v1: try --base-url {where.rstrip('/')}/v1)"
            raise CraftMDError(f"{public_url(url)} answered HTTP {exc.status_code}{hint}") from None
        except (ValueError, KeyError, TypeError):
            raise CraftMDError(
                f"{public_url(url)} did not answer with a model list (is {where} an OpenAI-compatible API?)"
            ) from None
        self.declared = declared_names(entries)
        if self.model not in served:
            shown = ", ".join(self.scrub(s) for s in sorted(served)[:10]) + (" …" if len(served) > 10 else "")
            raise CraftMDError(f"the server at {where} does not serve {self.model!r} (it serves: {shown or 'nothing'})")

    async def chat(self, messages: list[Message], sampling: Sampling) -> Completion:
        openai, httpx2 = _sdk()
        try:
            # The plain request body through the client's own request machinery (errors, timeouts,
            # retries off) with the HTTP response returned as it came (``cast_to=httpx2.Response``):
            # ``chat.completions.create`` walks every message to transform it and builds a typed
            # response model, a few milliseconds per request that dominate a fast local server.
            body = {"model": self.model, "messages": messages, **sampling.to_dict()}
            if sampling.response_format is not None:  # sent as the JSON object it is
                body["response_format"] = json.loads(sampling.response_format)
            bound = BODY_LIMIT.set(reply_bytes(sampling.max_tokens))  # the body's bound, decoded (this request's alone)
            try:
                async with asyncio.timeout(self.timeout):  # one deadline for the whole request (a trickled body too)
                    r = await self.client.post(self._chat_url, body=body, cast_to=httpx2.Response, options=self._options)
            finally:
                BODY_LIMIT.reset(bound)
        except BodyTooLarge as exc:  # a body inflated past the bound (a gzip bomb): read no further, never an answer
            return Completion.failure("reply too long", f"{exc} under max_tokens {sampling.max_tokens}; not stored")
        except UnaskedEncoding as exc:  # a body that cannot be read as asked: as one that is not JSON
            raise TransientError(MALFORMED, self.scrub(str(exc))) from None
        except TimeoutError:
            raise TransientError("timeout", f"no whole answer within {self.timeout:g} s") from None
        except openai.APIConnectionError as exc:  # a timeout too (APITimeoutError)
            if refused(exc):  # nothing listens (a server down or gone; the transport calls it a connect timeout)
                raise TransientError("connection refused", self.scrub(str(exc.__cause__ or exc))) from None
            if isinstance(exc, openai.APITimeoutError):
                raise TransientError("timeout", f"no answer within {self.client.timeout} s") from None
            raise TransientError("connection error", self.scrub(str(exc.__cause__ or exc))) from None
        except openai.APIStatusError as exc:
            reason, message = (self.scrub(x) for x in status_reason(exc))
            if 300 <= exc.status_code < 400:  # never followed: another host would get the prompts and give the answers
                where = self.scrub(public_url(exc.response.headers.get("location") or "") or "nowhere")
                raise TransientError(REDIRECT, f"{self.server} answered HTTP {exc.status_code} to {where}; set the "
                                     "server's own address") from None  # fmt: skip
            said = f"{reason} {message}"
            if CONTEXT_TEXT.search(said):  # the same request overflows again: one try
                return Completion.failure(f"HTTP {exc.status_code} context_length_exceeded", message)
            if sampling.response_format is not None and REFUSAL_TEXT.search(said):  # the next format (formats.py), not a retry
                return Completion.failure(f"{FORMAT_REFUSED} (HTTP {exc.status_code})", message)
            if exc.status_code in RETRY_STATUS or exc.status_code >= 500:
                raise TransientError(reason, message, retry_after=retry_after(exc.response.headers)) from None
            if getattr(exc, "code", None) in FILTER_CODES:
                return Completion(None, "refusal", "content_filter", error=f"{reason}: {message}"[:ERROR_CHARS], reason=reason)
            return Completion.failure(reason, message)
        try:
            data = r.json()
        except ValueError:  # not JSON (a proxy's error page, a cut-off body)
            raise TransientError(
                MALFORMED, f"not JSON ({r.headers.get('content-type') or 'no content type'}): {self.scrub(r.text)[:200]!r}"
            ) from None
        c = parse_completion(data, self.keys)
        if c.reason == EMPTY:  # no answer: not stored; asked again (a pool asks another server)
            raise TransientError(EMPTY, c.error.removeprefix(f"{EMPTY}: "), model=c.model)
        if not await self.answers_as(c.model):
            named = f"names {self.scrub(c.model)!r}" if c.model is not None else "names no model (and the server lists none)"
            raise TransientError(FOREIGN, f"asked for {self.model!r}, the reply {named}", model=c.model)
        if not self.declared:  # the server lists no models: the reply's name is all that says the model asked answered
            c = replace(c, unlisted=True)
        cap = REPLY_CHARS_PER_TOKEN * sampling.max_tokens
        if c.text is not None and len(c.text) > cap:  # the server ignored max_tokens: nothing of it is stored
            return Completion.failure("reply too long", f"{len(c.text):,} characters under max_tokens {sampling.max_tokens} (at most "
                                      f"{cap:,}); not stored", finish_reason=c.finish_reason, tokens_in=c.tokens_in,
                                      tokens_out=c.tokens_out, model=c.model)  # fmt: skip
        return c  # scrubbed by the Caller, the one door every request goes through

    async def answers_as(self, name: str | None) -> bool:
        """Whether a reply naming ``name`` comes from the model asked, by the server's model list at /v1/models (read
        once, the first time a reply needs it, unless :meth:`check` read it): the same name (:func:`same_model`: a dated
        or path form of it) or a name the server declares for it (its entry's ``root``, ``parent`` or ``aliases``; every
        name of a server that declares one model alone: llama.cpp's alias and file); a reply naming no model, from a
        server that lists its models. A server that lists none is taken at its reply's word only for the name asked (or
        its dated snapshot): that is then the only evidence, said once on stderr and recorded with every such answer
        (:attr:`~.base.Completion.unlisted`); another name, or none, is no answer."""
        if self.declared is None:
            if self._declaring is None:
                self._declaring = asyncio.ensure_future(self._declared())
            self.declared = await asyncio.shield(self._declaring)
        if not self.declared:
            if name is None or not same_model(self.model, name):
                return False
            if not self._said_unlisted:
                self._said_unlisted = True
                print(f"warning: {self.server} lists no models (no /v1/models): that its replies come from {self.model} "
                      "rests on their model field alone (recorded as model_named_by_reply_only)", file=sys.stderr)  # fmt: skip
            return True
        if name is None or same_model(self.model, name):
            return True
        every = set().union(*self.declared.values())
        if name in PLACEHOLDERS and not any(same_model(d, name) for d in every):
            return True  # llama.cpp's server named every reply so: a name it does not serve is no model
        if len(self.declared) == 1 and _FILE.search(name.strip().lower()):
            return True  # a server of one model may name it by its file (llama.cpp: /models/SmolLM2-135M-Instruct.gguf)
        mine = every if len(self.declared) == 1 else self.declared.get(self.model, set())
        return any(same_model(d, name) for d in mine)

    async def _declared(self) -> dict[str, set[str]]:
        _, httpx2 = _sdk()
        try:
            async with asyncio.timeout(self.timeout):
                page = await self.client.get(endpoint(str(self.client.base_url), "models"), cast_to=httpx2.Response)
            return declared_names(page.json()["data"])
        except Exception:  # noqa: BLE001 - a server without a model list declares nothing
            return {}

    @property
    def keys(self) -> tuple[str, ...]:
        """The client's API key (a local server's placeholder is no key: :func:`~craftmd.models.base.secrets`)."""
        return (self.client.api_key or "",)

    def scrub(self, text: str) -> str:
        """Server text as it may be stored (:func:`craftmd.models.base.scrub` with this client's key)."""
        return scrub(text, self.keys)

    async def aclose(self) -> None:
        await self.client.close()


def refused(exc: BaseException) -> bool:
    """Whether a connection error is a refused connection (nothing listens at the server's address)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionRefusedError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def status_reason(exc: "openai.APIStatusError") -> tuple[str, str]:  # noqa: F821 - the SDK is imported when a model is built
    """An HTTP error answer → (reason, message): ``("HTTP 400 context_length_exceeded", "This model's …")``."""
    body = exc.body if isinstance(exc.body, dict) else {}
    code = body.get("code") or body.get("type")
    reason = f"HTTP {exc.status_code}" + (f" {code}" if isinstance(code, str) and code else "")
    message = body.get("message") if isinstance(body.get("message"), str) else exc.message
    return reason, " ".join(str(message).split())


def retry_after(headers) -> float | None:
    """The seconds a 429/503 answer asks to wait: ``retry-after-ms``, or ``Retry-After`` in seconds or as an HTTP date."""
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = parsedate_to_datetime(value)
            when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
            return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError, OverflowError):
        return None  # a header no one can read: the usual backoff


def endpoint(base_url: str, path: str) -> str:
    """``base_url`` joined with ``path``, whether or not the base URL ends with a slash or has a path at all."""
    return f"{base_url.rstrip('/')}/{path}"


def public_url(url: str) -> str:
    """A server URL as it may be recorded: no user:password, query or fragment, no trailing slash."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def parse_completion(r: object, keys=()) -> Completion:
    """A chat-completion response body (JSON) as a :class:`Completion`; a malformed one is transient, one without text
    is a transient failure :data:`~.base.EMPTY` (no content, ``null``, whitespace alone, a tool call alone). ``keys``:
    the client's, taken out of the body's text in a failure (:func:`~.base.scrub`)."""
    try:
        usage = r.get("usage") or {}
        tin, tout = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
        choice = r["choices"][0]
        msg, finish = choice["message"], choice.get("finish_reason")
        text, refusal = msg.get("content"), msg.get("refusal")
        served = r.get("model") if isinstance(r.get("model"), str) and r.get("model") else None
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, OverflowError):  # usage of 1e400: no count
        raise TransientError(MALFORMED, scrub(str(r), keys)[:200]) from None  # scrubbed before it is cut
    if text is not None and not isinstance(text, str):
        raise TransientError(MALFORMED, f"content is {type(text).__name__}")
    if finish == "content_filter" or refusal:
        reason = "content_filter" if finish == "content_filter" else "refusal"
        why = f"{reason}: {' '.join(str(refusal or text or 'the server blocked the answer').split())}"
        return Completion(refusal or text, "refusal", finish, tin, tout, error=why[:ERROR_CHARS], reason=reason, model=served)
    if text is None or not visible(text):
        what = "no content" if text is None else f"content {text[:20]!r}"
        if msg.get("tool_calls") or msg.get("function_call"):
            what += " (a tool call only)"
        return Completion.failure(
            EMPTY,
            f"{what}, finish_reason {finish}",
            transient=True,
            finish_reason=finish,
            tokens_in=tin,
            tokens_out=tout,
            model=served,
        )
    return Completion(text, "ok", finish, tin, tout, model=served)


#: The most tokens a reply's ``usage`` may count: more is no count a server made (and a cost no budget could hold).
MAX_TOKENS_COUNTED = 10**9
#: A dated snapshot of a model, after its name: a date as OpenAI, Anthropic and Mistral write it (``gpt-4-0613``,
#: ``mistral-large-2407``: four digits; ``claude-3-5-sonnet-20241022``: eight; ``gpt-4o-2024-08-06``).
_SNAPSHOT = re.compile(r"[-_](?:\d{4}|\d{8}|\d{4}-\d{2}-\d{2})")
#: A model named by its file (llama.cpp): a path, or a ``.gguf`` file name.
_FILE = re.compile(r"^(?:/|\./|~/|[a-z]:\\)|\.gguf$")


def _tokens(usage: dict, key: str) -> int:
    """A token count of a reply's ``usage``: 0 when absent, else a whole number from 0 to :data:`MAX_TOKENS_COUNTED`
    (a negative count would make a negative cost, and ``--budget`` would never trip); anything else is malformed."""
    n = usage.get(key)
    if n is None:
        return 0
    if type(n) is float and n.is_integer():
        n = int(n)
    if type(n) is not int or not 0 <= n <= MAX_TOKENS_COUNTED:
        raise TransientError(MALFORMED, f"usage {key} {scrub(str(n))[:40]!r} is not a token count")
    return n


def declared_names(entries: list) -> dict[str, set[str]]:
    """A /v1/models list as model id -> the names it goes by: its id, and the ``root``, ``parent`` and ``aliases`` an
    entry gives (vLLM's served name over its weights, llama.cpp's aliases)."""
    out: dict[str, set[str]] = {}
    for m in entries:
        names = {str(m["id"])}
        for k in ("root", "parent"):
            if isinstance(m.get(k), str) and m[k]:
                names.add(m[k])
        if isinstance(m.get("aliases"), list):
            names.update(str(a) for a in m["aliases"] if isinstance(a, str) and a)
        out.setdefault(str(m["id"]), set()).update(names)
    return out


def same_model(asked: str, named: str) -> bool:
    """Whether a reply naming ``named`` is the model ``asked`` (or a name the server declares), compared without case:

    - the same name, or that name at a revision (``transformers serve`` answers ``my-doctor@main`` for ``my-doctor``);
    - a dated snapshot of it: the name, then ``-`` or ``_`` and a date alone (:data:`_SNAPSHOT`: ``gpt-4-0613`` and
      ``gpt-4o-2024-08-06`` are ``gpt-4`` and ``gpt-4o``; ``gpt-4.5-preview``, ``gpt-4o-mini`` and ``llama-3-70b`` are
      other models);
    - the name without its organisation (``Qwen2.5-7B`` for ``Qwen/Qwen2.5-7B``), never with one added
      (``evil-org/loopback`` is not ``loopback``);
    - its file (llama.cpp names a model by its path: ``/models/smollm2.gguf`` for ``smollm2``)."""
    a, n = asked.strip().lower(), named.strip().lower().split("@", 1)[0]
    if _FILE.search(n):
        a, n = (x.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".gguf") for x in (a, n))
    elif "/" not in n:
        a = a.rsplit("/", 1)[-1]
    return n == a or (n.startswith(a) and _SNAPSHOT.fullmatch(n, len(a)) is not None)
