"""Maintainers' tool: candidate ``accepted`` rows for the offline grader's table.

Never run at grading time. It reads upstream releases (their recorded ``upstream-gpt4``
labels) and a built dataset, keeps **training cases only** (the held-out rule of
:func:`craftmd.scoring.measured.held_out` drops every derm_private case and every case
whose number is divisible by 5), grades every FRQ answer with the current offline grader,
and lists (correct answer, extracted diagnosis) pairs that the recorded grader-AI
accepted but the offline grader does not: at least ``--min-accepted`` answers and a share
of at least ``--min-share``. The output is TSV in the table's format, for review; reviewed
rows are pasted into ``scoring/data/synonyms.tsv`` (and the table's version bumped).

    python -m craftmd.scoring.synonym_mining --releases out/releases --dataset out/data > candidates.tsv
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import polars as pl

from craftmd.release import find_releases
from craftmd.scoring.measured import held_out
from craftmd.scoring.offline import _PAREN, _WITH, OfflineGrader, _fold

#: Extracted "diagnoses" that are sentence fragments, not names.
_JUNK = re.compile(r"(?:\bdiagnosis\b|^(?:based on|symptom|patient|boy is|to be|cause|not a|these|supported|complication of)\b)")


def mine(
    releases_dir, dataset_dir, *, min_accepted: int = 3, min_share: float = 0.7, max_words: int = 8
) -> list[tuple[str, str, int, int]]:
    """``(answer, diagnosis, accepted, seen)`` candidates from training cases, most accepted first."""
    from craftmd.dataset import load_config

    ds = load_config(dataset_dir, "all").select("case_id", "source", "answer")
    answers = {c: a for c, s, a in ds.iter_rows() if not held_out(c, s)}
    grader = OfflineGrader()
    seen: Counter = Counter()
    accepted: Counter = Counter()
    for rel in find_releases(releases_dir):
        if rel.manifest.kind != "upstream" or not rel.has("scores"):
            continue
        a = pl.from_arrow(rel.table("answers")).filter((pl.col("format") == "frq") & ~pl.col("with_image"))
        g = rel.verdicts(grader="upstream-gpt4", format="frq")
        j = a.join(g.select("case_id", "trial", "setting", "correct"), on=["case_id", "trial", "setting"])
        for case_id, response, ok in j.select("case_id", "response", "correct").iter_rows():
            if case_id not in answers:  # held-out: never looked at
                continue
            r = grader.grade(response, answers[case_id])
            if r.resolved_kind != "single" or r.correct:
                continue
            dx = _fold(_WITH.split(_PAREN.sub(" ", r.resolved), maxsplit=1)[0])
            key = (_fold(answers[case_id]), dx)
            seen[key] += 1
            accepted[key] += bool(ok)
    out = []
    for key, n in seen.items():
        k = accepted[key]
        if k >= min_accepted and k / n >= min_share and not _JUNK.search(key[1]) and len(key[1].split()) <= max_words:
            out.append((key[0], key[1], k, n))
    return sorted(out, key=lambda t: (-t[2], t[0], t[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", required=True)
    ap.add_argument("--dataset", required=True, help="a built dataset folder")
    ap.add_argument("--min-accepted", type=int, default=3)
    ap.add_argument("--min-share", type=float, default=0.7)
    args = ap.parse_args(argv)
    for answer, dx, k, n in mine(args.releases, args.dataset, min_accepted=args.min_accepted, min_share=args.min_share):
        sys.stdout.write(f"{answer}\t{dx}\taccepted\t{k}/{n} training answers\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
