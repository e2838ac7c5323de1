"""What fits a server: its context window, asked before anything is sent (``craftmd generate --estimate`` and a run's start).

Servers that say how many tokens a request may hold (prompt and reply together):

- vLLM (and SGLang): ``GET /v1/models`` gives each model's ``max_model_len``;
- llama.cpp's C++ server (``llama-server``): ``GET /props`` gives ``default_generation_settings.n_ctx`` (per slot).

llama-cpp-python's server (``python -m llama_cpp.server``) reports neither: its window is what ``--n_ctx`` was given,
and the README's table of each task's largest prompt and reply says what to give. A server that does not answer, or
answers something else, has an unknown window (None): nothing is refused on a guess.
"""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import urlsplit, urlunsplit


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """No redirect is followed (as in the model layer): the key would go to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx is an error: the window is unknown


_OPENER = urllib.request.build_opener(_NoRedirect)
#: The most bytes of an answer read.
MAX_BYTES = 1 << 20


def _get(url: str, key: str | None, timeout: float) -> object:
    """The JSON at ``url``, read whole within ``timeout`` seconds (a deadline: a body trickled byte by byte is cut off)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    deadline = time.monotonic() + timeout
    with _OPENER.open(req, timeout=timeout) as r:  # noqa: S310 - an http(s) URL checked by check_url
        body = b""
        while len(body) < MAX_BYTES and (chunk := r.read1(min(65536, MAX_BYTES - len(body)))):
            body += chunk
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: no whole answer within {timeout:g} s")
        return json.loads(body)


def context_window(base_url: str, model: str, key: str | None = None, timeout: float = 5.0) -> int | None:
    """The tokens one request to ``model`` at ``base_url`` (an OpenAI-compatible ``.../v1``) may hold, or None when the
    server does not say."""
    base = base_url.rstrip("/")
    try:
        page = _get(f"{base}/models", key, timeout)
        for m in page.get("data", []) if isinstance(page, dict) else []:
            if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
    except (OSError, ValueError):
        pass
    parts = urlsplit(base)
    root = urlunsplit((parts.scheme, parts.netloc, parts.path.removesuffix("/v1"), "", ""))
    try:
        props = _get(f"{root}/props", key, timeout)
        n = (props.get("default_generation_settings") or {}).get("n_ctx") if isinstance(props, dict) else None
        return n if isinstance(n, int) and n > 0 else None
    except (OSError, ValueError, AttributeError):
        return None


def too_long(largest: dict[tuple[str, str], tuple[int, int]], windows: dict[str, tuple[int | None, str]]) -> list[str]:
    """One line per (role, what) whose largest call (prompt tokens, reply budget) exceeds its server's window.

    ``largest``: (role, what) -> (prompt tokens, reply tokens); ``windows``: role -> (window or None, where)."""
    lines = []
    for (role, what), (prompt, reply) in sorted(largest.items()):
        window, where = windows.get(role, (None, ""))
        if window is not None and prompt + reply > window:
            lines.append(f"{role} {what}: ~{prompt:,} prompt + {reply:,} reply tokens > the {window:,}-token window of {where}")
    return lines


__all__ = ["context_window", "too_long"]
