"""Text shared by the rooms: the similarity of MELD's memorisation check and the training sets' decontamination,
and the one line naming the reason most failures had."""

from __future__ import annotations

import Levenshtein


def similarity(truth: str, completion: str) -> float:
    """One minus the character edit distance normalised by the longer string."""
    longest = max(len(truth), len(completion))
    if longest == 0:
        return 1.0
    return 1.0 - Levenshtein.distance(truth, completion) / longest


def dominant_reason(reasons) -> str:
    """The reason that failed most of ``reasons`` (strings, or a ``{reason: count}`` mapping), as ``N × REASON``
    (ties: the first by name), for the one line of a command that produced nothing usable."""
    from collections import Counter

    counts = Counter(reasons)
    if not counts:
        return "no reason given"
    reason, n = min(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return f"{n} × {str(reason or 'no reason given')[:200]}"
