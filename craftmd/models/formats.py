"""Structured output that degrades: a caller declares the JSON it wants, the model layer asks each server the way it takes.

A caller that wants a JSON reply declares its schema once (:func:`structured`); the
:class:`~craftmd.models.calls.Caller` sends it as the OpenAI ``response_format`` the server takes,
in the order of :data:`FORMATS`:

1. ``json_schema``: OpenAI's structured output (OpenAI, vLLM, llama.cpp's ``llama-server``);
2. ``json_object`` with the schema beside it (llama-cpp-python's server turns it into a grammar);
3. ``none``: no ``response_format``; the reply is read and validated by the caller as any reply.

The choice is made once per server (:class:`Formats`, shared by every caller of the server): the first
request probes while the others wait; a server that refuses a format (:func:`refused`: its error names
``response_format``, ``json_schema`` or a grammar, whatever the HTTP status: llama-cpp-python answers 500,
others 400 or 422) moves to the next format at once, without retrying the refused one, and every later
request goes in the format that worked. What was used and refused is recorded by the caller (the judge's
record, a run's record). A refusal is a deterministic failure, cached like one, and the cache remembers it
for the server (a row keyed by the server, the model and the format), so a re-run over a full cache starts
at the format that worked and sends nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field, replace

from .base import Completion, Sampling

FORMATS = ("json_schema", "json_object", "none")
#: The reason of a failure that is the server refusing the response format asked for.
FORMAT_REFUSED = "response format refused"
#: A server's error that refuses the response format (the request's ``response_format``, its JSON schema or the grammar
#: made from it).
REFUSAL_TEXT = re.compile(r"(?i)response[_ ]format|json[_ ]schema|grammar")


def structured(sampling: Sampling, schema: dict, *, name: str, strict: bool = False, start: str = "json_schema") -> Sampling:
    """``sampling`` asking for a JSON reply that matches ``schema`` (``name`` names it to the server; ``strict`` asks
    OpenAI's strict mode; ``start`` is the first of :data:`FORMATS` to try)."""
    if start not in FORMATS:
        raise ValueError(f"response format {start!r}: one of {', '.join(FORMATS)}")
    declared = json.dumps({"name": name, "schema": schema, "strict": strict, "start": start}, sort_keys=True)
    return replace(sampling, schema=declared, response_format=None)


def response_format(kind: str, schema: dict, *, name: str, strict: bool = False) -> str | None:
    """The ``response_format`` of ``kind`` for ``schema``, as the JSON text that is sent and keyed (None for ``none``)."""
    if kind == "none":
        return None
    if kind == "json_object":  # llama-cpp-python's server: a JSON object constrained by a schema
        return json.dumps({"type": "json_object", "schema": schema}, sort_keys=True)
    return json.dumps({"type": "json_schema", "json_schema": {"name": name, "strict": strict, "schema": schema}}, sort_keys=True)


def as_sent(sampling: Sampling, kind: str) -> Sampling:
    """A structured ``sampling`` as it is sent in ``kind``: its declared schema turned into that ``response_format``."""
    d = json.loads(sampling.schema)
    return replace(sampling, schema=None, response_format=response_format(kind, d["schema"], name=d["name"], strict=d["strict"]))


def start_of(sampling: Sampling) -> int:
    return FORMATS.index(json.loads(sampling.schema)["start"])


def refused(c: Completion) -> bool:
    """Whether ``c`` is a server's refusal of the response format it was asked for."""
    return c.status == "error" and (c.reason or "").startswith(FORMAT_REFUSED)


@dataclass(eq=False)
class Formats:
    """One server's response format: the level reached in :data:`FORMATS`, what it refused (format -> its error), what
    was used (format -> requests answered in it), and whether a format has worked yet (until then one request at a time
    probes)."""

    level: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    settled: bool = False
    recalled: bool = False  # the refusals an earlier run stored in the cache have been read
    _lock: asyncio.Lock | None = field(default=None, repr=False)

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def refuse(self, kind: str, c: Completion) -> None:
        """``kind`` was refused: the server moves past it (once, however many requests saw the refusal)."""
        self.level = max(self.level, FORMATS.index(kind) + 1)
        self.refused.setdefault(kind, c.error or c.reason or FORMAT_REFUSED)

    def answered(self, kind: str, c: Completion) -> None:
        """A request was answered in ``kind`` (a failure for another reason too): an answer settles the format."""
        self.used[kind] = self.used.get(kind, 0) + 1
        self.settled = self.settled or c.status != "error"

    def record(self) -> dict:
        """``{"used": [formats], "refused": {format: error}}`` as a record holds it."""
        return {"used": sorted(self.used, key=FORMATS.index), "refused": dict(sorted(self.refused.items()))}

    def counts(self) -> dict:
        """``{"used": {format: requests}, "refused": {format: 1}}``: counts, as a run record's ``counts`` holds them (shards
        of a run add up)."""
        return {"used": dict(sorted(self.used.items())), "refused": dict.fromkeys(sorted(self.refused), 1)}


__all__ = ["FORMATS", "FORMAT_REFUSED", "Formats", "structured", "response_format", "refused"]
