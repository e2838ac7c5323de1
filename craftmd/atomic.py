"""Writing and hashing files. Writes are atomic: a folder or a file appears whole at its
destination, or not at all.

Every writer of the package (releases, their scores, the dataset, analysis tables and the
page, submissions' results, MELD runs, review sheets) goes through these helpers, so a failed
or interrupted run never leaves a half-written output and never destroys the previous one:

* :func:`atomic_dir`: a whole output folder, written in a temporary sibling and swapped in;
* :func:`atomic_write_bytes` / :func:`atomic_write_json`: one file, renamed into place (:func:`atomic_write_files`:
  several, all or none);
* :func:`locked`: one writer at a time of a folder whose contents are read, changed and
  written back (a release's scores); a second writer waits and is told who holds it;
* :func:`check_writable`: that an output folder can be written, asked before the work starts.

Reads of what a user hands in go through :func:`open_regular` / :func:`read_regular`: a regular file of a bounded
size, checked on the descriptor before a byte is parsed (a FIFO, ``/dev/zero`` or a folder is one line, never a hang).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from craftmd import CraftMDError

#: How long a writer waits for another's lock before giving up (seconds; $CRAFTMD_LOCK_TIMEOUT).
LOCK_TIMEOUT = 600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_leftovers(out: Path) -> None:
    """Remove the temporary siblings of ``out`` that a killed run (its process gone) left behind."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)-")
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for p in entries:
        m = pattern.match(p.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _occupied(out: Path) -> bool:
    """Whether ``out`` holds something (an empty folder counts as free)."""
    if not out.exists() and not out.is_symlink():
        return False
    return not out.is_dir() or any(out.iterdir())


def _foreign(out: Path, holds: tuple[str, ...]) -> list[str]:
    """The entries of ``out`` that match none of the patterns ``holds`` (what the command writes)."""
    return sorted(p.name for p in out.iterdir() if not any(fnmatch.fnmatchcase(p.name, h) for h in holds))


def _check_target(out: Path, overwrite: bool, owns: tuple[str, ...] | None, holds: tuple[str, ...] | None = None) -> None:
    if not _occupied(out):
        return
    if not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    if owns is None:
        raise CraftMDError(f"{out} exists and this command cannot tell it is its own output; choose another --out")
    if not out.is_dir() or not any((out / n).exists() for n in owns):
        raise CraftMDError(
            f"{out} exists and is not an output of this command (it has none of {', '.join(owns)}); choose another --out"
        )
    foreign = _foreign(out, holds) if holds is not None else []
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CraftMDError(
            f"{out} holds what this command did not write ({shown}); --overwrite replaces only its own output: "
            "choose another --out or move them away"
        )


def _umask() -> int:
    """The process's umask (read without changing it where the system says it, else set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mkdtemp(prefix: str, where: Path) -> Path:
    """A temporary folder with the permissions the umask gives a new folder (``mkdtemp`` makes them 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


@contextmanager
def atomic_dir(
    out: Path | str, *, overwrite: bool = True, owns: tuple[str, ...] | None = None, holds: tuple[str, ...] | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling folder of ``out``; on success it replaces ``out`` whole.

    On any exception the temporary folder is removed and ``out`` is left as it was.
    ``overwrite=False`` refuses an existing (non-empty) ``out``, at the start and again at
    the swap, so two runs into one place never replace each other's output. An existing
    ``out`` is replaced only when it is this command's output: ``owns`` names entries one of
    which it must hold and ``holds`` (patterns) everything it may hold, so a mistyped ``--out``
    (a folder of releases, a folder with notes in it) is never wiped; without ``owns`` an
    existing ``out`` is never replaced. The folder gets the permissions the umask gives.
    Temporary folders of killed runs are removed on the next run.
    """
    out = Path(out)
    _check_target(out, overwrite, owns, holds)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(out)
    tmp = _mkdtemp(f".{out.name}.tmp-{os.getpid()}-", out.parent)
    try:
        yield tmp
        while True:
            _check_target(out, overwrite, owns, holds)
            old = None
            if _occupied(out):
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent)) / "x"
                try:
                    os.replace(out, old)
                except FileNotFoundError:  # another run moved it away first
                    old = None
            try:
                os.rename(tmp, out)  # fails if another run put a non-empty folder there in between
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                    raise
                continue
            finally:
                if old is not None:
                    shutil.rmtree(old.parent, ignore_errors=True)
            break
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_writable(
    out: Path | str, *, overwrite: bool = True, owns: tuple[str, ...] | None = None, holds: tuple[str, ...] | None = None
) -> None:
    """A one-line error now, before any work, if :func:`atomic_dir` (same ``overwrite``, ``owns`` and ``holds``)
    would refuse ``out`` or could not write it: a temporary sibling is made and removed in the
    nearest folder that exists."""
    out = Path(out)
    _check_target(out, overwrite, owns, holds)
    where = out.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=where)).rmdir()
    except OSError as exc:
        raise CraftMDError(f"cannot write {out}: {exc.strerror or exc} (in {where})") from None


def plain_name(name: object) -> bool:
    """Whether ``name`` (read from a file: a release id, a file name a manifest lists) names one entry inside a
    folder: a non-empty string, not ``.`` or ``..``, no separator, no control character."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and len(name) <= 255
        and not any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name)
    )


def inside(folder: Path | str, name: str, what: str = "name") -> Path:
    """``folder / name`` for a ``name`` read from a file, refused in one line unless it stays inside ``folder``."""
    if not plain_name(name):
        raise CraftMDError(
            f"{folder}: the {what} {ascii(name)[:80]} is not a plain name inside its folder (no separators, no '..')"
        )
    return Path(folder) / name


# -- one writer at a time -------------------------------------------------------------------------

_thread_locks: dict[str, threading.RLock] = {}
_held: dict[str, int] = {}
_registry = threading.Lock()


def lock_path(target: Path | str) -> Path:
    """The lock file of ``target``: a hidden sibling, so a folder swapped whole keeps its lock."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


def _holder(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another process"


def _flock(path: Path, target, timeout: float) -> int:
    """The lock file at ``path`` opened and locked (``flock``), waiting up to ``timeout`` seconds for its holder (said once
    on stderr); its descriptor."""
    deadline, told = time.monotonic() + timeout, False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if not told:
                print(f"craftmd: waiting for {target}: being written by {_holder(path)}", file=sys.stderr, flush=True)
                told = True
            if time.monotonic() > deadline:
                raise CraftMDError(
                    f"{target} is being written by {_holder(path)} (waited {timeout:.0f} s); try again when it is done"
                ) from None
            time.sleep(0.05)
            continue
        try:  # the holder before us removes the file as it lets go: ours must still be the one at the path
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def lock_timeout() -> float:
    """:data:`LOCK_TIMEOUT`, or ``$CRAFTMD_LOCK_TIMEOUT`` when set: seconds, a finite number >= 0 (else one line)."""
    raw = os.environ.get("CRAFTMD_LOCK_TIMEOUT")
    if raw is None:
        return LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise CraftMDError(f"CRAFTMD_LOCK_TIMEOUT={ascii(raw)[1:-1][:40]} is not a number of seconds (a finite number >= 0)")
    return value


@contextmanager
def locked(target: Path | str, timeout: float | None = None) -> Iterator[None]:
    """Hold the write lock of ``target`` (a folder): one writer at a time, across threads and processes.

    A second writer waits (saying once on stderr who holds it) up to ``timeout`` seconds
    (default :data:`LOCK_TIMEOUT`, or ``$CRAFTMD_LOCK_TIMEOUT``), then fails with one line naming
    the holder. The lock is the operating system's (``flock`` on a hidden sibling file, removed
    when let go): a killed holder releases it. Re-entrant within a thread.
    """
    path = lock_path(target)
    key = str(path.resolve())
    with _registry:
        rlock = _thread_locks.setdefault(key, threading.RLock())
    if timeout is None:
        timeout = lock_timeout()
    if not rlock.acquire(timeout=timeout):
        raise CraftMDError(f"{target} is locked by another writer in this process (waited {timeout:.0f} s)")
    try:
        if _held.get(key):
            _held[key] += 1
            try:
                yield
            finally:
                _held[key] -= 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _flock(path, target, timeout)
        try:
            me = (
                f"pid {os.getpid()} on {socket.gethostname()} ({' '.join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:200]})\n"
            )
            try:  # who holds it: a courtesy to the next writer, never a reason to fail (a full disk)
                os.ftruncate(fd, 0)
                os.pwrite(fd, me.encode(), 0)
            except OSError:
                pass
            _held[key] = 1
            yield
        finally:
            _held[key] = 0
            Path(path).unlink(missing_ok=True)  # removed while still held, on every path: no lock files left behind
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    finally:
        rlock.release()


# -- files ----------------------------------------------------------------------------------------


def atomic_write_bytes(path: Path | str, data: bytes, *, overwrite: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temporary file renamed into place; with ``overwrite=False`` the file is
    created exclusively (an existing ``path``, or one another run made meanwhile, is one line and is kept)."""
    path = Path(path)
    atomic_write_files({path: data}, overwrite=overwrite)
    return path


def atomic_write_files(files: dict[Path, bytes], *, overwrite: bool = True) -> None:
    """Write several files together: each to a temporary sibling first, then all renamed into place, so a failure
    while writing (a full disk) leaves every one as it was (a rename needs no space). With ``overwrite=False`` each is
    linked into place instead, which fails when the name exists: of two runs writing one new file, one wins."""
    tmps: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            tmps.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, path in tmps:
            if overwrite:
                os.replace(tmp, path)
                continue
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise CraftMDError(f"{path} exists (pass --overwrite to replace it)") from None
            os.unlink(tmp)
    except BaseException:
        for tmp, _ in tmps:
            Path(tmp).unlink(missing_ok=True)
        raise


def json_bytes(obj) -> bytes:
    """``obj`` as stable JSON (sorted keys, 2-space indent, UTF-8, final newline): what :func:`atomic_write_json` writes."""
    import json

    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def atomic_write_json(path: Path | str, obj) -> Path:
    """Write ``obj`` as stable JSON (:func:`json_bytes`)."""
    return atomic_write_bytes(path, json_bytes(obj))


#: The most bytes the package reads from one file it is handed (a release's table or manifest, an inspect log): 4 GiB.
MAX_READ_BYTES = 4 << 30


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return "socket" if stat.S_ISSOCK(mode) else "special file"


@contextmanager
def open_regular(path: Path | str, limit: int = MAX_READ_BYTES) -> Iterator[BinaryIO]:
    """``path`` opened for reading, refused in one line unless it is a regular file of at most ``limit`` bytes: checked
    on the open descriptor (never blocking: a FIFO or ``/dev/zero`` is refused, not read), so nothing is parsed first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CraftMDError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CraftMDError(f"{path}: not a regular file (a {_kind(st.st_mode)}); only a file's bytes are read")
        raise CraftMDError(f"{path}: too large ({st.st_size:,} bytes; at most {limit:,} are read)")
    with os.fdopen(fd, "rb") as f:
        yield f


def read_regular(path: Path | str, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (:func:`open_regular`; a file that grows past
    ``limit`` as it is read is refused too)."""
    with open_regular(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CraftMDError(f"{path}: too large (more than {limit:,} bytes; at most {limit:,} are read)")
    return data


def sha256_file(path: Path | str) -> str:
    """The sha256 of a file's bytes, read in chunks (a regular file only: :func:`open_regular`)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
