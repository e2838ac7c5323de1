"""Chat models named the inspect_ai way, each bound to its own endpoint.

- ``openai/<model>``: OpenAI, or any OpenAI-compatible server at ``--base-url`` /
  ``OPENAI_BASE_URL``; key from ``OPENAI_API_KEY``.
- ``openai-api/<service>/<model>``: any OpenAI-compatible service; its server is read from
  ``<SERVICE>_BASE_URL`` and its key from ``<SERVICE>_API_KEY`` (the service upper-cased, ``-``
  turned into ``_``). So a local doctor, an API patient and judges from several vendors meet in
  one run, each role on its own server with its own key. ``<SERVICE>_BASE_URL`` may list several
  servers, comma-separated: a pool the run spreads its conversations over (:mod:`.pool`; a server
  listed twice, in any spelling of its URL, is one server).
- ``vllm/<model-or-path>``: vLLM's offline engine in this process.
- ``llama.cpp/<file.gguf>`` (and ``vllm/`` with ``--serve``): a local model the command that calls it starts servers for,
  then calls as ``openai-api/<engine>/<name>`` (:mod:`.serve`).

Adding a provider is one file with a :class:`ChatModel` subclass and one branch in
:func:`get_model`. :class:`~craftmd.models.connect.Connections` wires a run's models (one
client per model, one request-slot pool per server, the cache, the callers);
:class:`~craftmd.models.local_server.LocalServer` runs a model server as a child process (group).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from craftmd import CraftMDError

from .base import ChatModel, Completion, Message, Sampling, TransientError
from .openai import OpenAIModel
from .pool import PoolModel, server_key
from .vllm import VLLMModel

PROVIDERS = ("openai", "openai-api", "vllm")
_VLLM_ENGINES: dict[str, VLLMModel] = {}
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

__all__ = [
    "ChatModel",
    "Completion",
    "Message",
    "Sampling",
    "TransientError",
    "OpenAIModel",
    "PoolModel",
    "VLLMModel",
    "ModelName",
    "get_model",
    "parse_name",
    "PROVIDERS",
]


@dataclass(frozen=True)
class ModelName:
    """A parsed model name: ``provider``, the model the server knows, and (``openai-api``) the service."""

    provider: str
    model: str
    service: str | None = None

    def __str__(self) -> str:
        return "/".join(x for x in (self.provider, self.service, self.model) if x)

    @property
    def prefix(self) -> str:
        """The environment variables' prefix: ``OPENAI`` or the service upper-cased with ``-`` as ``_``."""
        return (self.service or "openai").upper().replace("-", "_")


def parse_name(name: str) -> ModelName:
    """``openai/gpt-4o``, ``openai-api/local/my-model`` or ``vllm/Qwen/Qwen2.5-7B-Instruct`` → :class:`ModelName`."""
    provider, _, rest = str(name).partition("/")
    if provider == "openai-api":
        service, _, model = rest.partition("/")
        if not model or not _SERVICE.fullmatch(service):
            raise CraftMDError(
                f"model {name!r}: expected openai-api/<service>/<model>, e.g. openai-api/local/my-model "
                "(server from LOCAL_BASE_URL, key from LOCAL_API_KEY)"
            )
        return ModelName(provider, model, service)
    if provider == "llama.cpp":
        raise CraftMDError(
            f"model {name!r}: a llama.cpp/ model is started by the command that calls it (--serve); here, start its "
            "server and name it openai-api/<service>/<model> (docs/local.md)"
        )
    if not rest or provider not in PROVIDERS:
        raise CraftMDError(
            f"model {name!r}: expected PROVIDER/MODEL with provider one of {', '.join(PROVIDERS)} "
            "(openai-api/<service>/<model> for any OpenAI-compatible service)"
        )
    return ModelName(provider, rest)


def check_url(url: str, what: str, key_var: str) -> str:
    """``url`` if it is an http(s) URL with a host and no credentials; else one line naming ``what``."""
    try:
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            # Never sent as Basic auth nor recorded: the key belongs in its variable, where nothing writes it down.
            raise CraftMDError(f"{what} has credentials in it (user:password@); put the key in {key_var} instead")
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise CraftMDError(f"{what} {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CraftMDError(f"{what} {url!r} is not an http(s) URL such as http://localhost:8000/v1")
    return url


def endpoint_of(name: ModelName, base_url: str | None = None, api_key: str | None = None) -> tuple[str | None, str | None, str]:
    """(server URL, key, the key's variable) for an OpenAI-compatible model; one line for a missing variable."""
    if name.provider == "openai":
        url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if url:
            check_url(url, "--base-url" if base_url else "OPENAI_BASE_URL", "OPENAI_API_KEY")
        elif not key:
            raise CraftMDError(f"{name} needs OPENAI_API_KEY (or --base-url / OPENAI_BASE_URL for a local server)")
        return url, key, "OPENAI_API_KEY"
    var, key_var = f"{name.prefix}_BASE_URL", f"{name.prefix}_API_KEY"
    url = os.environ.get(var, "").strip()
    if not url:
        raise CraftMDError(
            f"{name} needs {var}: the service's server, e.g. {var}=http://localhost:8000/v1 (and {key_var} if it wants a key)"
        )
    urls = [check_url(u.strip(), var, key_var) for u in url.split(",")]  # several: a pool of servers
    # one server listed twice (url and url/, localhost and 127.0.0.1, a default port) is one server: the first spelling
    first: dict[str, str] = {}
    for u in urls:
        first.setdefault(server_key(u), u)
    urls = list(first.values())
    return ",".join(urls), os.environ.get(key_var) or None, key_var


def get_model(name: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 120.0) -> ChatModel:
    """The model called ``name``. ``base_url`` and ``api_key`` apply to ``openai/`` models only; an
    ``openai-api/<service>/`` model reads its own variables."""
    n = parse_name(name)
    if n.provider == "vllm":
        # One offline engine per model, shared by every agent that uses it (doctor = patient is common).
        if n.model not in _VLLM_ENGINES:
            _VLLM_ENGINES[n.model] = VLLMModel(n.model)
        return _VLLM_ENGINES[n.model]
    url, key, key_var = endpoint_of(n, base_url, api_key)
    if n.service and "," in url:
        return PoolModel(n.model, url.split(","), service=n.service, api_key=key, timeout=timeout, key_var=key_var)
    return OpenAIModel(n.model, base_url=url, api_key=key, timeout=timeout, service=n.service, key_var=key_var)
