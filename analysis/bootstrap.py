"""Case-resampling bootstrap, vectorised.

The resampling unit is the case: a case's trials stay together, and a group's interval
resamples within the group. For ``n`` cases, one ``B x n`` matrix of resample counts
(how often each position was drawn in each resample) comes from a generator seeded by
``(seed, n)``; every cell and every paired difference with ``n`` cases reuses it, so
position ``i`` of every vector is the same draw. The statistic of a resample is then a
matrix product ``W @ S`` for all the cells at once.

Case scores are fractions ``n_correct / n_trials``; they are scaled by the least common
multiple ``L`` of the trial counts into integers, so the products are exact integer sums
in float32 (bounded by ``n * L < 2**24``): the same inputs give the same bytes on any
machine, whatever BLAS does with the summation order. That is the path of binary and
ordinal metrics. Continuous metrics (a similarity, a coverage) take the float path
(``add(values, exact=False)``): case values are fixed to multiples of 1e-9 and summed as
integers in float64 (exact below 2**53), so they too give the same bytes anywhere.

A :class:`Memo` keeps what a resampling gave (an interval, a p-value), keyed by a digest of exactly what it read (the
case vector, the draw's size, ``B`` and the seed): a later analysis of a board that gained a release reads every
other release's intervals and pairs back instead of resampling them (``craftmd analyse`` keeps it in ``OUT/.cache``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from craftmd import CraftMDError
from craftmd.atomic import atomic_write_bytes

DEFAULT_B = 10_000
DEFAULT_SEED = 20250301
_EXACT = 2**24
_FIXED = 1e9  # the float path's grid: continuous case values are summed as integers of 1e-9
_CHUNK = 2_500  # resamples drawn at a time (bounds memory to ~_CHUNK * n * 8 bytes)


@functools.lru_cache(maxsize=8)
def resample_counts(n: int, B: int = DEFAULT_B, seed: int = DEFAULT_SEED) -> np.ndarray:
    """``B x n`` matrix: how often each of ``n`` cases is drawn in each resample, as one byte a count (uint8; float32
    where a count passes 255, never seen), read-only. The few most recent are kept, so every table of one analysis that
    resamples ``n`` cases reuses one draw: eight, as many as the metrics of one board resample in turn, release after
    release (as bytes: eight draws of 2,000 cases held 0.6 GB as float32; :func:`_times_counts` converts a few thousand
    resamples at a time).

    A draw is kept on disk too (``$CRAFTMD_CACHE/resamples/``, one byte a count, about 20 MB for 2,000 cases), so a
    later analysis reads it back instead of drawing it again (about 0.1 s instead of 1.3 s for the upstream groups);
    a missing, unreadable or mis-shaped file is drawn again, a cache that cannot be written only costs the time."""
    if n < 1:
        raise CraftMDError("cannot bootstrap an empty group")
    path = _draws_dir() / f"counts-v1-seed{seed}-B{B}-n{n}.npy"
    try:
        kept = np.load(path, allow_pickle=False) if path.is_file() else None
    except (OSError, ValueError, EOFError):
        kept = None
    if kept is not None and kept.shape == (B, n) and kept.dtype == np.uint8:
        out = kept
    else:
        out = _draw(n, B, seed)
        if out.max(initial=0) < 256:  # (a count above 255 in n draws of n: never seen; then it is not kept)
            out = out.astype(np.uint8)
            buf = io.BytesIO()
            np.save(buf, out, allow_pickle=False)
            try:
                atomic_write_bytes(path, buf.getvalue())
            except OSError:
                pass
    out.flags.writeable = False
    return out


def _times_counts(S: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``S @ W.T`` (k x B) in ``S``'s type (float32 or float64), ``W`` (:func:`resample_counts`) converted a few
    thousand resamples at a time into one buffer: the same exact sums as converting it whole, without a float copy of
    every draw."""
    out = np.empty((S.shape[0], W.shape[0]), S.dtype)
    buf = np.empty((min(_CHUNK, W.shape[0]), W.shape[1]), S.dtype)
    for start in range(0, W.shape[0], _CHUNK):
        w = buf[: min(_CHUNK, W.shape[0] - start)]
        np.copyto(w, W[start : start + len(w)])
        out[:, start : start + len(w)] = S @ w.T
    return out


@contextlib.contextmanager
def blas_threads(n: int):
    """NumPy's BLAS held to ``n`` threads inside the block, as it was after (:func:`threadpoolctl.threadpool_limits`).
    The resamples' products are many and small: one thread does them about as fast as two, and spinning a second one
    on a core that draws figures (or that another process holds) costs several times that. The sums are exact
    integers, the same whatever the threads."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(n), user_api="blas"):
        yield


def _draws_dir() -> Path:
    from craftmd.source import cache_dir

    return cache_dir() / "resamples"


def _draw(n: int, B: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n])
    out = np.empty((B, n), dtype=np.float32)
    for start in range(0, B, _CHUNK):
        b = min(_CHUNK, B - start)
        idx = rng.integers(0, n, size=(b, n))
        idx += np.arange(b)[:, None] * n
        out[start : start + b] = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)
    return out


def scale(n_trials: np.ndarray) -> int:
    """The least common multiple of the trial counts (scores become integers when multiplied by it)."""
    u = np.unique(np.asarray(n_trials, dtype=np.int64))
    if (u < 1).any():
        raise CraftMDError("a case with no trials cannot be scored")
    return math.lcm(*u.tolist())


#: Columns of resampled sums turned into float64 at a time for their quantiles (:meth:`Resampler.quantiles`).
_ROWS = 256


@dataclass
class Resampler:
    """Collects vectors of case scores (integers, see :func:`scale`), then resamples them all.

    ``add(numerators)`` registers a column and returns its handle; ``run()`` computes, per
    column, the ``B`` resampled sums (exact integers).
    """

    B: int = DEFAULT_B
    seed: int = DEFAULT_SEED
    _cols: dict[tuple[int, bool], list[np.ndarray]] = field(default_factory=dict)
    _handles: list[tuple[tuple[int, bool], int]] = field(default_factory=list)
    sums: dict[tuple[int, bool], np.ndarray] = field(default_factory=dict)
    _q: dict[tuple, np.ndarray] = field(default_factory=dict)

    def add(self, numerators: np.ndarray, exact: bool = True) -> int:
        """Register a column of case scores: integers (``exact``), or any floats (the float path)."""
        v = np.asarray(numerators)
        n = len(v)
        if n == 0:
            raise CraftMDError("cannot bootstrap an empty group")
        if exact and int(np.abs(v).max(initial=0)) * n >= _EXACT:  # (as a Python int: no overflow of a narrow vector)
            raise CraftMDError("case scores too fine-grained for the exact bootstrap")
        if not exact and np.abs(v).max(initial=0) * _FIXED * n >= 2**53:
            raise CraftMDError("case values too large for the float path's exact sums")
        lst = self._cols.setdefault((n, exact), [])
        lst.append(v.astype(np.float32 if exact else np.float64))
        self._handles.append(((n, exact), len(lst) - 1))
        return len(self._handles) - 1

    def run(self) -> None:
        # each column's B sums as a row (k x B: a column's sums lie together, for its quantiles and its paired tests)
        for n in sorted({n for n, _ in self._cols}):
            W = resample_counts(n, self.B, self.seed)
            if (n, True) in self._cols:  # exact integers in float32, whatever the order of the sum (kept so: half the bytes)
                self.sums[(n, True)] = _times_counts(np.stack(self._cols[(n, True)]), W)
            if (n, False) in self._cols:  # fixed-point integers: exact sums in float64, whatever the order
                S = np.rint(np.stack(self._cols[(n, False)]) * _FIXED)
                self.sums[(n, False)] = _times_counts(S, W) / _FIXED
            del W

    def resampled(self, handle: int) -> np.ndarray:
        """The ``B`` resampled sums of the column as float64 (exact integers, kept as float32: a copy; or floats)."""
        key, j = self._handles[handle]
        return self.sums[key][j].astype(np.float64, copy=False)

    def quantiles(self, handle: int, level: float = 0.95) -> tuple[float, float]:
        """Percentile interval of the column's resampled sums (computed for all columns of its kind and ``n`` at once)."""
        key, j = self._handles[handle]
        qkey = (key, level)
        if qkey not in self._q:
            a, S = (1 - level) / 2, self.sums[key]
            q = np.empty((2, len(S)))
            # a few columns at a time (each column's quantiles its own): the exact path's sums as the integers they are
            # (np.quantile partitions int32 faster than float64 and interpolates its order statistics in float64 alike:
            # the same bits), the float path's as float64
            as_type = np.int32 if key[1] else np.float64
            for i in range(0, len(S), _ROWS):
                q[:, i : i + _ROWS] = np.quantile(S[i : i + _ROWS].astype(as_type), [a, 1 - a], axis=1)
            self._q[qkey] = q
        q = self._q[qkey]
        return float(q[0, j]), float(q[1, j])

    def n(self, handle: int) -> int:
        return self._handles[handle][0][0]


def paired_p(sums: np.ndarray, observed: float) -> float:
    """Two-sided bootstrap p-value of a paired difference: ``(#{|d* - d| >= |d|} + 1) / (B + 1)``.

    ``sums`` are the resampled sums of the per-case differences, ``observed`` their sum on
    the original cases (same units, exact integers)."""
    extreme = int(np.count_nonzero(np.abs(sums - observed) >= abs(observed)))
    return (extreme + 1) / (len(sums) + 1)


#: Part of every memo key: a change to how resamples are drawn or read makes every kept result a stranger.
ALGORITHM = "case-bootstrap/v1: counts from default_rng([seed, n]) in chunks of 2,500; percentile 95 %; (k+1)/(B+1)"


@functools.lru_cache(maxsize=8)
def _key_prefix(B: int, seed: int):
    """The hash state of every memo key's first parts: :data:`ALGORITHM`, ``B`` and the seed (copied for each key)."""
    return hashlib.blake2b(f"{ALGORITHM}\0{B}\0{seed}\0".encode(), digest_size=16)


def _narrow(a: np.ndarray) -> np.ndarray:
    """An integer vector in the narrowest integer type that holds its values (the same values, the same bytes: hashing
    a case vector of small counts reads an eighth of its int64 bytes); other arrays as they are."""
    if a.dtype.kind not in "iu" or a.size == 0:
        return a
    lo, hi = int(a.min()), int(a.max())
    for t, tlo, thi in _NARROW:
        if tlo <= lo and hi <= thi:
            return a.astype(t)
    return a


_NARROW = [(t, int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in (np.int8, np.int16, np.int32)]


class Memo:
    """Results of resampling (tuples of up to three floats, None allowed), keyed by what they read.

    :meth:`key` digests the resampling's ``B`` and seed and its parts (arrays by dtype, shape and bytes; the rest by
    ``repr``) with :data:`ALGORITHM`; a result found under its key is the one a fresh resampling would give, to the bit, since the
    resampling is a function of exactly those. :meth:`save` writes only the entries this analysis used (read back or
    computed), so a release gone from the board takes its entries with it. A ``Memo()`` without a file starts empty.

    Held as rows of arrays: a dict from each key to its row, the rows' numbers (three a row), their length and which
    are None, whether this analysis used them, and the row of the key their result is also kept under (the 1.25 million
    entries of a board of 1,000 held 0.3 GB as dicts of tuples). A number comes back as a float (an ``int`` put in it
    too, as it does from the file)."""

    _NO_RESULT = 0xFF  # a row's shape when only its key is known (the alias of another row)

    def __init__(self):
        self._row: dict[bytes, int] = {}
        self._keys: list[bytes] = []
        self._values = array("d")  # three a row
        self._shape = bytearray()  # a row's length (bits 0-1) and which of its numbers are None (bits 2-4)
        self._alias = array("q")  # the row of the key the same result is kept under by its inputs' bytes, or -1
        self._used = bytearray()
        self._old = 0  # the rows read back come first

    @staticmethod
    def key(B: int, seed: int, *parts) -> bytes:
        return Memo.begun(B, seed, *parts).digest()

    @staticmethod
    def begun(B: int, seed: int, *parts):
        """The hash state of a key whose first parts are ``parts``: :meth:`then` finishes it (many keys that begin
        alike digest their common parts once)."""
        h = _key_prefix(int(B), int(seed)).copy()
        for part in parts:
            if isinstance(part, np.ndarray):
                a = np.ascontiguousarray(_narrow(part))
                h.update(f"{a.dtype.str}{a.shape}\0".encode())
                h.update(a.data)
            else:
                h.update(Memo.encoded(part))
        return h

    @staticmethod
    def encoded(part) -> bytes:
        """A part of a key that is not an array, as :meth:`key` digests it (its ``repr``)."""
        return f"{part!r}\0".encode()

    @staticmethod
    def then(begun, *parts) -> bytes:
        """The key of ``begun``'s parts (:meth:`begun`) followed by ``parts``, which are not arrays: the bytes
        :meth:`key` gives for all of them."""
        return Memo.then_encoded(begun, b"".join(map(Memo.encoded, parts)))

    @staticmethod
    def then_encoded(begun, encoded: bytes) -> bytes:
        """:meth:`then` of parts already :meth:`encoded` and joined (a caller that finishes many keys with parts that
        repeat encodes each part once)."""
        h = begun.copy()
        h.update(encoded)
        return h.digest()

    def _at(self, key: bytes) -> int:
        """``key``'s row, a new one (without a result) when it has none."""
        row = self._row.get(key)
        if row is None:
            row = self._row[key] = len(self._keys)
            self._keys.append(key)
            self._values.extend((0.0, 0.0, 0.0))
            self._shape.append(self._NO_RESULT)
            self._alias.append(-1)
            self._used.append(0)
        return row

    def _use(self, row: int) -> tuple | None:
        """Row ``row``'s result, the row marked used; None when it has none."""
        shape = self._shape[row]
        if shape == self._NO_RESULT:
            return None
        self._used[row] = 1
        at = 3 * row
        if shape < 4:  # no None among them
            return tuple(self._values[at : at + shape])
        return tuple(None if shape >> (2 + i) & 1 else self._values[at + i] for i in range(shape & 3))

    def get(self, key: bytes) -> tuple | None:
        row = self._row.get(key)
        return None if row is None else self._use(row)

    def get_via(self, key: bytes) -> tuple | None:
        """:meth:`get`, and the key it was put with as an ``alias`` is used too (read back, with its own result): a
        result found by a key that names its inputs (a kept file's digest) keeps, for the next analysis, the key of
        its inputs' bytes, so this analysis keeps the entries a full one does."""
        row = self._row.get(key)
        if row is None:
            return None
        found = self._use(row)
        if found is not None and (alias := self._alias[row]) >= 0:
            self._use(alias)
        return found

    def counts(self) -> dict[str, int]:
        """How many distinct results this analysis read back from the earlier one, and how many it resampled."""
        used = np.frombuffer(self._used, np.uint8)
        old = int(np.count_nonzero(used[: self._old]))
        return {"read_back": old, "resampled": int(np.count_nonzero(used)) - old}

    def put(self, key: bytes, values: tuple, alias: bytes | None = None) -> None:
        values = tuple(values)
        if len(values) > 3:
            raise ValueError(f"a memo entry holds up to three numbers, not {len(values)}")
        row = self._at(key)
        shape, at = len(values), 3 * row
        for i, v in enumerate(values):
            if v is None:
                shape |= 4 << i
            else:
                self._values[at + i] = v
        self._shape[row] = shape
        self._used[row] = 1
        if alias is not None:
            self._alias[row] = self._at(alias)

    @classmethod
    def load(cls, path: Path | str | None) -> "Memo":
        """The memo kept at ``path`` (an empty one when there is none, or when it cannot be read: it only saves work)."""
        memo = cls()
        if path is None or not Path(path).is_file():
            return memo
        try:
            t = pq.read_table(path)
            keys = t.column("key").to_pylist()
            columns = [t.column(c) for c in ("a", "b", "c")]
            if len(set(keys)) != len(keys) or not all(isinstance(k, bytes) for k in keys):
                return memo
            values = np.column_stack([c.to_numpy(zero_copy_only=False).astype(np.float64) for c in columns])
            nulls = sum(c.is_null().to_numpy(zero_copy_only=False).astype(np.uint8) << (2 + i) for i, c in enumerate(columns))
            found = t.column("alias").to_pylist() if "alias" in t.column_names else []  # (none in a memo kept before)
        except (pa.ArrowException, KeyError, OSError, TypeError, ValueError):
            return memo
        memo._keys, memo._row = keys, dict(zip(keys, range(len(keys))))
        memo._values = array("d", values.tobytes()) if len(keys) else array("d")
        memo._shape = bytearray((3 | np.asarray(nulls, np.uint8)).tobytes()) if len(keys) else bytearray()
        memo._alias, memo._used, memo._old = array("q", [-1]) * len(keys), bytearray(len(keys)), len(keys)
        for row, alias in enumerate(found):
            if alias is not None:
                memo._alias[row] = memo._at(alias)
        return memo

    def save(self, path: Path | str) -> None:
        """The entries this analysis used, sorted by key (the same analysis writes the same bytes)."""
        keys = sorted(k for k, row in self._row.items() if self._used[row])
        rows = np.fromiter(map(self._row.__getitem__, keys), np.int64, len(keys))
        values = np.frombuffer(self._values, np.float64).reshape(-1, 3)[rows]
        shape = np.frombuffer(self._shape, np.uint8)[rows]
        absent = [(i >= (shape & 3)) | ((shape >> (2 + i)) & 1).astype(bool) for i in range(3)]  # past its length, or None
        aliases = np.frombuffer(self._alias, np.int64)[rows].tolist()
        table = pa.table(
            {
                "key": pa.array(keys, pa.binary(16)),
                **{c: pa.array(values[:, i], pa.float64(), mask=absent[i]) for i, c in enumerate(("a", "b", "c"))},
                "alias": pa.array([self._keys[a] if a >= 0 else None for a in aliases], pa.binary(16)),
            }
        )
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)


__all__ = ["Resampler", "Memo", "resample_counts", "scale", "paired_p", "DEFAULT_B", "DEFAULT_SEED"]
