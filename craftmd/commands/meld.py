"""``craftmd meld --model PROVIDER/MODEL``: the MELD contamination check of any model, as a folder of its own.

The same run as the ``meld`` scorer (:func:`craftmd.scoring.meld.meld`; ``craftmd score RELEASE --scorer meld`` runs it
on a release's own model and adds its rows to the release): here for a model named on the command line, written to
``--out`` (scores, summary, histogram) and, with ``--audits``, as the leaderboard's audit.
"""

from __future__ import annotations

import argparse

from craftmd.commands.cli import (
    add_cases_argument,
    add_dataset_argument,
    add_quiet_argument,
    command,
    fraction_type,
    positive_int,
    seed_type,
    temperature_type,
)
from craftmd.commands.serving import add_serve_arguments


def _meld(args: argparse.Namespace) -> int:
    """contamination check (MELD): can a model write the second half of each vignette?

    For each case, give the model the first half of the vignette with the MELD prompt (--prompts: upstream's
    get_meld_prompt read from the pinned code, or meld-v1, scoring/prompts/meld.txt) and compare its completion with the true second half: similarity = 1 -
    Levenshtein distance / length of the longer text; similarity >= threshold flags the case as likely
    memorised. Writes OUT/scores.parquet (per case: meld_similarity, meld_flagged), OUT/summary.json and
    OUT/similarity_hist.png.
    """
    from craftmd.analysis.meld import write_meld_audit
    from craftmd.commands.serving import logs_folder, plan, serving
    from craftmd.scoring.meld import DEFAULT_CONFIGS, read_summary, run_meld

    served, called = plan(args, {"model": args.model}, logs_folder(args.out, "meld"))
    with serving(served):
        out = run_meld(
            args.dataset, called["model"], args.out, base_url=args.base_url, configs=tuple(args.configs or DEFAULT_CONFIGS),
            cases=args.cases, limit=args.limit, cache=args.cache, split=args.split, role=args.role, prompt_set=args.prompts,
            temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed, concurrency=args.concurrency,
            threshold=args.threshold, overwrite=args.overwrite, progress=not args.quiet,
        )  # fmt: skip
    s = read_summary(out)
    for name, st in [*sorted(s["configs"].items()), ("all", s["overall"])]:
        share = "n/a" if st["share_flagged"] is None else f"{100 * st['share_flagged']:.2f} %"
        print(f"{name:14s} cases {st['n']:5d}  failed {st['n_failed']:4d}  flagged {st['n_flagged']:4d} ({share})  "
              f"mean similarity {st['mean_similarity']}")  # fmt: skip
    if args.audits:
        print(f"audit: {write_meld_audit(out, args.audits)}")
    print(f"wrote {out}")
    return 0


def register(sub) -> None:
    """Add ``craftmd meld`` to the `craftmd` parser."""
    from craftmd.scoring.meld import PROMPT_SET, PROMPT_SETS

    meld = command(sub, "meld", _meld)
    add_dataset_argument(meld)
    meld.add_argument("--model", required=True, help="PROVIDER/MODEL, e.g. openai/gpt-4o or vllm/Qwen/Qwen2.5-7B-Instruct")
    meld.add_argument("--base-url", help="OpenAI-compatible server (e.g. a vllm serve endpoint)")
    add_serve_arguments(meld, "model (--model's)", "OUT.meld-servers/ beside OUT")
    meld.add_argument("--config", action="append", dest="configs", metavar="CONFIG",
                      help="dataset config(s) to test (repeatable; default medqa_usmle, derm_public, derm_private)")  # fmt: skip
    add_cases_argument(meld)
    meld.add_argument("--limit", type=positive_int, help="only the first N cases of each config")
    meld.add_argument("--cache", help="request cache (SQLite) path; reruns answer from it")
    meld.add_argument("--split", choices=("chars", "words"), default="chars",
                      help="halve at the space nearest the character midpoint (the paper's rule, default) or by word count")  # fmt: skip
    meld.add_argument(
        "--prompts",
        choices=PROMPT_SETS,
        default=PROMPT_SET,
        help=f"prompt set (default {PROMPT_SET}: upstream's, read from the pinned code; meld-v1: the package's file)",
    )
    meld.add_argument("--role", choices=("system", "user"), default="system", help="send the prompt as this role (paper: system)")
    meld.add_argument("--temperature", type=temperature_type, default=0.0)
    meld.add_argument("--max-tokens", type=positive_int, default=1024)
    meld.add_argument("--seed", type=seed_type, default=0)
    meld.add_argument("--concurrency", type=positive_int, default=8)
    meld.add_argument("--threshold", type=fraction_type, default=0.95, help="similarity that flags a case (default 0.95)")
    meld.add_argument("--out", required=True, help="output folder (written atomically)")
    meld.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    meld.add_argument("--audits", help="also write the leaderboard audit JSON (and figure) into this folder")
    add_quiet_argument(meld)


__all__ = ["register"]
