"""Keys for local services are optional under inspect as under ``craftmd``.

``craftmd`` calls an ``openai-api/<service>/<model>`` (or an ``openai/<model>`` at ``OPENAI_BASE_URL``) without a key
when none is set: a local server (vLLM, llama.cpp) wants none. inspect's ``openai-api`` provider refuses to start
without ``<SERVICE>_API_KEY``. This inspect hook (loaded with the package's entry point, before inspect makes its
models) answers inspect's API-key override with a placeholder for exactly that case: no key anywhere, and the service's
``<SERVICE>_BASE_URL`` set. A key that is set is never touched, and none is ever written.
"""

from __future__ import annotations

import os

from inspect_ai.hooks import ApiKeyOverride, Hooks, hooks

#: What a server that checks no key is sent (the same as craftmd's own clients send).
PLACEHOLDER = "EMPTY"


def local_key(env_var_name: str, value: str) -> str | None:
    """The key to use for ``env_var_name`` (``<SERVICE>_API_KEY``) whose value is ``value``: the placeholder when no key is
    set and the service's server is named (``<SERVICE>_BASE_URL``), else None (inspect's own behaviour)."""
    if value or not env_var_name.endswith("_API_KEY"):
        return None
    base = env_var_name.removesuffix("_API_KEY") + "_BASE_URL"
    return PLACEHOLDER if os.environ.get(base, "").strip() else None


@hooks(name="craftmd_local_keys", description="no API key needed for a service whose <SERVICE>_BASE_URL is set (a local server)")
class LocalKeys(Hooks):
    def override_api_key(self, data: ApiKeyOverride) -> str | None:
        return local_key(data.env_var_name, data.value)


__all__ = ["local_key", "LocalKeys", "PLACEHOLDER"]
