"""``craftmd history RELEASE --dataset DIR``: the deterministic history-taking metrics of a release's conversations.

Registered by the lead into :data:`craftmd.commands.cli.ROOMS` (``"craftmd.scoring.history_cli"``); the handler parses
nothing itself and calls :func:`craftmd.scoring.history.score_history` per release.
"""

from __future__ import annotations

import json

from craftmd.commands.cli import add_dataset_argument, add_quiet_argument, command


def _history(args) -> int:
    """score history taking in a release's conversations (ROUGE coverage, facts, turns, question diversity)

    Add the deterministic history-taking scores (scorer 'history': patient_info_recall/precision/f1,
    patient_fact_recall, doctor_turns, words per turn, question_similarity_rouge1/2/L,
    patient_info_recall_at_10..100) of every multi-turn conversation to each RELEASE's scores.parquet;
    conversations, answers and manifest are left alone.
    """
    from craftmd.scoring.history import score_history, stale

    done = []
    for release in args.release:
        if args.only_stale and not stale(release, args.dataset):
            done.append({"release": str(release), "history": "current"})
            continue
        score_history(release, args.dataset, progress=not args.quiet, workers=args.workers)
        done.append({"release": str(release), "history": "scored"})
    for d in done:
        print(json.dumps(d))
    return 0


def register(sub) -> None:
    """Add ``craftmd history`` to the `craftmd` parser."""
    p = command(sub, "history", _history)
    p.add_argument("release", nargs="+", metavar="RELEASE", help="release folder(s)")
    add_dataset_argument(p)
    p.add_argument("--only-stale", action="store_true", help="skip releases whose history scores are current")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: up to 2)")
    add_quiet_argument(p)


__all__ = ["register"]
