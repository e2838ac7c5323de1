"""The board: the releases one command analyses, read from the releases folder once and keyed by release id.

A command that analyses releases (``craftmd analyse``, ``craftmd leaderboard``: its scoring, analysis, audits and page)
builds one :class:`Board` (:meth:`Board.read`, the only place the analysis lists a releases folder) and hands it on.
Every table of the analysis names a release by its id (its ``model`` or ``release`` column); the display name and the
run record's ``provider/model`` are the releases frame's (:meth:`Board.frame`: ``Analysis.releases``), applied only
where text is written: the page, its Markdown twin, the figures' labels, a CSV's label columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from craftmd.release import Release, find_releases, protocol_of, read_release


def protocol_key(release: Release) -> str | None:
    """The protocol a release ran, as one line (:meth:`craftmd.release.Protocol.key`); None: unknown, equal to none."""
    p = protocol_of(release.manifest)
    return p.key() if p is not None else None


@dataclass(frozen=True)
class Board:
    """The releases of one releases folder (``root``), sorted by id: read once per command (:meth:`read`)."""

    root: Path
    releases: tuple[Release, ...]

    @classmethod
    def read(cls, root: Path | str) -> Board:
        """Every release directly under ``root`` (:func:`craftmd.release.find_releases`: each verified, two of one id or
        of one run refused): the one listing of the folder a command makes."""
        return cls(Path(root), tuple(find_releases(root)))

    @classmethod
    def of(cls, releases: Board | Path | str) -> Board:
        """``releases`` as a board: a :class:`Board` as it is, a releases folder read (:meth:`read`)."""
        return releases if isinstance(releases, Board) else cls.read(releases)

    def reopened(self) -> Board:
        """The same releases, each opened again from its own folder (one scored since is read with its new scores; one
        unchanged is the same object, :func:`craftmd.release.read_release`): the folder is not listed again."""
        return Board(self.root, tuple(read_release(r.path) for r in self.releases))

    def __iter__(self):
        return iter(self.releases)

    @staticmethod
    def frame(releases: list[Release] | tuple[Release, ...]) -> pl.DataFrame:
        """One row per release of ``releases``, keyed by ``release`` (its id): ``kind``, ``model`` (the run record's
        ``provider/model``), ``display``, ``notes``, ``counts``, ``source``, ``scorers`` (JSON text), ``task`` and
        ``protocol`` (:meth:`craftmd.release.Protocol.key`). ``tables/releases.csv`` is its first four columns."""
        return pl.DataFrame(
            {
                "release": [r.id for r in releases],
                "kind": [r.manifest.kind for r in releases],
                "model": [r.manifest.model for r in releases],
                "display": [r.display for r in releases],
                "notes": [json.dumps(r.manifest.notes, sort_keys=True, ensure_ascii=False) for r in releases],
                "counts": [json.dumps(r.manifest.counts, sort_keys=True, ensure_ascii=False) for r in releases],
                "source": [json.dumps(r.manifest.source, sort_keys=True, ensure_ascii=False) for r in releases],
                "scorers": [json.dumps(r.scorer_records(), sort_keys=True, ensure_ascii=False) for r in releases],
                "task": [r.manifest.task for r in releases],
                "protocol": [protocol_key(r) for r in releases],  # tables/protocols.csv, never releases.csv
            }
        )


__all__ = ["Board", "protocol_key"]
