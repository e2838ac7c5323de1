"""Reading JSON-lines text that arrived whole (a pinned source's file, a catalog, a user's case file): the one reader
that says where a line is bad. A submission, read from a file of any size, has its own bounded, streaming reader
(:mod:`craftmd.scoring.submission`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from craftmd import CraftMDError


def json_lines(data: bytes | str, where: str) -> Iterator[tuple[int, object]]:
    """(line number, value) of every non-blank line of ``data``, numbered from 1; text that is not UTF-8, or a line
    that is not JSON, is one line naming ``where`` (the file, as its errors call it) and the line."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CraftMDError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CraftMDError(f"{where}:{n}: not JSON ({exc.msg})") from None
        yield n, value


__all__ = ["json_lines"]
