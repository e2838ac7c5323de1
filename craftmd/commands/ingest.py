"""``craftmd ingest``: upstream results of the pinned source -> frozen releases.

It builds the dataset the releases are graded against when none is given (into a scratch folder), then runs
:func:`craftmd.generation.ingest.ingest`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from craftmd.commands.cli import add_dataset_argument, add_quiet_argument, add_source_argument, command


def ingest_source(source, dataset: Path | str | None, out: Path | str, **options) -> list[Path]:
    """Ingest every (or each named) upstream model into ``out``; build a scratch dataset when ``dataset`` is None."""
    from craftmd.generation.ingest import ingest
    from craftmd.source import Source

    src = source if isinstance(source, Source) else Source(source)
    if dataset is not None:
        return ingest(src, dataset, out, **options)
    from craftmd.dataset_builder.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        build_dataset(src, Path(tmp) / "data", progress=options.get("progress", True))
        return ingest(src, Path(tmp) / "data", out, **options)


def _ingest(args) -> int:
    """turn upstream results/<model>/ folders (or inspect logs) into frozen, graded releases

    Read each upstream results/<model>/ folder of the pinned source once and write a frozen release
    OUT/<model>/ (conversations, answers, scores: paper and strict MCQ rules, recorded GPT-4 FRQ labels;
    manifest). With --inspect LOG..., turn inspect logs of craftmd's tasks (inspect eval craftmd/craftmd,
    or logs written by craftmd export --inspect) into the one release OUT; the logs' scores are kept as claims
    (scorer claimed:NAME, never ranked), which craftmd score computes again and checks.
    """
    if args.inspect:
        from craftmd.inspect_bridge.logs import ingest_logs

        print(ingest_logs(args.inspect, args.out, overwrite=args.overwrite, dataset=args.dataset))
        return 0
    paths = ingest_source(
        args.source,
        args.dataset,
        args.out,
        models=args.model or None,
        progress=not args.quiet,
        overwrite=args.overwrite,
        skip_existing=args.skip_existing,
    )
    for p in paths:
        print(p)
    return 0


def register(sub) -> None:
    """Add ``craftmd ingest`` to the `craftmd` parser."""
    p = command(sub, "ingest", _ingest)
    add_source_argument(p)
    add_dataset_argument(
        p,
        required=False,
        help="a built dataset folder (craftmd build --out DIR); default: build one into a scratch folder "
        "(with --inspect: every case of the logs must be one of it, else nothing is written)",
    )
    p.add_argument("--out", required=True, help="the releases folder to write into (with --inspect: the release folder)")
    p.add_argument(
        "--inspect",
        nargs="+",
        metavar="LOG",
        help="inspect logs (.eval) of craftmd's tasks to turn into the release OUT (needs pip install 'craftmd[inspect]')",
    )
    p.add_argument("--model", action="append", help="only this upstream model (repeatable); default: all six")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace existing releases")
    g.add_argument("--skip-existing", action="store_true", help="keep existing releases that are valid ingests of this source")
    add_quiet_argument(p)


__all__ = ["ingest_source", "register"]
