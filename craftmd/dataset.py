"""Reading a built CRAFT-MD dataset folder (what ``craftmd build --out DIR`` writes).

The folder is a Hugging Face dataset repo: ``{config}/{split}-00000-of-00001.parquet``
per config plus a ``README.md`` card. ``datasets.load_dataset(DIR, CONFIG)`` reads it;
inside the package we read the parquet directly (same bytes, no arrow cache):
:func:`craftmd.samples.config_file` and :func:`craftmd.samples.load_config`, re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from craftmd.samples import CRAFTMD, config_file, load_config  # noqa: F401  (reading a config lives with the dataset registry)

SPLIT = CRAFTMD.split
CONFIGS = CRAFTMD.config_names
#: The configs of text cases (every sample config but the image cases).
TEXT_CONFIGS = tuple(c for c in CRAFTMD.sample_configs() if c != "nejm_image")


def dataset_fingerprint(dataset_dir: Path | str, configs: tuple[str, ...]) -> str:
    """sha256 over the files of ``configs`` of a built dataset (a missing config counts as ``-``): what a
    scorer records as the dataset it read, so it re-runs when any of them changes."""
    import hashlib

    from craftmd.atomic import sha256_file

    parts = []
    for config in configs:
        f = config_file(dataset_dir, config)
        parts.append(f"{config}:{sha256_file(f) if f.exists() else '-'}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
