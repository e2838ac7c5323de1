"""The dataset's ``keyinfo`` config, read by every room: its schema, its record and its loader.

The config is made by a model (:mod:`craftmd.generation.keyinfo`, ``craftmd keyinfo extract``); the
consultation protocol (:mod:`craftmd.tasks.consultation.protocol`) and the ``keyinfo`` scorer
(:mod:`craftmd.scoring.keyinfo`) read its ``ok`` rows through :func:`load_keyinfo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError

CONFIG = "keyinfo"
ITEM = pa.struct([("key", pa.string()), ("value", pa.string())])
SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("items", pa.list_(ITEM)),  # empty when status != ok
    ("initial_request", pa.string()),  # null when status != ok
    ("status", pa.string()),  # ok | invalid (the reply did not validate) | refusal | error (the call failed)
    ("error", pa.string()),  # why, when status != ok
    ("model", pa.string()),  # provider/model that extracted it
    ("prompt_sha256", pa.string()),  # the prompt set's sha256
])  # fmt: skip


@dataclass(frozen=True)
class KeyInfo:
    """One case's extracted information."""

    case_id: str
    items: tuple[tuple[str, str], ...]
    initial_request: str

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.items]

    @property
    def values(self) -> list[str]:
        return [v for _, v in self.items]


def load_keyinfo(dataset_dir: Path | str) -> dict[str, KeyInfo]:
    """The ``ok`` rows of the ``keyinfo`` config by case id; a missing config is one line saying how to make it."""
    from craftmd.dataset import config_file

    path = config_file(dataset_dir, CONFIG)
    if not path.exists():
        raise CraftMDError(
            f"{dataset_dir}: no keyinfo config ({path}); run `craftmd keyinfo extract --dataset {dataset_dir} --model PROVIDER/MODEL` first"
        )
    out = {}
    for r in pq.read_table(path).to_pylist():
        if r["status"] == "ok":
            out[r["case_id"]] = KeyInfo(r["case_id"], tuple((i["key"], i["value"]) for i in r["items"]), r["initial_request"])
    return out


__all__ = ["CONFIG", "SCHEMA", "KeyInfo", "load_keyinfo"]
