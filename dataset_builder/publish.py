"""Publish to the Hugging Face Hub, each as a dataset repo tagged with its version.

Three things can be published (one planner each, one :func:`publish`):

- a built dataset (``craftmd publish DIR``): the folder ``craftmd build`` wrote, tagged ``v<version>``;
- a release (``craftmd publish --release DIR --revision TAG``): its files as they are (so a download is
  itself a release whose checksums verify) and a card whose configs are its tables;
- a whole leaderboard (``craftmd publish --leaderboard OUT --releases DIR --revision TAG``): the page
  folder under ``page/`` (its tables as CSV, its figures) and every release under ``releases/<id>/``
  (conversations, answers, scores, run records), with a card whose configs are the releases' tables
  (``<id>--answers``, ...: one repo's configs share one file format, so the page's CSV tables are files, not configs).

Only regular files that craftmd wrote and listed are published, never what a link points to (:func:`_own_files`): a
built dataset's files its build manifest lists (and names as a build writes them), a release's run record and tables,
a leaderboard page's pages, tables and figures. The NEJM Image Challenge images (© Massachusetts Medical Society, all
rights reserved) stay out of a dataset unless ``include_nejm_images`` asks for them; its card then says why.

Everything local is checked first (the plan; ``dry_run`` stops there, and refuses what an upload would). Then, before anything is
uploaded, the target version: a tag that already exists is refused in one line and nothing is sent.
Then one commit makes the repo's ``main`` exactly the plan (files of an earlier version that are not
in it are deleted), on top of the ``main`` that was checked, and the tag is put on that commit. The key
comes from ``HF_TOKEN`` only and is never written; ``HF_ENDPOINT`` points the client at another hub.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, DatasetCard, DatasetCardData, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from craftmd import CraftMDError
from craftmd.dataset_builder.build import CARD, MANIFEST, REPORT
from craftmd.dataset_builder.schema import CONFIGS, TRAIN_CONFIGS

KINDS = ("dataset", "release", "leaderboard")
SPLIT = "test"
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: Names a tag may not have: the repo's branch, and what the Hub reads as a branch or a commit, not a tag.
_NOT_TAGS = re.compile(r"(?i)main|head|refs|[0-9a-f]{40}")
_CONFIG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: The files of a built dataset (what ``craftmd build`` writes): its card, report, manifest and one parquet per config.
DATASET_FILE = re.compile(
    rf"(?:{re.escape(CARD)}|{re.escape(REPORT)}|{re.escape(MANIFEST)}"
    rf"|(?:{'|'.join(map(re.escape, CONFIGS + TRAIN_CONFIGS))})/[a-z]+-00000-of-00001\.parquet)"
)
#: The files of a release that are published: its run record and its tables (``<table>.parquet``, a table's name plain).
RELEASE_FILE = re.compile(r"manifest\.json|[a-z0-9]+(?:_[a-z0-9]+)*\.parquet")
#: The files of a leaderboard's page: its pages, tables and figures.
PAGE_FILE = re.compile(r"[^/]+(?:/[^/]+)*\.(?:html|md|csv|tsv|json|png|svg)")
#: The most bytes a build manifest may have (a build's is a few kilobytes).
MAX_MANIFEST_BYTES = 1 << 20
#: The config of the NEJM Image Challenge cases, whose images are © Massachusetts Medical Society, all rights reserved.
NEJM_CONFIG = "nejm_image"
NEJM_NOTE = (
    "**Left out of this upload: the `nejm_image` config.** Its images are © Massachusetts Medical Society, all rights "
    "reserved: no licence lets them be redistributed, so `craftmd publish` leaves them out unless "
    "`--include-nejm-images` asks for them (for a private repo, or with the Society's permission). `craftmd build` "
    "makes the config from the pinned source, for local use."
)


@dataclass
class Plan:
    repo: str
    revision: str
    version: str
    folder: Path
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in repo, bytes)
    kind: str = "dataset"
    sources: dict[str, Path | bytes] = field(default_factory=dict)  # path in repo -> the local file, or a made file (the card)
    left_out: dict[str, str] = field(default_factory=dict)  # path -> why it is not published

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
        lines += [f"  left out      {p}: {why}" for p, why in self.left_out.items()]
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
    if _NOT_TAGS.fullmatch(revision):
        raise CraftMDError(f"--revision {revision!r} names a branch or a commit, not a version: give a tag such as v1")
    return revision


def _own_files(folder: Path, allowed: re.Pattern, what: str) -> dict[str, Path]:
    """Every regular file under ``folder`` (path in it -> the file), dot files and folders left out; refused in one line:
    a symbolic link anywhere (what it points to is never published), anything that is not a regular file, a file whose
    name ``allowed`` does not match (``what``: what writes such folders)."""
    out: dict[str, Path] = {}
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            path = Path(root, name)
            rel = path.relative_to(folder).as_posix()
            if name.startswith("."):
                continue
            _regular(path, what)
            if not allowed.fullmatch(rel):
                raise CraftMDError(f"{path} is not a file {what} writes; nothing was published (remove it)")
            out[rel] = path
    return out


def _one_path_each(sources: dict) -> None:
    """Refuse two paths of the repo (or configs) that differ only in case: one would replace the other on a case-blind
    disk. (A release's table names never hold ``--`` (:data:`RELEASE_FILE`), so ``<release>--<table>`` names one config.)"""
    seen: dict[str, str] = {}
    for p in sources:
        other = seen.setdefault(p.casefold(), p)
        if other != p:
            raise CraftMDError(f"{other} and {p} differ only in case; nothing was published (rename one)")


def _with_sources(p: Plan, sources: dict[str, Path | bytes]) -> Plan:
    _one_path_each(sources)
    p.sources = dict(sorted(sources.items()))
    p.files = [(k, len(v) if isinstance(v, bytes) else v.stat().st_size) for k, v in p.sources.items()]
    return p


def plan(folder: Path | str, repo: str, revision: str | None = None, include_nejm_images: bool = False) -> Plan:
    """Check the folder is a built dataset and list what would be uploaded: the files its build manifest lists, the
    NEJM images left out unless ``include_nejm_images`` (and the card saying so)."""
    folder = Path(folder)
    _check_repo(repo)
    manifest_path = folder / MANIFEST
    if not (folder / CARD).is_file() or not manifest_path.is_file():
        raise CraftMDError(f"{folder}: not a built dataset (needs {CARD} and {MANIFEST}; run `craftmd build` first)")
    found = _own_files(folder, DATASET_FILE, "craftmd build")  # no link, nothing irregular: before anything is read
    if manifest_path.stat().st_size > MAX_MANIFEST_BYTES:
        raise CraftMDError(f"{manifest_path}: {manifest_path.stat().st_size:,} bytes is no build manifest; rebuild the folder")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        version = str(manifest["version"])
        listed = manifest["files"]
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError) as exc:
        raise CraftMDError(f"{manifest_path}: unreadable build manifest ({exc})") from None
    if not isinstance(listed, dict):
        raise CraftMDError(f"{manifest_path}: unreadable build manifest (its files are not a table of names)")
    odd = next((n for n in sorted(listed) if not DATASET_FILE.fullmatch(n)), None)
    if odd is not None:
        raise CraftMDError(f"{manifest_path} lists {ascii(odd)[:80]}, which craftmd build does not write; rebuild the folder")
    sources: dict[str, Path | bytes] = {}
    for rel, p in found.items():
        if rel != MANIFEST and rel not in listed:
            raise CraftMDError(f"{folder}: {rel} is not in {MANIFEST}; rebuild the folder")
        sources[rel] = p
    missing = sorted(set(listed) - set(sources))
    if missing:
        raise CraftMDError(f"{folder}: {missing[0]} is listed in {MANIFEST} but missing")
    revision = _check_tag(revision or f"v{version}", "dataset")
    left_out = {}
    if not include_nejm_images and any(k.startswith(f"{NEJM_CONFIG}/") for k in sources):
        why = "© Massachusetts Medical Society, all rights reserved (--include-nejm-images publishes it)"
        left_out = {k: why for k in sources if k.startswith(f"{NEJM_CONFIG}/")}
        sources = {k: v for k, v in sources.items() if k not in left_out}
        sources[CARD] = _without_nejm(sources[CARD].read_text(encoding="utf-8"))
    p = Plan(repo=repo, revision=revision, version=version, folder=folder, left_out=left_out)
    return _with_sources(p, sources)


def _without_nejm(text: str) -> bytes:
    """A dataset card without the ``nejm_image`` config (its YAML entries) and saying why (:data:`NEJM_NOTE`)."""
    card = DatasetCard(text)
    for key in ("configs", "dataset_info"):
        entries = getattr(card.data, key, None)
        if isinstance(entries, list):
            setattr(card.data, key, [e for e in entries if not (isinstance(e, dict) and e.get("config_name") == NEJM_CONFIG)])
    head = f"## `{NEJM_CONFIG}`\n"
    body = card.text.replace(head, f"{head}\n{NEJM_NOTE}\n", 1) if head in card.text else f"{card.text.rstrip()}\n\n{NEJM_NOTE}\n"
    first = body.index("\n\n") if "\n\n" in body else len(body)  # and at the top, below the title
    card.text = f"{body[:first]}\n\n{NEJM_NOTE}{body[first:]}"
    return str(card).encode()


def _release_files(release, prefix: str = "") -> dict[str, Path]:
    """A verified release's files as they are: its run record and every table the record lists, each a regular file
    (:func:`_own_files`); a record listing any other file (``.gitattributes``, ``index.html``) is refused."""
    odd = next((n for n in sorted(release.manifest.files) if not RELEASE_FILE.fullmatch(n)), None)
    if odd is not None:
        raise CraftMDError(
            f"{release.path}: manifest.json lists {ascii(odd)[:80]}, which is not a table of a release; nothing was published"
        )
    names = ["manifest.json"] + sorted(n for n in release.manifest.files if os.path.lexists(release.path / n))
    return {f"{prefix}{n}": _regular(release.path / n, "craftmd") for n in names}


def _regular(path: Path, what: str) -> Path:
    """``path``, refused in one line when it (or its folder) is a symbolic link or it is not a regular file."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode) or path.parent.is_symlink():
        raise CraftMDError(
            f"{path if stat.S_ISLNK(mode) else path.parent} is a symbolic link; nothing was published (publish sends only "
            f"the regular files {what} wrote, never what a link points to: replace the link with the file, or remove it)"
        )
    if not stat.S_ISREG(mode):
        raise CraftMDError(f"{path} is not a regular file; nothing was published (remove it)")
    return path


def _code(text: object) -> str:
    """``text`` (from a run record: a model's name) as one inline code span of a card: on one line, without control
    characters, fenced by more backticks than it holds, so no backtick, HTML or link in it is read as markdown."""
    one = " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", " ", str(text)).split())[:200]
    fence = "`" * (max((len(m) for m in re.findall(r"`+", one)), default=0) + 1)
    pad = " " if one.startswith("`") or one.endswith("`") else ""
    return f"{fence}{pad}{one}{pad}{fence}"


def _configs(tables: dict[str, str]) -> list[dict]:
    return [{"config_name": c, "data_files": [{"split": SPLIT, "path": path}]} for c, path in tables.items()]


def _config_name(*parts: str) -> str:
    name = "--".join(parts)
    if not _CONFIG.fullmatch(name):
        raise CraftMDError(f"{name!r} cannot name a dataset config (letters, digits, '.', '_', '-'); rename the release")
    return name


def _card(
    kind: str, title: str, what: str, tables: dict[str, str], records: list[str], revision: str, datasets: set[str]
) -> bytes:
    """The card of a published release or leaderboard; its licences are those of the cases its tasks ran on (the
    ``datasets`` its releases' tasks pose)."""
    from craftmd.cards.render import render_card
    from craftmd.dataset_builder.schema import PACKETS_SOURCE, SOURCES
    from craftmd.samples import MEDPI

    sources = {**(SOURCES if datasets - {MEDPI.name} else {}), **({MEDPI.name: PACKETS_SOURCE} if MEDPI.name in datasets else {})}

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


#: What a release's scores must be to be published (``craftmd publish`` passes
#: :func:`craftmd.scoring.score.check_standing`, the check ``craftmd analyse`` runs, which this room cannot import): called
#: with the releases read, it raises :class:`~craftmd.CraftMDError` for one whose scores are neither made here nor claims.
StandingCheck = Callable[[list], None]


def plan_release(folder: Path | str, repo: str, revision: str | None, check: StandingCheck | None = None) -> Plan:
    """A release (verified: its run record and every file's sha256; its scores by ``check``) and its card."""
    from craftmd.release import read_release

    _check_repo(repo)
    revision = _check_tag(revision, "release")
    rel = read_release(folder)
    if check is not None:
        check([rel])
    _config_name(rel.id)  # it titles the card: a plain name
    sources: dict[str, Path | bytes] = dict(_release_files(rel))
    tables = {_config_name(Path(n).stem): n for n in sources if n.endswith(".parquet")}
    what = (
        f"Release `{rel.id}` of craftmd: the {_code(rel.manifest.task)} task, model {_code(rel.manifest.model)} "
        f"({_code(rel.manifest.kind)})."
    )
    sources[CARD] = _card("release", f"craftmd release {rel.id}", what, tables, ["manifest.json"], revision, {rel.task.dataset})
    return _with_sources(Plan(repo=repo, revision=revision, version=revision, folder=Path(folder), kind="release"), sources)


def plan_leaderboard(
    folder: Path | str, releases: Path | str | None, repo: str, revision: str | None, check: StandingCheck | None = None
) -> Plan:
    """A leaderboard's page folder under ``page/`` and each of its releases under ``releases/<id>/`` (their scores
    checked by ``check``), and a card."""
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
    if check is not None:
        check(found)
    sources: dict[str, Path | bytes] = {f"page/{k}": v for k, v in _own_files(folder, PAGE_FILE, "craftmd leaderboard").items()}
    tables: dict[str, str] = {}
    for r in found:
        files = _release_files(r, f"releases/{_config_name(r.id)}/")
        sources.update(files)
        tables.update({_config_name(r.id, Path(n).stem): n for n in files if n.endswith(".parquet")})
    _one_path_each(tables)  # configs of two releases (or tables) are never one
    what = (
        f"The craftmd leaderboard: its page (`page/index.html`, `page/leaderboard.md`, tables and figures) and the "
        f"{len(found)} releases it was made from ({', '.join(f'`{r.id}`' for r in found)})."
    )
    records = [f"releases/{r.id}/manifest.json" for r in found]
    sources[CARD] = _card("leaderboard", "craftmd leaderboard", what, tables, records, revision, {r.task.dataset for r in found})
    return _with_sources(Plan(repo=repo, revision=revision, version=revision, folder=folder, kind="leaderboard"), sources)


def publish(
    folder: Path | str,
    repo: str,
    *,
    revision: str | None = None,
    dry_run: bool = False,
    kind: str = "dataset",
    releases: Path | str | None = None,
    include_nejm_images: bool = False,
    check: StandingCheck | None = None,
) -> Plan:
    """Plan (every local check; a release's or a leaderboard's releases' scores by ``check``, :data:`StandingCheck`), then
    check the version on the hub, upload it as one commit and tag it. Returns the plan."""
    if include_nejm_images and kind != "dataset":
        raise CraftMDError("--include-nejm-images goes with a built dataset DIR (a release or a leaderboard holds no images)")
    if kind == "dataset":
        p = plan(folder, repo, revision, include_nejm_images)
    elif kind == "release":
        p = plan_release(folder, repo, revision, check)
    elif kind == "leaderboard":
        p = plan_leaderboard(folder, releases, repo, revision, check)
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
    if refs is not None and any(b.name == p.revision for b in refs.branches):
        raise CraftMDError(f"{p.repo} has a branch {p.revision}; nothing uploaded (a version is a tag: give another name)")
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
