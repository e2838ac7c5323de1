"""From releases to tables, and from the pinned source to the leaderboard.

:func:`analyse` reads releases (never writes them) and writes ``OUT/tables/*.csv``;
:func:`leaderboard` runs build -> ingest -> grade -> analyse -> audits -> page.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from craftmd import CraftMDError
from craftmd.atomic import atomic_dir
from craftmd.release import Release, find_releases

from . import runner
from .bootstrap import DEFAULT_B, DEFAULT_SEED
from .stats import bootstrap_tables, metric_table

TABLES = ("accuracy", "pvalues", "answer_status", "mcq_rule_gap", "metrics", "releases")


@dataclass
class Analysis:
    """Everything the page and figures need, as polars frames."""

    accuracy: pl.DataFrame
    pvalues: pl.DataFrame
    answer_status: pl.DataFrame
    mcq_rule_gap: pl.DataFrame
    metrics: pl.DataFrame  # every metric but accuracy's 'correct': mean over cases with 95 % CI (stats.metric_table)
    releases: pl.DataFrame  # release, kind, model, display, notes (JSON text)
    timings: dict = field(default_factory=dict)
    B: int = DEFAULT_B
    seed: int = DEFAULT_SEED


def _releases_frame(releases: list[Release]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "release": [r.id for r in releases],
            "kind": [r.manifest.kind for r in releases],
            "model": [r.manifest.model for r in releases],
            "display": [r.display for r in releases],
            "notes": [json.dumps(r.manifest.notes, sort_keys=True, ensure_ascii=False) for r in releases],
            "counts": [json.dumps(r.manifest.counts, sort_keys=True, ensure_ascii=False) for r in releases],
            "source": [json.dumps(r.manifest.source, sort_keys=True, ensure_ascii=False) for r in releases],
        }
    )


def prepared_connection(releases: list[Release], dataset_dir: Path | str):
    """A DuckDB connection with the inputs registered and the shared models materialised, in order."""
    con = runner.connect(releases, dataset_dir)
    runner.materialize(con, "trial_grades")
    max_trial = con.sql("select max(trial) from trial_grades").fetchall()[0][0]
    if max_trial is not None and not 0 <= max_trial < 63:
        raise CraftMDError(f"trial numbers must be 0..62 for the paired tests (found {max_trial})")
    for name in ("case_scores", "case_membership", "case_groups"):
        runner.materialize(con, name)
    return con


def compute(releases_dir: Path | str, dataset_dir: Path | str, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED) -> Analysis:
    """Run the named queries over the releases and add bootstrap CIs and tests."""
    t0 = time.perf_counter()
    releases = [r for r in find_releases(releases_dir) if r.has("scores")]
    if not releases:
        raise CraftMDError(f"no graded release under {releases_dir}")
    con = prepared_connection(releases, dataset_dir)
    case_groups = pl.from_arrow(runner.run(con, "case_groups"))
    accuracy = pl.from_arrow(runner.run(con, "accuracy"))
    comparisons = pl.from_arrow(runner.run(con, "comparisons"))
    status = pl.from_arrow(runner.run(con, "answer_status"))
    gap = pl.from_arrow(runner.run(con, "mcq_rule_gap"))
    metric_cases = pl.from_arrow(runner.run(con, "metric_case_scores"))
    t1 = time.perf_counter()
    acc, pv = bootstrap_tables(case_groups, accuracy, comparisons, B=B, seed=seed)
    metrics = metric_table(metric_cases, B=B, seed=seed)
    t2 = time.perf_counter()
    return Analysis(acc, pv, status, gap, metrics, _releases_frame(releases), {"sql_s": t1 - t0, "bootstrap_s": t2 - t1}, B, seed)


def write_tables(a: Analysis, out: Path) -> list[Path]:
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TABLES:
        df = getattr(a, name)
        if name == "releases":
            df = df.drop("notes", "counts", "source")
        path = tables / f"{name}.csv"
        df.write_csv(path)
        written.append(path)
    return written


def analyse(releases_dir: Path | str, dataset_dir: Path | str, out_dir: Path | str, *, B: int = DEFAULT_B, seed: int = DEFAULT_SEED, figures: bool = True) -> Analysis:
    """Tables (and figures) of every graded release under ``releases_dir`` into ``out_dir``."""
    out = Path(out_dir)
    a = compute(releases_dir, dataset_dir, B=B, seed=seed)
    write_tables(a, out)
    if figures:
        from .figures import write_figures

        t = time.perf_counter()
        write_figures(a, out / "figures")
        a.timings["figures_s"] = time.perf_counter() - t
    return a


# -- the whole job -----------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[leaderboard] {msg}", file=sys.stderr, flush=True)


def _dataset_current(data: Path, source) -> bool:
    """A built dataset of this source and this builder code whose files still match its build manifest."""
    from craftmd.dataset_builder.build import builder_sha256
    from craftmd.release import sha256_file

    mf = data / "build_manifest.json"
    if not mf.exists():
        return False
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError:
        return False
    if source.content_sha256 not in json.dumps(manifest):
        return False
    if (manifest.get("builder") or {}).get("code_sha256") != builder_sha256():
        return False  # built by other builder code: its schema may differ
    files = manifest.get("files", {})
    if "all/test-00000-of-00001.parquet" not in files:
        return False
    for rel, info in files.items():
        f = data / rel
        if not f.exists() or sha256_file(f) != info.get("sha256"):
            return False
    return True


def read_audits(audits_dir: Path | None) -> list[dict]:
    """Every ``*.json`` audit dict in ``audits_dir`` (sorted by file name)."""
    if audits_dir is None or not Path(audits_dir).is_dir():
        return []
    audits = []
    for f in sorted(Path(audits_dir).glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise CraftMDError(f"{f}: not valid JSON ({exc})") from None
        if not isinstance(d, dict) or not {"id", "title"} <= d.keys():
            raise CraftMDError(f"{f}: an audit needs at least 'id' and 'title'")
        d.setdefault("description", "")
        d.setdefault("tables", [])
        d.setdefault("figures", [])
        d["_dir"] = str(Path(audits_dir).resolve())
        audits.append(d)
    return audits


def builtin_audits(releases: Path, data: Path, source, out: Path) -> list[dict]:
    """The audits this package computes itself (when their room has landed), written to ``out/*.json``."""
    made = []
    try:
        from craftmd.scoring.agreement import grader_agreement_audit
    except ImportError:
        grader_agreement_audit = None
    try:
        from craftmd.scoring.expert import upstream_expert_audit
    except ImportError:
        upstream_expert_audit = None
    if grader_agreement_audit is not None:
        made.append(grader_agreement_audit(releases, data, source))
    if upstream_expert_audit is not None:
        made.append(upstream_expert_audit(source))
    out.mkdir(parents=True, exist_ok=True)
    for a in made:
        (out / f"{a['id']}.json").write_text(json.dumps(a, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return read_audits(out)


def leaderboard(
    *,
    source=None,
    data: Path | str,
    releases: Path | str,
    out: Path | str,
    audits: Path | str | None = None,
    graders: list[str] | None = None,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    progress: bool = True,
) -> Path:
    """build -> ingest -> grade -> analyse -> audits -> page. Returns the page's path."""
    from craftmd.generation.ingest import ingest
    from craftmd.scoring.grade import grade_release

    from craftmd.source import Source

    from .page import write_page

    data, releases, out = Path(data), Path(releases), Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "index.html").exists())):
        raise CraftMDError(f"{out} exists and is not a leaderboard folder; choose another --out")
    t0 = time.perf_counter()
    src = source if isinstance(source, Source) else Source(source)

    if _dataset_current(data, src):
        _say(f"dataset: {data} is current")
    elif data.exists() and (not data.is_dir() or (any(data.iterdir()) and not (data / "build_manifest.json").exists())):
        raise CraftMDError(f"{data} exists and is not a built dataset; choose another --data")
    else:
        from craftmd.dataset_builder.build import build_dataset

        _say(f"dataset: building into {data}")
        build_dataset(src, data, overwrite=True, progress=progress)

    _say(f"ingest: upstream results into {releases}")
    ingest(src, data, releases, progress=progress, skip_existing=True)

    graders = ["offline"] if graders is None else graders
    if not graders:
        _say("grade: no extra grader asked for; using the recorded grades")
    else:
        from craftmd.scoring.grade import stale_graders

        for r in find_releases(releases):
            todo = stale_graders(r.path, data, graders)
            if not todo:
                _say(f"grade: {r.id}: {', '.join(graders)} current")
                continue
            _say(f"grade: {r.id} with {', '.join(todo)}")
            grade_release(r.path, data, todo, progress=progress)

    _say("analyse: accuracy, bootstrap CIs, paired tests")
    with atomic_dir(out) as tmp:
        a = analyse(releases, data, tmp, B=B, seed=seed)
        _say("audits: grader agreement, expert validation" + (f", and {audits}" if audits else ""))
        found = {a["id"]: a for a in builtin_audits(releases, data, src, tmp / "audits")}
        found.update({a["id"]: a for a in read_audits(Path(audits) if audits else None)})
        audit_dicts = [found[k] for k in sorted(found)]
        _say(f"page: {len(audit_dicts)} audit(s)")
        write_page(a, tmp, audit_dicts)
    page = out / "index.html"
    _say(f"done in {time.perf_counter() - t0:.0f} s")
    print(f"leaderboard written: {page.resolve()}")
    return page


__all__ = ["analyse", "compute", "write_tables", "leaderboard", "read_audits", "Analysis"]
