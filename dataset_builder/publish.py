"""Publish to the Hugging Face Hub, each as a dataset repo tagged with its version.

Three things can be published (one planner each, one :func:`publish`):

- a built dataset (``craftmd publish DIR``): the folder ``craftmd build`` wrote, tagged ``v<version>``;
- a release (``craftmd publish --release DIR --revision TAG``): its files as they are (so a download is
  itself a release whose checksums verify) and a card whose configs are its tables;
- a whole leaderboard (``craftmd publish --leaderboard OUT --releases DIR --revision TAG``): the page
  folder under ``page/`` (its tables as CSV, its figures) and every release under ``releases/<id>/``
  (conversations, answers, scores, run records), with a card whose configs are the releases' tables
  (``<id>--answers``, ...: one repo's configs share one file format, so the page's CSV tables are files, not configs).

Everything local is checked first (the plan; ``dry_run`` stops there). Then, before anything is
uploaded, the target version: a tag that already exists is refused in one line and nothing is sent.
Then one commit makes the repo's ``main`` exactly the plan (files of an earlier version that are not
in it are deleted), on top of the ``main`` that was checked, and the tag is put on that commit. The key
comes from ``HF_TOKEN`` only and is never written; ``HF_ENDPOINT`` points the client at another hub.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, DatasetCardData, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from craftmd import CraftMDError
from craftmd.dataset_builder.build import CARD, MANIFEST

KINDS = ("dataset", "release", "leaderboard")
SPLIT = "test"
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_CONFIG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class Plan:
    repo: str
    revision: str
    version: str
    folder: Path
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in repo, bytes)
    kind: str = "dataset"
    sources: dict[str, Path | bytes] = field(default_factory=dict)  # path in repo -> the local file, or a made file (the card)

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.files)

    def describe(self) -> str:
        lines = [
            f"upload plan: {len(self.files)} files, {self.total_bytes:,} bytes ({self.kind} {self.folder})",
            f"  to   {hub_url()}/datasets/{self.repo} (repo_type=dataset)",
            f"  tag  {self.revision} ({self.kind} version {self.version})",
        ]
        lines += [f"  {n:>12,}  {p}" for p, n in self.files]
        return "\n".join(lines)


def hub_url() -> str:
    """The hub the client talks to: ``HF_ENDPOINT``, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _check_repo(repo: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
        raise CraftMDError(f"--repo {repo!r} is not ORG/NAME")


def _check_tag(revision: str | None, what: str) -> str:
    if not revision:
        raise CraftMDError(f"publishing a {what} needs --revision TAG: the version to tag (e.g. v1), checked before any upload")
    if not _TAG.fullmatch(revision) or ".." in revision or revision.endswith((".", ".lock")):
        raise CraftMDError(f"--revision {revision!r} is not a tag name (letters, digits, '.', '_', '-')")
    return revision


def _with_sources(p: Plan, sources: dict[str, Path | bytes]) -> Plan:
    p.sources = dict(sorted(sources.items()))
    p.files = [(k, len(v) if isinstance(v, bytes) else v.stat().st_size) for k, v in p.sources.items()]
    return p


def plan(folder: Path | str, repo: str, revision: str | None = None) -> Plan:
    """Check the folder is a built dataset and list what would be uploaded."""
    folder = Path(folder)
    _check_repo(repo)
    manifest_path = folder / MANIFEST
    if not (folder / CARD).is_file() or not manifest_path.is_file():
        raise CraftMDError(f"{folder}: not a built dataset (needs {CARD} and {MANIFEST}; run `craftmd build` first)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        version = str(manifest["version"])
        listed = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CraftMDError(f"{manifest_path}: unreadable build manifest ({exc})") from None
    sources: dict[str, Path | bytes] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = p.relative_to(folder).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            if rel != MANIFEST and rel not in listed:
                raise CraftMDError(f"{folder}: {rel} is not in {MANIFEST}; rebuild the folder")
            sources[rel] = p
    missing = sorted(set(listed) - set(sources))
    if missing:
        raise CraftMDError(f"{folder}: {missing[0]} is listed in {MANIFEST} but missing")
    revision = _check_tag(revision or f"v{version}", "dataset")
    return _with_sources(Plan(repo=repo, revision=revision, version=version, folder=folder), sources)


def _release_files(release, prefix: str = "") -> dict[str, Path]:
    """A verified release's files as they are: its run record and every file the record lists."""
    names = ["manifest.json"] + sorted(n for n in release.manifest.files if (release.path / n).exists())
    return {f"{prefix}{n}": release.path / n for n in names}


def _configs(tables: dict[str, str]) -> list[dict]:
    return [{"config_name": c, "data_files": [{"split": SPLIT, "path": path}]} for c, path in tables.items()]


def _config_name(*parts: str) -> str:
    name = "--".join(parts)
    if not _CONFIG.fullmatch(name):
        raise CraftMDError(f"{name!r} cannot name a dataset config (letters, digits, '.', '_', '-'); rename the release")
    return name


def _card(kind: str, title: str, what: str, tables: dict[str, str], records: list[str], revision: str, tasks: set[str]) -> bytes:
    """The card of a published release or leaderboard; its licences are those of the cases its tasks ran on."""
    from craftmd.cards.render import render_card
    from craftmd.dataset_builder.schema import PACKETS_SOURCE, SOURCES

    sources = {**(SOURCES if tasks - {"encounters"} else {}), **({"medpi": PACKETS_SOURCE} if "encounters" in tasks else {})}

    data = DatasetCardData(
        license="other",
        license_name="per-source",
        pretty_name=title,
        language=["en"],
        tags=["medical", "clinical-reasoning", "benchmark", "craftmd"],
        configs=_configs(tables),
    )
    context = {
        "kind": kind,
        "title": title,
        "what": what,
        "revision": revision,
        "tables": tables,
        "records": records,
        "sources": sources,
        "first": next(iter(tables), None),
    }
    return render_card("publish_card", context, data).encode()


def plan_release(folder: Path | str, repo: str, revision: str | None) -> Plan:
    """A release (verified: its run record and every file's sha256) and its card."""
    from craftmd.release import read_release

    _check_repo(repo)
    revision = _check_tag(revision, "release")
    rel = read_release(folder)
    sources: dict[str, Path | bytes] = dict(_release_files(rel))
    tables = {_config_name(Path(n).stem): n for n in sources if n.endswith(".parquet")}
    what = f"Release `{rel.id}` of craftmd: the {rel.manifest.task} task, model `{rel.manifest.model}` ({rel.manifest.kind})."
    sources[CARD] = _card("release", f"craftmd release {rel.id}", what, tables, ["manifest.json"], revision, {rel.manifest.task})
    return _with_sources(Plan(repo=repo, revision=revision, version=revision, folder=Path(folder), kind="release"), sources)


def plan_leaderboard(folder: Path | str, releases: Path | str | None, repo: str, revision: str | None) -> Plan:
    """A leaderboard's page folder under ``page/`` and each of its releases under ``releases/<id>/``, and a card."""
    from craftmd.release import find_releases

    folder = Path(folder)
    _check_repo(repo)
    revision = _check_tag(revision, "leaderboard")
    if not (folder / "index.html").is_file() or not (folder / "tables").is_dir():
        raise CraftMDError(f"{folder}: not a leaderboard (needs index.html and tables/; run `craftmd leaderboard --out` first)")
    if releases is None:
        raise CraftMDError("publishing a leaderboard needs --releases DIR: the releases its page was made from")
    found = find_releases(releases)  # each verified
    if not found:
        raise CraftMDError(f"{releases}: no release folders in it")
    sources: dict[str, Path | bytes] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            sources[f"page/{rel}"] = p
    tables: dict[str, str] = {}
    for r in found:
        files = _release_files(r, f"releases/{r.id}/")
        sources.update(files)
        tables.update({_config_name(r.id, Path(n).stem): n for n in files if n.endswith(".parquet")})
    what = (
        f"The craftmd leaderboard: its page (`page/index.html`, `page/leaderboard.md`, tables and figures) and the "
        f"{len(found)} releases it was made from ({', '.join(f'`{r.id}`' for r in found)})."
    )
    records = [f"releases/{r.id}/manifest.json" for r in found]
    sources[CARD] = _card("leaderboard", "craftmd leaderboard", what, tables, records, revision, {r.manifest.task for r in found})
    return _with_sources(Plan(repo=repo, revision=revision, version=revision, folder=folder, kind="leaderboard"), sources)


def publish(
    folder: Path | str,
    repo: str,
    *,
    revision: str | None = None,
    dry_run: bool = False,
    kind: str = "dataset",
    releases: Path | str | None = None,
) -> Plan:
    """Plan (every local check), then check the version on the hub, upload it as one commit and tag it. Returns the plan."""
    if kind == "dataset":
        p = plan(folder, repo, revision)
    elif kind == "release":
        p = plan_release(folder, repo, revision)
    elif kind == "leaderboard":
        p = plan_leaderboard(folder, releases, repo, revision)
    else:
        raise CraftMDError(f"cannot publish a {kind!r}: one of {', '.join(KINDS)}")
    if dry_run:
        return p
    token = os.environ.get("HF_TOKEN")
    if not token:
        raise CraftMDError("no Hugging Face token: set HF_TOKEN to a write token (read from the environment only, never written)")
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        _upload(api, p)
    except CraftMDError:
        raise
    except HfHubHTTPError as exc:
        raise CraftMDError(f"publishing to {repo} failed: {_first_line(exc)}") from exc
    except Exception as exc:  # the network boundary: offline mode, DNS, connection refused, ...
        raise CraftMDError(f"publishing to {repo} failed (no network?): {_first_line(exc)}") from exc
    return p


def _upload(api: HfApi, p: Plan) -> None:
    message = f"craftmd {p.kind} {p.version}"
    try:
        refs = api.list_repo_refs(p.repo, repo_type="dataset")
    except RepositoryNotFoundError:
        refs = None
    if refs is not None and any(t.name == p.revision for t in refs.tags):
        raise CraftMDError(
            f"{p.repo} already has version {p.revision}; nothing uploaded (a published version is never "
            "replaced: publish a new version)"
        )
    head = next((b.target_commit for b in refs.branches if b.name == "main"), None) if refs is not None else None
    if refs is None:
        api.create_repo(p.repo, repo_type="dataset", exist_ok=True)
    old = api.list_repo_files(p.repo, repo_type="dataset", revision=head) if head else []
    ops = [
        CommitOperationAdd(path_in_repo=k, path_or_fileobj=v if isinstance(v, bytes) else str(v)) for k, v in p.sources.items()
    ]
    ops += [CommitOperationDelete(path_in_repo=f) for f in old if f not in p.sources and f != ".gitattributes"]
    commit = api.create_commit(p.repo, ops, commit_message=message, repo_type="dataset", parent_commit=head)
    try:
        api.create_tag(p.repo, tag=p.revision, revision=commit.oid, repo_type="dataset", tag_message=message)
    except HfHubHTTPError as exc:
        raise CraftMDError(
            f"{p.repo}: uploaded as commit {commit.oid} but tagging it {p.revision} failed "
            f"({_first_line(exc)}); tag that commit, or publish a new version"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
