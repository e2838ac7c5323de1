"""The pinned upstream CRAFT-MD source, verified by content.

The pin is ``dataset_builder/pin/<commit>.sha256``: the sha256 of every file of
the upstream release that this package reads, in ``sha256sum`` format with paths
relative to the archive's top folder. A source is accepted in three shapes and
verified file by file, so the archive in ``../shared/sources`` and upstream's own
archive of the same commit (different bytes, same files) both pass, while one
changed byte in any file that is read is refused:

* a ``.tar.gz`` archive (one top folder, as GitHub's archives unpack),
* a folder where such an archive was unpacked,
* an ``http(s)://`` URL of such an archive (downloaded once into the cache).

Every read goes through :class:`Source`; nothing else opens the upstream files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import tarfile
import tempfile
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError

PINNED_COMMIT = "3bb2737d4fae5d64694d38456f878c2c5d35576a"
PIN_DIR = Path(__file__).resolve().parent.parent / "dataset_builder" / "pin"
UPSTREAM_URL = "https://github.com/rajpurkarlab/craft-md/archive/{commit}.tar.gz"
ENV_VAR = "CRAFTMD_SOURCE"


def _pin_path(commit: str, part: str = "") -> Path:
    # Installed (non-editable) copies carry the pin as package data.
    name = f"{commit}.{part}.sha256" if part else f"{commit}.sha256"
    here = PIN_DIR / name
    if here.exists():
        return here
    from importlib import resources

    return Path(str(resources.files("craftmd.dataset_builder") / "pin" / name))


def load_pin(commit: str = PINNED_COMMIT, part: str = "", path: Path | None = None) -> dict[str, str]:
    """Path -> sha256 for every pinned file of ``commit`` (``part="code"``: its code files, pinned apart); ``path``: a pin
    manifest kept elsewhere (a task's folder pins the source it reads), else the one in ``dataset_builder/pin/``."""
    path = Path(path) if path is not None else _pin_path(commit, part)
    if not path.exists():
        raise CraftMDError(f"no pin manifest for commit {commit} at {path}")
    pin: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, _, rel = line.partition("  ")
        if len(digest) != 64 or not rel:
            raise CraftMDError(f"{path}:{n}: malformed pin line")
        pin[rel] = digest
    return pin


def default_location() -> str:
    """``$CRAFTMD_SOURCE``, else the archive in ``../shared/sources``, else the upstream URL."""
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    repo = Path(__file__).resolve().parent.parent
    for base in (repo.parent / "shared" / "sources", Path.cwd().parent / "shared" / "sources"):
        cand = base / f"craft-md-{PINNED_COMMIT}.tar.gz"
        if cand.exists():
            return str(cand)
    return UPSTREAM_URL.format(commit=PINNED_COMMIT)


def code_location(location: str | os.PathLike | None = None, commit: str = PINNED_COMMIT) -> str:
    """Where the code files of ``commit`` are read from, given the data source's ``location`` (default as
    :func:`default_location`): the code archive ``craft-md-code-<commit>.tgz`` beside a data archive or folder when
    there is one, else the location itself (upstream's own archive of the commit holds ``src/`` beside ``data/``)."""
    loc = str(location) if location is not None else default_location()
    if loc.startswith(("http://", "https://")):
        return loc
    path = Path(loc).expanduser()
    if path.is_dir() and ((path / "src").is_dir() or any(path.glob("*/src"))):
        return loc
    beside = path.parent / f"craft-md-code-{commit}.tgz"
    return str(beside) if beside.exists() else loc


def cache_dir() -> Path:
    return Path(os.environ.get("CRAFTMD_CACHE", Path.home() / ".cache" / "craftmd"))


def _download(url: str) -> Path:
    name = url.rstrip("/").rsplit("/", 1)[-1] or "source.tar.gz"
    dest = cache_dir() / "sources" / name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
        os.replace(tmp, dest)
    except OSError as exc:  # URLError is an OSError
        Path(tmp).unlink(missing_ok=True)
        raise CraftMDError(
            f"cannot download source {url}: {exc}; give the pinned archive with --source PATH_OR_URL "
            f"(or ${ENV_VAR}), e.g. a craft-md-{PINNED_COMMIT}.tar.gz downloaded elsewhere"
        ) from None
    return dest


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the release's top folder, e.g. "data/usmle_and_derm_dataset.csv"
    data: bytes


class Source:
    """A verified view of the pinned upstream release.

    ``read_files(patterns)`` streams the source once and returns every pinned file
    matching one of the glob ``patterns``; each is checked against the pin. A
    pinned file that is missing, unreadable or changed raises :class:`CraftMDError`
    naming it.
    """

    def __init__(
        self, location: str | os.PathLike | None = None, commit: str = PINNED_COMMIT, part: str = "", pin: Path | None = None
    ):
        """``pin``: the pin manifest of ``commit`` when it is not in ``dataset_builder/pin/`` (:func:`load_pin`)."""
        self.commit = commit
        self.location = str(location) if location is not None else default_location()
        self.pin = load_pin(commit, part, pin)
        loc = self.location
        if loc.startswith(("http://", "https://")):
            self.path = _download(loc)
        else:
            self.path = Path(loc).expanduser()
        if not self.path.exists():
            raise CraftMDError(f"source not found: {self.path}")

    # -- identity -------------------------------------------------------------
    @property
    def content_sha256(self) -> str:
        """One hash of the pinned content: sha256 over the sorted pin lines."""
        lines = "".join(f"{d}  {p}\n" for p, d in sorted(self.pin.items()))
        return hashlib.sha256(lines.encode()).hexdigest()

    def describe(self) -> dict:
        """What a manifest records about the source (no local absolute paths)."""
        loc = self.location
        shown = loc if loc.startswith(("http://", "https://")) else Path(loc).name
        return {"location": shown, "commit": self.commit, "content_sha256": self.content_sha256}

    # -- reading --------------------------------------------------------------
    def pinned(self, patterns: Iterable[str]) -> list[str]:
        pats = list(patterns)
        return sorted(p for p in self.pin if any(fnmatch.fnmatchcase(p, pat) for pat in pats))

    def iter_files(self, patterns: Iterable[str], progress=None) -> Iterator[SourceFile]:
        """Yield each pinned file matching ``patterns`` (in source order), verified.

        Stops once every wanted file was read; after the stream's end, raises if any wanted file was not found.
        """
        wanted = set(self.pinned(patterns))
        if not wanted:
            raise CraftMDError(f"no pinned file matches {list(patterns)}")
        seen: set[str] = set()
        for rel, data in self._raw(wanted):
            self._verify(rel, data)
            seen.add(rel)
            if progress is not None:
                progress.update(1)
            yield SourceFile(rel, data)
            if seen == wanted:  # the rest of the stream holds nothing wanted
                return
        missing = sorted(wanted - seen)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CraftMDError(f"source {self.location}: missing file {missing[0]}{more}")

    def read_files(self, patterns: Iterable[str], progress=None) -> dict[str, bytes]:
        return {f.path: f.data for f in self.iter_files(patterns, progress)}

    def read(self, path: str) -> bytes:
        if path not in self.pin:
            raise CraftMDError(f"{path} is not a pinned file of commit {self.commit}")
        return self.read_files([path])[path]

    def _verify(self, rel: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != self.pin[rel]:
            raise CraftMDError(f"source {self.location}: {rel} does not match the pinned sha256")

    def _raw(self, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
        if self.path.is_dir():
            root = self._dir_root()
            for rel in sorted(wanted):
                f = root / rel
                if f.is_file():
                    try:
                        yield rel, f.read_bytes()
                    except OSError as exc:
                        raise CraftMDError(f"source {self.location}: cannot read {rel}: {exc}") from None
            return
        try:
            with tarfile.open(self.path, mode="r|*") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                    if rel not in wanted:
                        continue
                    fh = tar.extractfile(member)
                    yield rel, fh.read() if fh else b""
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            msg = str(exc) or type(exc).__name__
            raise CraftMDError(f"source {self.location}: unreadable archive ({msg})") from None

    def _dir_root(self) -> Path:
        # Either the unpacked top folder itself, or a folder holding it (found by the pinned files' first top folder, or,
        # when every pinned file sits at the top, by the first of them).
        dirs = sorted({p.split("/", 1)[0] for p in self.pin if "/" in p})
        top = dirs[0] if dirs else min(self.pin)
        found = (lambda d: (d / top).is_dir()) if dirs else (lambda d: (d / top).is_file())
        if found(self.path):
            return self.path
        subs = [p for p in self.path.iterdir() if p.is_dir() and found(p)]
        if len(subs) == 1:
            return subs[0]
        raise CraftMDError(f"source {self.location}: no release folder of commit {self.commit} ({top}) inside")


def write_pin(unpacked: Path, commit: str, dest: Path) -> int:
    """Write the pin manifest of an unpacked release (maintainers' tool). Returns the file count."""
    lines = []
    for f in sorted(unpacked.rglob("*")):
        if f.is_file():
            rel = f.relative_to(unpacked).as_posix()
            if rel.startswith(("data/", "results/")) or rel in ("LICENSE", "README.md"):
                lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {rel}\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(lines))
    return len(lines)


__all__ = ["Source", "SourceFile", "load_pin", "default_location", "code_location", "PINNED_COMMIT"]
