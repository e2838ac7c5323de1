"""Reading a built CRAFT-MD dataset folder (what ``craftmd build --out DIR`` writes).

The folder is a Hugging Face dataset repo: ``{config}/{split}-00000-of-00001.parquet``
per config plus a ``README.md`` card. ``datasets.load_dataset(DIR, CONFIG)`` reads it;
inside the package we read the parquet directly (same bytes, no arrow cache):
:func:`craftmd.samples.config_file` and :func:`craftmd.samples.load_config`, re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from craftmd import CraftMDError
from craftmd.samples import CRAFTMD, config_file, load_config  # noqa: F401  (reading a config lives with the dataset registry)

SPLIT = CRAFTMD.split
CONFIGS = CRAFTMD.config_names
#: The configs of text cases (every sample config but the image cases).
TEXT_CONFIGS = tuple(c for c in CRAFTMD.sample_configs() if c != "nejm_image")


def case_texts(dataset_dir: Path | str, configs: tuple[str, ...], column: str = "vignette") -> dict[str, str] | None:
    """The texts (``column``) of the cases of ``configs`` of a built dataset by case id, the configs in order (those the
    folder holds: a task poses no case of a config that is not there), a case whose id an earlier config has as
    ``<config>/<id>``: what a task gives as its test cases (:attr:`craftmd.tasks.Task.cases`). None when the folder holds
    none of the configs with ``case_id`` and ``column``; one line naming the file when one cannot be read."""
    import polars as pl

    out: dict[str, str] | None = None
    for config in configs:
        path = config_file(dataset_dir, config)
        if not path.exists():
            continue
        try:
            if not {"case_id", column} <= set(pl.read_parquet_schema(path)):
                continue  # a folder of other data under the config's name (a constructed one): not its cases
            df = pl.read_parquet(path, columns=["case_id", column])
        except (pl.exceptions.PolarsError, OSError) as exc:  # unreadable: one line naming it
            raise CraftMDError(f"{path}: cannot read its case_id and {column} ({type(exc).__name__})") from None
        out = {} if out is None else out
        out.update(((c if c not in out else f"{config}/{c}"), v or "") for c, v in zip(df["case_id"], df[column]))
    return out


def dataset_fingerprint(dataset_dir: Path | str, configs: tuple[str, ...]) -> str:
    """sha256 over the files of ``configs`` of a built dataset (a missing config counts as ``-``): what a
    scorer records as the dataset it read, so it re-runs when any of them changes."""
    import hashlib

    parts = []
    for config in configs:
        f = config_file(dataset_dir, config)
        parts.append(f"{config}:{file_sha256(f) if f.exists() else '-'}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


#: path -> (its inode, size and times, its sha256): a dataset file is hashed once while it is unchanged on disk.
_HASHED: dict[str, tuple[tuple, str]] = {}


def file_sha256(path: Path) -> str:
    """The sha256 of a dataset file, hashed once a process while the file is unchanged (same inode, size and times)."""
    import os

    from craftmd.atomic import sha256_file

    st = os.stat(path)
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    held = _HASHED.get(str(path))
    if held is None or held[0] != key:
        held = _HASHED[str(path)] = (key, sha256_file(path))
    return held[1]
