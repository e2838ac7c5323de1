"""Atomic facts from MediQ, matched to CRAFT-MD's text cases: the ``facts`` config.

MediQ (Li et al., NeurIPS 2024; CC BY 4.0) broke MedQA and CRAFT-MD vignettes into numbered atomic facts. Its data
are pinned like the CRAFT-MD source (``dataset_builder/pin/<MEDIQ_COMMIT>.sha256``; found at ``$CRAFTMD_MEDIQ``, else
``../shared/sources``). There is no shared id: a line matches a case by its normalised text's first 150 characters
(:data:`MATCH_DOC`, :func:`match`); a looser match (word Jaccard ≥ 0.8) would add 7 Derm-Private lines that MediQ
edited in a clinical detail (site, sex, ethnicity), so it is not used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError
from craftmd.jsonl import json_lines
from craftmd.release import natural_key
from craftmd.text import normalise  # noqa: F401  (shared with the decontamination; MQ.normalise)

MEDIQ_COMMIT = "faa2ce62fef0423e35af4c31d7537aad973173eb"
ENV_VAR = "CRAFTMD_MEDIQ"
#: MediQ's data files with their facts, in the order they are read.
FILES = ("data/all_craft_md.jsonl", "data/all_dev_good.jsonl")
PREFIX = 150
MATCH_RULE = "prefix150"
MATCH_DOC = (
    "a MediQ line matches a CRAFT-MD case when its `context` sentences joined with spaces and the case's `vignette`, "
    "each lower-cased with punctuation dropped and whitespace runs made one space, agree on their first 150 characters "
    "(an empty text matches nothing; where two lines match one case, the one whose whole text equals the case's wins, "
    "else the lower MediQ id)"
)
ATTRIBUTION = (
    'Li, S. S., Balachandran, V., Feng, S., Ilgen, J. S., Pierson, E., Koh, P. W., Tsvetkov, Y. "MediQ: Question-Asking '
    'LLMs and a Benchmark for Reliable Interactive Clinical Reasoning." NeurIPS 2024 (arXiv 2406.00922), '
    "github.com/stellalisy/mediQ, licensed CC BY 4.0"
)
_NUMBER = re.compile(r"^\s*\d+\s*[.)]\s*")


def default_location() -> Path:
    """``$CRAFTMD_MEDIQ``, else the archive in ``../shared/sources`` (beside the checkout, or beside the cwd)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parent.parent
    name = f"mediq-{MEDIQ_COMMIT}.tar.gz"
    for base in (repo.parent / "shared" / "sources", Path.cwd().parent / "shared" / "sources"):
        if (base / name).exists():
            return base / name
    return repo.parent / "shared" / "sources" / name


def open_mediq(location: str | os.PathLike | None = None):
    """The pinned MediQ data as a verified :class:`craftmd.source.Source`; a missing archive is one clear line."""
    from craftmd.source import Source

    path = Path(location).expanduser() if location is not None else default_location()
    if not path.exists():
        raise CraftMDError(
            f"MediQ archive not found at {path} (the facts config needs it: set ${ENV_VAR} to "
            f"mediq-{MEDIQ_COMMIT}.tar.gz, pinned in ../shared/sources)"
        )
    return Source(path, commit=MEDIQ_COMMIT)


@dataclass(frozen=True)
class Item:
    """One MediQ line: where it is, its text, its facts (numbering stripped)."""

    mediq_id: int
    mediq_file: str
    context: str
    facts: tuple[str, ...]


def strip_number(fact: str) -> str:
    """``"5. The man denied having a fever."`` -> ``"The man denied having a fever."``."""
    return _NUMBER.sub("", fact, count=1).strip()


def parse_lines(path: str, data: bytes, make) -> list:
    """Each non-blank line of a MediQ JSONL file made into an item by ``make(record)``; a malformed line is one error
    naming file and line."""
    out = []
    for n, rec in json_lines(data, f"MediQ {path}"):
        try:
            out.append(make(rec))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CraftMDError(f"MediQ {path}:{n}: unreadable line ({type(exc).__name__}: {exc})") from None
    return out


def context_text(rec: dict) -> str:
    """A MediQ line's ``context`` as one text (its sentences joined)."""
    context = rec["context"]
    return " ".join(context) if isinstance(context, list) else str(context)


def parse(path: str, data: bytes) -> list[Item]:
    """The lines of one MediQ JSONL file; a malformed line is one error naming file and line."""
    return parse_lines(
        path, data, lambda rec: Item(int(rec["id"]), path, context_text(rec), tuple(strip_number(f) for f in rec["facts"]))
    )


def read_items(source) -> list[Item]:
    """Every MediQ line of :data:`FILES`, verified against the pin, in file then line order."""
    files = source.read_files(FILES)
    return [it for f in FILES for it in parse(f, files[f])]


def match(items: list[Item], vignettes: dict[str, str]) -> tuple[list[dict], dict]:
    """Rows of the ``facts`` config (one per matched case, natural id order) and the match counts per MediQ file."""
    index: dict[str, list[str]] = {}
    full = {}
    for cid, v in vignettes.items():
        norm = normalise(v or "")
        full[cid] = norm
        if norm:
            index.setdefault(norm[:PREFIX], []).append(cid)
    chosen: dict[str, Item] = {}
    counts = {f: {"lines": 0, "matched": 0} for f in FILES}
    for it in items:
        counts.setdefault(it.mediq_file, {"lines": 0, "matched": 0})["lines"] += 1
        norm = normalise(it.context)
        hits = index.get(norm[:PREFIX], []) if norm else []
        if len(hits) != 1:
            continue  # no case, or a prefix several cases share: no unambiguous match
        cid = hits[0]
        old = chosen.get(cid)
        if old is None or ((norm == full[cid]) and normalise(old.context) != full[cid]):
            chosen[cid] = it
    for it in chosen.values():
        counts[it.mediq_file]["matched"] += 1
    rows = [
        {"case_id": cid, "facts": list(it.facts), "mediq_id": it.mediq_id, "mediq_file": it.mediq_file, "match_rule": MATCH_RULE}
        for cid, it in sorted(chosen.items(), key=lambda kv: natural_key(kv[0]))
    ]
    return rows, counts


__all__ = [
    "MEDIQ_COMMIT",
    "FILES",
    "MATCH_RULE",
    "MATCH_DOC",
    "ATTRIBUTION",
    "Item",
    "open_mediq",
    "default_location",
    "read_items",
    "match",
    "normalise",
    "strip_number",
]
