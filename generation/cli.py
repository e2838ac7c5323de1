"""Subcommands of craftmd.generation (registered by craftmd.cli)."""

from __future__ import annotations

import sys
from pathlib import Path

from craftmd.cli import add_call_arguments, add_cases_argument, add_dataset_argument, add_quiet_argument, check_base_url, command, list_type, price_type
from craftmd.release import FORMATS, SETTINGS

from .shards import add_shard_argument


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    p = command(sub, "generate", run_generate)
    add_dataset_argument(p)
    p.add_argument("--config", default="all", help="dataset config to draw cases from (default: all; nejm_image for the image cases)")
    add_cases_argument(p, "only these case ids (of --config)")
    p.add_argument("--trials", type=int, default=1, help="trials per case (the paper ran 5); trial t samples with seed S+t")
    p.add_argument("--doctor", required=True, metavar="PROVIDER/MODEL", help="the model under test")
    p.add_argument("--patient", required=True, metavar="PROVIDER/MODEL", help="the patient-AI")
    p.add_argument("--summarizer", metavar="PROVIDER/MODEL", help="the conversation summarizer (default: the patient model)")
    p.add_argument("--task", default="craftmd", choices=("craftmd", "consultation"),
                   help="craftmd (default: CRAFT-MD's protocol) or consultation (the consultation-evaluation framework's protocol: "
                        "needs the dataset's keyinfo config and --solver; settings upper, lower, consult_P, oracle_direct_P, "
                        "oracle_random_P, oracle_reverse_P for P in 20,40,60,80,100; formats mcq4, frq)")
    p.add_argument("--solver", metavar="PROVIDER/MODEL", help="consultation task: the fixed model that answers from the conversation")
    add_call_arguments(p)
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the work (default 1); more help against a fast local server, where the "
                        "client's own CPU per request is the limit (ignored for vllm/ models, which batch)")
    p.add_argument("--experiments", type=list_type, metavar="LIST",
                   help=f"settings and/or formats to run, comma-separated (default all). settings: {', '.join(SETTINGS)}; "
                        f"formats: {', '.join(FORMATS)}")
    p.add_argument("--max-turns", type=int, default=60, help="most doctor turns in a conversation (default 60; upstream's longest had 59)")
    p.add_argument("--price", type=price_type, metavar="IN,OUT", help="USD per million input,output tokens, for the cost in the summary")
    p.add_argument("--prompt-set", default=None, help="prompt set folder under generation/prompts (default: craftmd-v1; consult-v1 for --task consultation)")
    add_shard_argument(p)
    p.add_argument("--out", required=True, type=Path, metavar="RELEASE_DIR", help="the release folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace RELEASE_DIR if it exists")
    add_quiet_argument(p)


def run_generate(args) -> int:
    """run the CRAFT-MD conversations and questions for a model and write a release

    Interview every selected case with a doctor model and a patient-AI (the paper's protocol), pose the
    questions of every experiment, and write a release (conversations.parquet, answers.parquet,
    manifest.json). Models are PROVIDER/MODEL: openai/<model> (any OpenAI-compatible server: --base-url or
    OPENAI_BASE_URL, key from OPENAI_API_KEY) or vllm/<model-or-path> (vLLM offline engine, batched). Every
    request is cached (--cache), so a killed run resumes and a re-run makes no call.
    """
    from .engine import GenerateSpec, generate

    if args.base_url:
        check_base_url(args.base_url)
    report = generate(GenerateSpec(
        dataset=Path(args.dataset), out=args.out, doctor=args.doctor, patient=args.patient, summarizer=args.summarizer,
        solver=args.solver, task=args.task,
        config=args.config, cases=args.cases, trials=args.trials, experiments=args.experiments, max_turns=args.max_turns,
        seed=args.seed, temperature=args.temperature, max_tokens=args.max_tokens, base_url=args.base_url,
        concurrency=args.concurrency, server_concurrency=args.server_concurrency, workers=args.workers, timeout=args.timeout, max_retries=args.max_retries, price=args.price,
        cache=args.cache, prompt_set=args.prompt_set, shard=args.shard, overwrite=args.overwrite, progress=not args.quiet,
    ))
    print(report.summary(), file=sys.stderr)
    return 0
