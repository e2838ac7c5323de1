"""``openai/<model>``: any OpenAI-compatible chat server through ``openai.AsyncOpenAI``.

A hosted API, Azure's OpenAI endpoint, a ``vllm serve`` server or the test suite's
loopback server. ``base_url`` and ``api_key`` default to the client's usual
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; a local server needs no key. The client's own
retries are switched off: :class:`craftmd.models.calls.Caller` retries.

A 4xx answer other than 408/409/425/429 is a deterministic failure, returned as a failed
:class:`Completion` with its status, error code and message (the caller caches it); a
timeout, a dropped connection, a 408/409/425/429/5xx or a body that is not a chat
completion raises :class:`TransientError` (with the server's ``Retry-After``, when it gave one).

Server text that is stored (an error's message, a reply) never keeps the client's API key
or a ``Bearer`` token: a server that echoes the Authorization header has it taken out. A
reply longer than :data:`REPLY_CHARS_PER_TOKEN` characters per token of ``max_tokens`` (a
server that ignored the limit) is a failure ``reply too long``, not an answer.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from dataclasses import replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit, urlunsplit

from craftmd import CraftMDError

from .base import ERROR_CHARS, ChatModel, Completion, Message, Sampling, TransientError

#: HTTP statuses worth retrying.
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_TLS: ssl.SSLContext | None = None
#: Connections the client keeps open to one server (requests beyond wait for one).
MAX_CONNECTIONS = 1024
#: The SDK's telemetry headers (platform, runtime, retry count, read timeout), removed from every chat
#: request with ``openai.omit`` (the client's documented way to drop a default header): no server needs
#: them, and each one is normalised by httpx and again by aiohttp, and parsed by the server.
TELEMETRY_HEADERS = tuple(f"X-Stainless-{name}" for name in ("Lang", "Package-Version", "OS", "Arch", "Runtime", "Runtime-Version",
                                                              "Async", "Retry-Count", "Read-Timeout"))
#: Error codes a server uses for a content-filter block (Azure, OpenAI).
FILTER_CODES = {"content_filter", "content_policy_violation", "ResponsibleAIPolicyViolation"}
#: The most characters a reply may have per token of ``max_tokens`` (a generous bound: tokens average about 4): a server
#: that ignores max_tokens and sends megabytes gets a failure ``reply too long``, never a stored answer.
REPLY_CHARS_PER_TOKEN = 32
#: A bearer token as it appears in an echoed Authorization header.
BEARER = re.compile(r"(?i)\bbearer\s+[^\s\"',;]+")


def _sdk():
    """The openai SDK and its HTTP client (``httpx2``), imported when a model is first built: about 0.8 s that the
    commands calling no model (the analysis, the page, scoring by rule) never pay."""
    import httpx2
    import openai

    return openai, httpx2


class OpenAIModel(ChatModel):
    provider = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 120.0,
                 service: str | None = None, key_var: str = "OPENAI_API_KEY"):
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
        http = openai.DefaultAioHttpClient(verify=_TLS, limits=limits)
        self.client = openai.AsyncOpenAI(api_key=key, base_url=self.base_url, max_retries=0, timeout=timeout, http_client=http)
        # The endpoint as an absolute URL, joined once: a relative path is re-joined to the base URL
        # (two more URL parses) on every request.
        self._chat_url = endpoint(str(self.client.base_url), "chat/completions")
        self._options: openai.RequestOptions = {"headers": dict.fromkeys(TELEMETRY_HEADERS, openai.omit)}
        self.server = public_url(str(self.client.base_url))

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
            page = await self.client.get(url, cast_to=httpx2.Response)
            served = [m["id"] for m in page.json()["data"]]
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
            raise CraftMDError(f"{public_url(url)} did not answer with a model list (is {where} an OpenAI-compatible API?)") from None
        if self.model not in served:
            shown = ", ".join(sorted(served)[:10]) + (" …" if len(served) > 10 else "")
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
            r = await self.client.post(self._chat_url, body=body, cast_to=httpx2.Response, options=self._options)
        except openai.APIConnectionError as exc:  # a timeout too (APITimeoutError)
            if refused(exc):  # nothing listens (a server down or gone; the transport calls it a connect timeout)
                raise TransientError("connection refused", self.scrub(str(exc.__cause__ or exc))) from None
            if isinstance(exc, openai.APITimeoutError):
                raise TransientError("timeout", f"no answer within {self.client.timeout} s") from None
            raise TransientError("connection error", self.scrub(str(exc.__cause__ or exc))) from None
        except openai.APIStatusError as exc:
            reason, message = (self.scrub(x) for x in status_reason(exc))
            if exc.status_code in RETRY_STATUS or exc.status_code >= 500:
                raise TransientError(reason, message, retry_after=retry_after(exc.response.headers)) from None
            if getattr(exc, "code", None) in FILTER_CODES:
                return Completion(None, "refusal", "content_filter", error=f"{reason}: {message}"[:ERROR_CHARS], reason=reason)
            return Completion.failure(reason, message)
        try:
            data = r.json()
        except ValueError:  # not JSON (a proxy's error page, a cut-off body)
            raise TransientError("malformed response", self.scrub(repr(r.text[:200]))) from None
        c = parse_completion(data)
        cap = REPLY_CHARS_PER_TOKEN * sampling.max_tokens
        if c.text is not None and len(c.text) > cap:  # the server ignored max_tokens: nothing of it is stored
            return Completion.failure("reply too long", f"{len(c.text):,} characters under max_tokens {sampling.max_tokens} (at most "
                                      f"{cap:,}); not stored", finish_reason=c.finish_reason, tokens_in=c.tokens_in,
                                      tokens_out=c.tokens_out, model=c.model)  # fmt: skip
        if self._secrets and any(x in (c.text or "") or x in (c.error or "") for x in self._secrets):  # the reply's words kept
            c = replace(c, text=None if c.text is None else self.scrub(c.text, bearer=False),
                        error=None if c.error is None else self.scrub(c.error, bearer=False))
        return c

    @property
    def _secrets(self) -> tuple[str, ...]:
        """The client's API key, when it is one (a local server's placeholder is not)."""
        key = self.client.api_key or ""
        return (key,) if len(key) >= 8 else ()

    def scrub(self, text: str, *, bearer: bool = True) -> str:
        """Server text with the client's API key (and, in an error, any ``Bearer`` token) taken out, before anything stores it."""
        for secret in self._secrets:
            text = text.replace(secret, "[API key]")
        return BEARER.sub("Bearer [token]", text) if bearer else text

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


def status_reason(exc: openai.APIStatusError) -> tuple[str, str]:
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


def parse_completion(r: object) -> Completion:
    """A chat-completion response body (JSON) as a :class:`Completion`; a malformed one is transient."""
    try:
        usage = r.get("usage") or {}
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        choice = r["choices"][0]
        msg, finish = choice["message"], choice.get("finish_reason")
        text, refusal = msg.get("content"), msg.get("refusal")
        served = r.get("model") if isinstance(r.get("model"), str) and r.get("model") else None
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise TransientError("malformed response", str(r)[:200]) from None
    if text is not None and not isinstance(text, str):
        raise TransientError("malformed response", f"content is {type(text).__name__}")
    if finish == "content_filter" or refusal:
        reason = "content_filter" if finish == "content_filter" else "refusal"
        why = f"{reason}: {' '.join(str(refusal or text or 'the server blocked the answer').split())}"
        return Completion(refusal or text, "refusal", finish, tin, tout, error=why[:ERROR_CHARS], reason=reason, model=served)
    if text is None:
        return Completion.failure("no text", f"the answer has no content (finish_reason {finish})", finish_reason=finish,
                                  tokens_in=tin, tokens_out=tout, model=served)
    return Completion(text, "ok", finish, tin, tout, model=served)
