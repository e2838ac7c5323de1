"""The main job, ``craftmd leaderboard``: pinned source -> dataset -> releases -> scores -> tables -> page.

It runs the rooms in order: the dataset builder (only when the built dataset is missing or stale), ingest,
each release's stale scorers, the analysis and the page, which appears with its tables all at once or not at all.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from craftmd import CraftMDError
from craftmd.analysis.bootstrap import DEFAULT_B, DEFAULT_SEED
from craftmd.atomic import atomic_dir, check_writable
from craftmd.commands.cli import (
    add_dataset_argument,
    add_quiet_argument,
    add_source_argument,
    command,
    keywords,
    resamples_type,
    seed_type,
)
from craftmd.commands.serving import add_serve_arguments


def _say(msg: str) -> None:
    print(f"[leaderboard] {msg}", file=sys.stderr, flush=True)


def _dataset_current(data: Path, source) -> bool:
    """A built dataset of this source and this builder code whose files still match its build manifest."""
    from craftmd.dataset import file_sha256
    from craftmd.dataset_builder.build import builder_sha256

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
        if not f.exists() or file_sha256(f) != info.get("sha256"):
            return False
    return True


def builtin_audits(board, data: Path, source, out: Path) -> list[dict]:
    """The audits this package computes itself (grader agreement, expert validation, the history metrics'
    agreement with the dermatologists) over ``board`` (the command's :class:`craftmd.analysis.board.Board`), written to
    ``out/*.json``."""
    from craftmd.analysis.tables import read_audits
    from craftmd.analysis.agreement.graders import grader_agreement_audit
    from craftmd.analysis.agreement.expert import upstream_expert_audit
    from craftmd.analysis.agreement.history_validity import history_validity_audit

    made = [
        grader_agreement_audit(board, data, source),
        upstream_expert_audit(source),
        history_validity_audit(board.root, data, source),
    ]
    out.mkdir(parents=True, exist_ok=True)
    for a in made:
        (out / f"{a['id']}.json").write_text(json.dumps(a, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return read_audits(out)


def _dataset(data: Path, src, progress: bool) -> None:
    """The dataset at ``data`` built from ``src`` unless it is current (a folder that is no built dataset: one line)."""
    if _dataset_current(data, src):
        _say(f"dataset: {data} is current")
    elif data.exists() and (not data.is_dir() or (any(data.iterdir()) and not (data / "build_manifest.json").exists())):
        raise CraftMDError(f"{data} exists and is not a built dataset; choose another --dataset")
    else:
        from craftmd.dataset_builder.build import build_dataset

        _say(f"dataset: building into {data}")
        build_dataset(src, data, overwrite=True, progress=progress)


def _score_all(board, data: Path, extra: list[str], progress: bool):
    """Each release of ``board`` scored by its task's default scorers and ``extra``, those that are stale; the board
    with its releases as they are now (:meth:`craftmd.analysis.board.Board.reopened`)."""
    from craftmd.scoring.score import claim_lines, default_scorers, score_release

    for r in board:
        names = list(dict.fromkeys(default_scorers(r) + extra))
        done = score_release(r.path, data, names, progress=progress)
        for line in claim_lines(done):
            _say(f"score: {line}")
        current = ", ".join(done["current"]) or "none"
        _say(f"score: {r.id}: " + (f"scored {', '.join(done['scored'])}; " if done["scored"] else "") + f"current {current}")
    return board.reopened()


def leaderboard(
    *,
    source=None,
    dataset: Path | str,
    releases: Path | str,
    out: Path | str,
    audits: Path | str | None = None,
    scorers: list[str] | None = None,
    B: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    progress: bool = True,
) -> Path:
    """build -> ingest -> score -> analyse -> audits -> page. Returns the page's path.

    Each release gets its task's default scorers and ``scorers`` (extra ones, e.g. an ``llm:`` grader),
    those that are stale. The releases folder is read once, after ingest (:class:`craftmd.analysis.board.Board`): the
    scoring, the analysis, the audits and the page take that board."""
    from craftmd.analysis.board import Board
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import OWNS, analyse, read_audits
    from craftmd.generation.ingest import ingest
    from craftmd.scoring.scorers import check_scorers
    from craftmd.source import Source

    data, releases, out = Path(dataset), Path(releases), Path(out)
    check_writable(out, owns=OWNS)  # before any work: an unrelated folder is never replaced, an unwritable one is said now
    t0 = time.perf_counter()
    src = source if isinstance(source, Source) else Source(source)

    _dataset(data, src, progress)

    _say(f"ingest: upstream results into {releases}")
    ingest(src, data, releases, progress=progress, skip_existing=True)

    extra = check_scorers(scorers) if scorers else []
    board = _score_all(Board.read(releases), data, extra, progress)

    _say("analyse: accuracy, bootstrap CIs, paired tests")
    with atomic_dir(out, owns=OWNS) as tmp:
        a = analyse(board, data, tmp, B=B, seed=seed, previous=out)  # what out/.cache holds is read back
        _say(
            "audits: grader agreement, expert validation, history metrics vs dermatologists"
            + (f", and {audits}" if audits else "")
        )
        found = {a["id"]: a for a in builtin_audits(board, data, src, tmp / "audits")}
        from craftmd.analysis.published import source_tables

        source_tables(a, src, tmp)  # the tests that need the source: the experts' McNemar, the preprint's p-values
        found.update({a["id"]: a for a in read_audits(Path(audits) if audits else None)})
        audit_dicts = [found[k] for k in sorted(found)]
        _say(f"page: {len(audit_dicts)} audit(s)")
        write_page(a, tmp, audit_dicts)
    page = out / "index.html"
    _say(f"done in {time.perf_counter() - t0:.0f} s")
    print(f"leaderboard written: {page.resolve()}")
    return page


def _leaderboard(args) -> int:
    """build -> ingest -> score -> analyse -> page, in one command

    Regenerate the leaderboard from the pinned source: build the dataset if needed, ingest upstream results
    (keeping valid releases), run each release's scorers that are stale (its task's defaults: the MCQ rules,
    the offline grader and the history metrics for CRAFT-MD; --scorer adds more), analyse, render audits, and write OUT/index.html, OUT/leaderboard.md,
    OUT/figures/ and OUT/tables/ (with the source: McNemar between models on the dermatologists' ratings, the preprint's p-values beside ours).
    """
    from craftmd.commands.serving import logs_folder, served_scorers, serving

    given = keywords(args, "source", "dataset", "releases", "out", "audits", "seed")
    served, scorers = served_scorers(args, args.scorer, logs_folder(args.out, "leaderboard"))
    with serving(served):
        leaderboard(scorers=scorers, B=args.resamples, progress=not args.quiet, **given)
    return 0


def register(sub) -> None:
    """Add ``craftmd leaderboard`` to the `craftmd` parser."""
    p = command(sub, "leaderboard", _leaderboard)
    add_source_argument(p)
    add_dataset_argument(p, help="the dataset folder (built here when missing or stale)")
    p.add_argument("--releases", required=True, help="releases folder (upstream releases ingested here)")
    p.add_argument("--out", required=True, help="where the page goes")
    p.add_argument("--audits", default=None, help="folder of audit JSON files to render in 'How far to trust these numbers'")
    p.add_argument(
        "--scorer",
        action="append",
        default=None,
        metavar="NAME",
        help="a scorer to run on every release besides its task's defaults (repeatable; craftmd score --list)",
    )
    add_serve_arguments(
        p,
        "grader (an llm: scorer's model), judge (a judge: scorer's; grader-2, judge-2, ... for more)",
        "OUT.leaderboard-servers/",
    )
    p.add_argument("--resamples", type=resamples_type, default=DEFAULT_B, help=f"bootstrap resamples (default {DEFAULT_B})")
    p.add_argument("--seed", type=seed_type, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    add_quiet_argument(p)


__all__ = ["leaderboard", "builtin_audits", "register"]
