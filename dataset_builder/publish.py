"""Publish a built dataset folder to the Hugging Face Hub.

``publish(folder, repo)`` creates the dataset repo (if needed), uploads the folder as
one commit and tags it with the build's version (``v<version>`` unless another
``revision`` is given). ``dry_run`` returns the plan without touching the network.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError

from craftmd import CraftMDError
from craftmd.dataset_builder.build import CARD, MANIFEST


@dataclass
class Plan:
    repo: str
    revision: str
    version: str
    folder: Path
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in repo, bytes)

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.files)

    def describe(self) -> str:
        lines = [
            f"upload plan: {len(self.files)} files, {self.total_bytes:,} bytes",
            f"  to   https://huggingface.co/datasets/{self.repo} (repo_type=dataset)",
            f"  tag  {self.revision} (dataset version {self.version})",
        ]
        lines += [f"  {n:>12,}  {p}" for p, n in self.files]
        return "\n".join(lines)


def plan(folder: Path | str, repo: str, revision: str | None = None) -> Plan:
    """Check the folder is a built dataset and list what would be uploaded."""
    folder = Path(folder)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
        raise CraftMDError(f"--repo {repo!r} is not ORG/NAME")
    manifest_path = folder / MANIFEST
    if not (folder / CARD).is_file() or not manifest_path.is_file():
        raise CraftMDError(f"{folder}: not a built dataset (needs {CARD} and {MANIFEST}; run `craftmd build` first)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        version = str(manifest["version"])
        listed = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CraftMDError(f"{manifest_path}: unreadable build manifest ({exc})") from None
    files = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = p.relative_to(folder).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            if rel != MANIFEST and rel not in listed:
                raise CraftMDError(f"{folder}: {rel} is not in {MANIFEST}; rebuild the folder")
            files.append((rel, p.stat().st_size))
    missing = sorted(set(listed) - {f for f, _ in files})
    if missing:
        raise CraftMDError(f"{folder}: {missing[0]} is listed in {MANIFEST} but missing")
    return Plan(repo=repo, revision=revision or f"v{version}", version=version, folder=folder, files=files)


def publish(
    folder: Path | str, repo: str, *, revision: str | None = None, dry_run: bool = False, token: str | None = None
) -> Plan:
    """Create the dataset repo, upload the folder, tag the version. Returns the plan."""
    p = plan(folder, repo, revision)
    if dry_run:
        return p
    token = token or os.environ.get("HF_TOKEN") or get_token()
    if not token:
        raise CraftMDError("no Hugging Face token: pass --token, set HF_TOKEN or run `hf auth login`")
    api = HfApi(token=token)
    try:
        api.create_repo(repo, repo_type="dataset", exist_ok=True)
        api.upload_folder(
            repo_id=repo,
            repo_type="dataset",
            folder_path=str(p.folder),
            commit_message=f"CRAFT-MD dataset {p.version}",
            ignore_patterns=[".*", "**/.*"],
        )
        api.create_tag(repo, tag=p.revision, repo_type="dataset", tag_message=f"CRAFT-MD dataset {p.version}")
    except HfHubHTTPError as exc:
        raise CraftMDError(f"publishing to {repo} failed: {_first_line(exc)}") from exc
    except Exception as exc:  # the network boundary: offline mode, DNS, connection refused, ...
        raise CraftMDError(f"publishing to {repo} failed (no network?): {_first_line(exc)}") from exc
    return p


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
