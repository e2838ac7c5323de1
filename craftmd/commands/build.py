"""``craftmd build``: the benchmark dataset from the pinned upstream source.

The work is :func:`craftmd.dataset_builder.build.build_dataset` (and, with ``--golden-writer``,
:func:`craftmd.generation.golden.writer`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from craftmd.commands.cli import add_quiet_argument, add_source_argument, command, positive_int
from craftmd.commands.serving import add_serve_arguments


def register(sub) -> None:
    """Add ``craftmd build`` to the `craftmd` parser."""
    b = command(sub, "build", _build)
    add_source_argument(b)
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write the dataset folder")
    b.add_argument("--version", dest="data_version", metavar="X.Y.Z", help="dataset version (default: the package version)")
    b.add_argument(
        "--medqa",
        type=Path,
        metavar="FILE.jsonl",
        help="build medqa_usmle from this MedQA JSONL file, keeping the items the MedQA rule picks",
    )
    b.add_argument(
        "--medqa-train",
        type=Path,
        metavar="FILE.jsonl",
        help="also make golden consultations (consult_train) and CRAFT-MD training cases (craftmd_train) from this MedQA-format JSONL file (MedQA's training "
        "split: question, options, answer_idx; optional facts)",
    )
    b.add_argument(
        "--golden-writer",
        metavar="PROVIDER/MODEL",
        help="also write golden consultations with this model playing both sides (cached; failures listed in "
        "build_report.md); openai-api/<service>/<model> reads <SERVICE>_BASE_URL and <SERVICE>_API_KEY",
    )
    b.add_argument(
        "--golden-limit", type=positive_int, metavar="N", help="with --golden-writer: write the first N kept cases only"
    )
    b.add_argument("--golden-base-url", metavar="URL", help="with --golden-writer: the server of an openai/ model")
    b.add_argument("--cache", type=Path, metavar="FILE", help="with --golden-writer: the request cache (default: the package's)")
    add_serve_arguments(b, "writer (--golden-writer's model)", "DIR.build-servers/ beside --out")
    b.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="another built dataset folder holding a registered task's test cases (the medpi packets, say): the training "
        "configs are kept apart from those too (repeatable; the report names the tasks whose cases were not at hand)",
    )
    b.add_argument("--overwrite", action="store_true", help="replace an existing build at --out (atomically)")
    add_quiet_argument(b)


def _build(args: argparse.Namespace) -> int:
    """build the Hugging Face dataset from the pinned upstream source

    Build the CRAFT-MD dataset (configs medqa_usmle, derm_public, derm_private, all, nejm_image, diagnoses)
    from the pinned upstream release, verified file by file against dataset_builder/pin/<commit>.sha256, and
    the facts config (MediQ's atomic facts, CC BY 4.0) from the pinned MediQ archive ($CRAFTMD_MEDIQ, else
    ../shared/sources).
    The consult_train config (split train) holds golden consultations for training a doctor: scripted from MediQ's
    MedQA lines (and --medqa-train's), no model needed, and with --golden-writer also written by a model; every
    benchmark case is excluded (dropped candidates listed in build_report.md).
    The craftmd_train config (split train) holds the same MedQA items posed as CRAFT-MD vignettes (the columns
    of medqa_usmle, ids such as train_mediq_8), for training; every benchmark case is excluded the same way.
    A benchmark case is a test case of any registered task: this build's own, and those of --against folders.
    Writes parquet per config, a README.md card, build_manifest.json and build_report.md into --out,
    atomically; any bad input stops the build with one line and leaves nothing at --out.
    """
    from craftmd import CraftMDError
    from craftmd.commands.serving import logs_folder, plan, serving
    from craftmd.dataset_builder.build import build_dataset
    from craftmd.source import Source

    if args.golden_writer is None and any(x is not None for x in (args.golden_limit, args.golden_base_url, args.cache)):
        raise CraftMDError("--golden-limit, --golden-base-url and --cache go with --golden-writer")
    golden_writer, served = None, None
    if args.golden_writer:
        from craftmd.generation.golden import writer

        served, called = plan(args, {"writer": args.golden_writer}, logs_folder(args.out, "build"))
        golden_writer = writer(
            called["writer"], base_url=args.golden_base_url, cache=args.cache, limit=args.golden_limit, progress=not args.quiet
        )
    elif args.serve or args.serve_args:
        raise CraftMDError("--serve and --serve-args go with --golden-writer")

    with serving(served):
        report = build_dataset(
            Source(args.source),
            args.out,
            version=args.data_version,
            overwrite=args.overwrite,
            progress=not args.quiet,
            medqa=args.medqa,
            medqa_train=args.medqa_train,
            golden_writer=golden_writer,
            against=args.against,
        )
    print(report.summary())
    print(f'dataset written to {args.out}; load it with datasets.load_dataset("{args.out}", "medqa_usmle")')
    return 0


__all__ = ["register"]
