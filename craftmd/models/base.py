"""One small model interface for every provider.

A provider is one file in this folder with one ``ChatModel`` subclass. The engine only
ever calls ``chat`` (one request) or ``chat_many`` (a batch, for providers that batch,
such as vLLM's offline engine). Retries, caching and counters live in
:mod:`craftmd.models.calls`, not here: a provider makes exactly one attempt and
either returns a :class:`Completion` or raises :class:`TransientError` for a failure
worth retrying (429, 5xx, timeout, dropped connection).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

#: A chat message in the OpenAI format; ``content`` is a string or a list of content parts.
Message = dict[str, Any]
Status = Literal["ok", "refusal", "error"]


@dataclass(frozen=True)
class Sampling:
    """Generation settings sent with every request (always explicit: vLLM's default max_tokens is 16)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}  # scalars only: no deep copy

    def with_seed(self, seed: int) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_tokens, seed)


@dataclass(frozen=True)
class Completion:
    """What one request returned. ``text`` is None unless the model produced text."""

    text: str | None
    status: Status
    finish_reason: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    error: str | None = None

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}  # scalars only: no deep copy

    @classmethod
    def from_dict(cls, d: dict) -> Completion:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


class TransientError(Exception):
    """A failure worth retrying: rate limit, server error, timeout or dropped connection."""


class ChatModel(ABC):
    """A chat model named ``provider/model``."""

    provider: str = ""
    #: True when the provider serves many requests best as one batch (``chat_many``).
    batches: bool = False

    def __init__(self, model: str):
        self.model = model

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

    def describe(self) -> dict:
        """What goes into a release manifest about this model (never credentials)."""
        return {"name": self.name, "provider": self.provider, "model": self.model}
