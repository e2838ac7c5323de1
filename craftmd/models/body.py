"""A server's reply body, bounded as it is decoded: a gzip or deflate body small on the wire and huge once inflated (a
"gzip bomb") is cut off once its decoded bytes pass the limit, never inflated whole.

httpx2 decodes a body a bounded piece at a time (its ``aiter_bytes``); reading a whole body (``aread``, what a client
does for every reply it does not stream, an error's too) joins every piece. :class:`BoundedClient` (the openai SDK's
aiohttp client) gives every response a stream of the body already decoded by those same decoders, counted piece by
piece: past :data:`~craftmd.models.base.BODY_LIMIT` bytes it raises
:class:`~craftmd.models.base.BodyTooLarge`, and nothing more is read. :mod:`.openai` sets the limit
of a chat request from its ``max_tokens`` (:func:`craftmd.models.openai.reply_bytes`); anything else (a model list, an
error's body) has the default.

Only gzip and deflate are decoded: every request says so (``Accept-Encoding:`` :data:`ACCEPT_ENCODING`, where httpx2 would
also offer ``br`` and ``zstd`` once ``brotli`` or ``zstandard`` is installed), and a reply sent in any other encoding is
refused before a byte of it is decoded (:class:`~craftmd.models.base.UnaskedEncoding`): what bounds a reply does not
depend on which decoders happen to be installed, nor on their versions.

Imported when an OpenAI-compatible model is first built (:func:`craftmd.models.openai._sdk`), like the SDK itself.
"""

from __future__ import annotations

import httpx2
import openai

from .base import BODY_LIMIT, BodyTooLarge, UnaskedEncoding

#: The content encodings a request accepts, and the only ones a reply's body is decoded from (``identity``: none).
ACCEPT_ENCODING = "gzip, deflate"
DECODED = frozenset({"gzip", "deflate", "identity"})


class _Decoded(httpx2.AsyncByteStream):
    """``response``'s body decoded by httpx2's own decoders, a piece at a time, cut off past ``limit`` bytes."""

    def __init__(self, response: httpx2.Response, limit: int):
        self.response, self.limit = response, limit

    async def __aiter__(self):
        codings = self.response.headers.get_list("content-encoding", split_commas=True)
        unasked = [c for c in (c.strip().lower() for c in codings) if c and c not in DECODED]
        if unasked:  # a decoder of it (brotli's, zstd's) is never run, whether or not one is installed
            raise UnaskedEncoding(", ".join(unasked)[:40], ACCEPT_ENCODING)
        n = 0
        async for part in self.response.aiter_bytes():
            n += len(part)
            if n > self.limit:
                raise BodyTooLarge(self.limit, self.response.headers.get("content-encoding"))
            yield part

    async def aclose(self) -> None:
        await self.response.aclose()


class _Bounded(httpx2.AsyncBaseTransport):
    """A transport whose requests accept only :data:`ACCEPT_ENCODING` and whose responses carry their body decoded and
    bounded (:class:`_Decoded`): the client reads plain bytes (no content encoding left to decode) and never more than
    the limit."""

    def __init__(self, inner: httpx2.AsyncBaseTransport):
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING  # never br or zstd, whatever httpx2 could decode
        raw = await self.inner.handle_async_request(request)
        encoded = "content-encoding" in raw.headers
        drop = (b"content-encoding", b"content-length") if encoded else ()  # decoded here: its length is another
        headers = [(k, v) for k, v in raw.headers.raw if k.lower() not in drop]
        body = _Decoded(raw, BODY_LIMIT.get())
        return httpx2.Response(raw.status_code, headers=headers, stream=body, request=request, extensions=raw.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class BoundedClient(openai.DefaultAioHttpClient):
    """The openai SDK's aiohttp client, every transport of it (a proxy's too) bounded by :class:`_Bounded`."""

    def _init_transport(self, *args, **kwargs):
        return _Bounded(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args, **kwargs):
        return _Bounded(super()._init_proxy_transport(*args, **kwargs))


__all__ = ["ACCEPT_ENCODING", "BoundedClient"]
