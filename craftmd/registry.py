"""One registry shape for every named thing: metrics, datasets, tasks and scorers.

``Registry("metric")`` maps names to definitions; registering a name twice with another
definition is an error, and looking up an unknown name is a one-line error that lists the
known ones.
"""

from __future__ import annotations

import re
from typing import Generic, TypeVar

from craftmd import CraftMDError

T = TypeVar("T")


def slug(text: str, sep: str = "_", *, lower: bool = False) -> str:
    """``text`` as a name for ids and files: every run of other characters than letters, digits, ``.``, ``_`` and ``-``
    (with ``lower``: than lowercase letters and digits, after lowercasing) becomes one ``sep``; ``sep`` and ``.`` are
    stripped from the ends. Release ids, audit ids and rubric dimension ids are made by it."""
    if lower:
        return re.sub(r"[^a-z0-9]+", sep, text.lower()).strip(sep + ".")
    return re.sub(r"[^A-Za-z0-9._-]+", sep, text).strip(sep + ".")


class Registry(Generic[T], dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str, item: T) -> T:
        old = self.get(name)
        if old is not None and old != item:
            raise CraftMDError(f"{self.kind} {name!r} is already registered with another definition")
        self[name] = item
        return item

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise CraftMDError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}") from None


__all__ = ["Registry"]
