"""Chat models named ``provider/model``: ``openai/<model>`` and ``vllm/<model-or-path>``.

Adding a provider is one file with a :class:`ChatModel` subclass and one line in
``PROVIDERS``.
"""

from __future__ import annotations

from craftmd import CraftMDError

from .base import ChatModel, Completion, Message, Sampling, TransientError
from .openai import OpenAIModel
from .vllm import VLLMModel

PROVIDERS = {"openai": OpenAIModel, "vllm": VLLMModel}
_VLLM_ENGINES: dict[str, VLLMModel] = {}

__all__ = ["ChatModel", "Completion", "Message", "Sampling", "TransientError", "OpenAIModel", "VLLMModel", "get_model", "split_name"]


def split_name(name: str) -> tuple[str, str]:
    provider, _, model = name.partition("/")
    if not model or provider not in PROVIDERS:
        raise CraftMDError(f"model {name!r}: expected PROVIDER/MODEL with provider one of {', '.join(PROVIDERS)}")
    return provider, model


def get_model(name: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 120.0) -> ChatModel:
    """The model called ``name`` (``openai/gpt-4o``, ``vllm/Qwen/Qwen2.5-7B-Instruct``)."""
    provider, model = split_name(name)
    if provider == "openai":
        return OpenAIModel(model, base_url=base_url, api_key=api_key, timeout=timeout)
    # One offline engine per model, shared by every agent that uses it (doctor = patient is common).
    if model not in _VLLM_ENGINES:
        _VLLM_ENGINES[model] = VLLMModel(model)
    return _VLLM_ENGINES[model]
