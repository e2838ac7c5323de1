"""Sharded runs: ``--shard k/K`` runs a stable K-th of the samples; ``craftmd merge`` joins the K shards.

A run too big for one machine is split over K jobs of the scheduler at hand (a Slurm array, a
Kubernetes indexed Job, Ray tasks), each one ``craftmd generate … --shard k/K``, and merged:

- **The rule** (:data:`SHARD_RULE`): a sample belongs to shard ``k`` of ``K`` when the first 8 bytes
  of the SHA-256 of its id (UTF-8), read as a big-endian integer, are ``k - 1`` modulo ``K``. It
  depends on the id alone: not on the selection, the order, the machine or the Python version, so
  every job computes the same split with no coordination. Every trial (and image variant) of a
  sample is in the sample's shard.
- **A shard release** is an ordinary release of its samples whose run record says which shard
  it is (``producer.shard``: ``{"k", "of", "rule"}``); its ``source`` still names the whole
  selection, so the shards of one run agree on it.
- **Merging** (:func:`merge`) checks that the shards are one run (same task, dataset, selection,
  roles and their settings, prompt set and ``K``; each ``k`` exactly once; every row in the shard
  its record names) and writes one release whose data files are byte-identical to the unsharded
  run's (rows sorted by key, the same parquet options). Its run record says ``merged from K
  shards`` (``producer.merged``); its counts are the shards' summed. A missing, repeated or
  foreign shard is refused in one line, and nothing is written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from craftmd import CraftMDError
from craftmd.release import SCORES_FILE, Release, RunRecord, read_release, write_release

SHARD_RULE = "shard k of K holds the samples whose id's SHA-256 (UTF-8), first 8 bytes big-endian, is k-1 modulo K"
#: Run-record fields that must be equal in every shard of one run (``roles`` without where each ran).
SAME = (
    "kind",
    "task",
    "model",
    "display_name",
    "dataset",
    "source",
    "roles",
    "prompt_set",
    "sampling",
    "seed",
    "models",
    "producer",
    "notes",
    "schema_version",
    "package",
)
#: Counts that are the whole run's in every shard (the rest are summed).
WHOLE_RUN_COUNTS = ("cases", "trials")


def valid_shard(k: object, of: object) -> bool:
    """Whether ``(k, of)`` is a shard: whole numbers with 1 ≤ k ≤ K (the one rule, for ``--shard`` and a run record's)."""
    return type(k) is int and type(of) is int and 1 <= k <= of


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` → ``(2, 8)``; one line for anything but ``k/K`` with 1 ≤ k ≤ K."""
    k, slash, n = str(text).strip().partition("/")
    try:
        k_i, n_i = int(k), int(n)
    except ValueError:
        k_i = n_i = 0
    if not slash or not valid_shard(k_i, n_i):
        raise CraftMDError(f"--shard {text!r}: expected k/K with 1 <= k <= K, e.g. --shard 1/4")
    return k_i, n_i


def shard_record(release: Release) -> tuple[int, int] | None:
    """The shard ``(k, K)`` a release's run record names (``producer.shard``), None for a whole run; one line for a
    record that names no valid shard (k and K whole numbers, 1 ≤ k ≤ K)."""
    s = release.manifest.producer.get("shard")
    if s is None:
        return None
    k, of = (s.get("k"), s.get("of")) if isinstance(s, dict) else (None, None)
    if not valid_shard(k, of):
        raise CraftMDError(
            f"{release.path}: its run record's producer.shard {_short(s)} is no shard (expected "
            '{"k": k, "of": K}, whole numbers with 1 <= k <= K)'
        )
    return k, of


def _short(x: object) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:79] + "…"


def shard_of(sample_id: str, of: int) -> int:
    """The shard (1..``of``) sample ``sample_id`` belongs to (:data:`SHARD_RULE`)."""
    return int.from_bytes(hashlib.sha256(sample_id.encode()).digest()[:8], "big") % of + 1


def in_shard(sample_id: str, shard: tuple[int, int] | None) -> bool:
    """Whether ``sample_id`` is in ``shard`` (``(k, K)``; None: the whole run)."""
    return shard is None or shard_of(sample_id, shard[1]) == shard[0]


def mark(manifest: RunRecord, shard: tuple[int, int] | None) -> RunRecord:
    """``manifest`` with the shard it records (unchanged for a whole run)."""
    if shard is not None:
        manifest.producer = {**manifest.producer, "shard": {"k": shard[0], "of": shard[1], "rule": SHARD_RULE}}
    return manifest


def add_shard_argument(parser) -> None:
    """``--shard k/K``, the same option (and help) on every generating subcommand."""
    parser.add_argument(
        "--shard",
        type=_shard_arg,
        metavar="k/K",
        help="run only shard k of K: the samples whose id hashes to k (SHA-256 of the id mod K); "
        "the K shard releases join with `craftmd merge` into the release of the whole run",
    )


def _shard_arg(text: str) -> tuple[int, int]:
    import argparse

    try:
        return parse_shard(text)
    except CraftMDError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--shard {text!r}: ")) from None


# --- merging ------------------------------------------------------------------------------
@dataclass
class MergeReport:
    path: Path
    shards: int
    rows: dict[str, int]  # table -> rows

    def summary(self) -> str:
        return f"merged       {self.shards} shards into {self.path}: " + ", ".join(
            f"{n} {t}" for t, n in sorted(self.rows.items())
        )


def _identity(m: RunRecord, field: str):
    v = getattr(m, field)
    if field == "producer":
        return {k: x for k, x in v.items() if k != "shard"}
    if field == "roles":  # where each role ran may differ between machines; what it was may not
        return {a: {k: x for k, x in r.items() if k != "base_url"} for a, r in v.items()}
    return v


def _sum_counts(many: list[dict], path: str = "counts") -> dict:
    out: dict = {}
    for key in dict.fromkeys(k for c in many for k in c):
        vals = [c[key] for c in many if key in c]
        if all(isinstance(v, dict) for v in vals):
            out[key] = _sum_counts(vals, f"{path}.{key}")
        elif key not in WHOLE_RUN_COUNTS and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            out[key] = sum(vals)
        elif all(v == vals[0] for v in vals):
            out[key] = vals[0]
        else:
            raise CraftMDError(f"the shards disagree on {path}.{key} ({vals[0]!r} vs {next(v for v in vals if v != vals[0])!r})")
    return out


def merge(paths: list[Path | str], out: Path | str, overwrite: bool = False) -> MergeReport:
    """Check that ``paths`` are the K shards of one run and write the whole run's release to ``out``."""
    out = Path(out)
    if not paths:
        raise CraftMDError("no shard releases given")
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    shards: list[tuple[Release, int, int]] = []
    for p in paths:
        r = read_release(p)
        s = shard_record(r)
        if s is None:
            raise CraftMDError(
                f"{p} is not a shard release (its run record has no producer.shard: it was not run with --shard k/K)"
            )
        if (r.path / SCORES_FILE).exists():
            raise CraftMDError(f"{p} has been scored: merge the shards as generated, then score the merged release")
        shards.append((r, *s))
    first, _, of = shards[0]
    for r, k, n in shards[1:]:
        if n != of:
            raise CraftMDError(f"{r.path} is shard {k}/{n}, {first.path} is shard {shards[0][1]}/{of}: not one run's shards")
        for f in SAME:
            if _identity(r.manifest, f) != _identity(first.manifest, f):
                raise CraftMDError(f"{r.path} is not a shard of the same run as {first.path}: their run records' {f} differ")
    seen: dict[int, Path] = {}
    for r, k, _ in shards:
        if k in seen:
            raise CraftMDError(f"shard {k}/{of} given twice ({seen[k]} and {r.path})")
        seen[k] = r.path
    missing = [k for k in range(1, of + 1) if k not in seen]
    if missing:
        raise CraftMDError(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{of}' for k in missing)} missing "
            f"(given {len(shards)} of {of})"
        )
    shards.sort(key=lambda x: x[1])
    names = set(first.manifest.files)
    tables: dict[str, list[pa.Table]] = {}
    for r, k, _ in shards:
        if set(r.manifest.files) != names:
            raise CraftMDError(f"{r.path} has the files {sorted(r.manifest.files)}, {first.path} has {sorted(names)}")
        for name in sorted(names):
            t = r.table(name.removesuffix(".parquet"))
            stray = sorted({c for c in t.column("case_id").unique().to_pylist() if shard_of(c, of) != k})
            if stray:
                raise CraftMDError(f"{r.path}/{name} has rows of {stray[0]}, which is not in shard {k}/{of}")
            tables.setdefault(name.removesuffix(".parquet"), []).append(t)
    merged = RunRecord.from_dict(first.manifest.model_dump(mode="json"))
    merged.release = out.name
    merged.producer = {**_identity(merged, "producer"), "merged": {"shards": of, "rule": SHARD_RULE}}
    merged.notes = {**merged.notes, "shards": f"merged from {of} shards"}
    for agent, role in merged.roles.items():
        where = list(dict.fromkeys(r.manifest.roles.get(agent, {}).get("base_url") for r, _, _ in shards))
        role["base_url"] = where[0] if len(where) == 1 else ",".join(sorted(str(w) for w in where))
    merged.counts = _sum_counts([r.manifest.counts for r, _, _ in shards])
    revisions = {r.manifest.git_revision for r, _, _ in shards}
    merged.git_revision = revisions.pop() if len(revisions) == 1 else None
    merged.files = {}
    data = {name: pa.concat_tables(parts).combine_chunks() for name, parts in tables.items()}
    write_release(out, merged, data, overwrite=overwrite)
    return MergeReport(out, of, {n: t.num_rows for n, t in data.items()})
