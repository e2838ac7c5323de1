"""``openai/<model>``: any OpenAI-compatible chat server through ``openai.AsyncOpenAI``.

A hosted API, Azure's OpenAI endpoint, a ``vllm serve`` server or the test suite's
loopback server. ``base_url`` and ``api_key`` default to the client's usual
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; a local server needs no key. The client's own
retries are switched off: :class:`craftmd.generation.calls.Caller` retries.
"""

from __future__ import annotations

import os
import ssl

import httpx2  # openai's HTTP client
import openai
from openai.types.chat import ChatCompletion

from craftmd import CraftMDError

from .base import ChatModel, Completion, Message, Sampling, TransientError

#: HTTP statuses worth retrying.
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
#: Error codes a server uses for a content-filter block (Azure, OpenAI).
_TLS: ssl.SSLContext | None = None
#: Requests in flight per client before another client (connection pool) is opened.
CONNECTIONS_PER_CLIENT = 8
FILTER_CODES = {"content_filter", "content_policy_violation", "ResponsibleAIPolicyViolation"}


class OpenAIModel(ChatModel):
    provider = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 120.0):
        super().__init__(model)
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self.base_url is None:
                raise CraftMDError("openai models need OPENAI_API_KEY (or --base-url for a local server)")
            key = "EMPTY"  # local OpenAI-compatible servers accept any key
        self._key, self._timeout = key, timeout
        # httpx's pool scans every connection for each request, so a client with hundreds of connections
        # spends milliseconds per request; requests are spread over several clients of few connections each.
        self._clients: list[openai.AsyncOpenAI] = []
        self._load: list[int] = []
        self.client = self._new_client()

    def _new_client(self) -> openai.AsyncOpenAI:
        global _TLS
        if _TLS is None:  # one TLS context for every client: building one reads the CA bundle (~0.1 s)
            _TLS = ssl.create_default_context()
        n = 2 * CONNECTIONS_PER_CLIENT
        http = openai.DefaultAsyncHttpx2Client(verify=_TLS, limits=httpx2.Limits(max_connections=n, max_keepalive_connections=n))
        client = openai.AsyncOpenAI(api_key=self._key, base_url=self.base_url, max_retries=0, timeout=self._timeout, http_client=http)
        self._clients.append(client)
        self._load.append(0)
        return client

    def _pick(self) -> int:
        i = min(range(len(self._load)), key=self._load.__getitem__)
        if self._load[i] >= CONNECTIONS_PER_CLIENT:
            self._new_client()
            i = len(self._clients) - 1
        return i

    def describe(self) -> dict:
        d = super().describe()
        d["base_url"] = str(self.client.base_url)
        return d

    async def check(self) -> None:
        where = str(self.client.base_url)
        try:
            page = await self.client.models.list()
            served = [m.id async for m in page] if hasattr(page, "__aiter__") else [m.id for m in page.data]
        except (openai.APIConnectionError, openai.APITimeoutError):
            raise CraftMDError(f"cannot reach the model server at {where}") from None
        except openai.AuthenticationError:
            raise CraftMDError(f"the server at {where} refused the API key (set OPENAI_API_KEY)") from None
        except openai.APIStatusError as exc:
            raise CraftMDError(f"{where}models answered HTTP {exc.status_code}") from None
        if self.model not in served:
            shown = ", ".join(sorted(served)[:10]) + (" …" if len(served) > 10 else "")
            raise CraftMDError(f"the server at {where} does not serve {self.model!r} (it serves: {shown or 'nothing'})")

    async def chat(self, messages: list[Message], sampling: Sampling) -> Completion:
        i = self._pick()
        self._load[i] += 1
        try:
            return await self._chat(self._clients[i], messages, sampling)
        finally:
            self._load[i] -= 1

    async def _chat(self, client: openai.AsyncOpenAI, messages: list[Message], sampling: Sampling) -> Completion:
        try:
            # The plain request body through the client's own request machinery (errors, timeouts, typed
            # response): ``chat.completions.create`` would walk every message to transform it first, a few
            # milliseconds per request that dominate a fast local server.
            body = {"model": self.model, "messages": messages, **sampling.to_dict()}
            r = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from None
        except openai.APIStatusError as exc:
            if exc.status_code in RETRY_STATUS or exc.status_code >= 500:
                raise TransientError(f"HTTP {exc.status_code}") from None
            code = getattr(exc, "code", None)
            if code in FILTER_CODES:
                return Completion(None, "refusal", "content_filter", error=f"HTTP {exc.status_code}: {code}")
            return Completion(None, "error", None, error=f"HTTP {exc.status_code}: {exc.message}"[:500])
        except openai.APIResponseValidationError as exc:
            raise TransientError(f"malformed response: {exc}") from None
        usage = r.usage
        tin, tout = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
        if not r.choices:
            raise TransientError("response without choices")
        choice = r.choices[0]
        msg = choice.message
        refusal = getattr(msg, "refusal", None)
        if choice.finish_reason == "content_filter" or refusal:
            return Completion(refusal or msg.content, "refusal", choice.finish_reason, tin, tout)
        if msg.content is None:
            return Completion(None, "error", choice.finish_reason, tin, tout, error="no text in the response")
        return Completion(msg.content, "ok", choice.finish_reason, tin, tout)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.close()
