"""Text similarity shared by the rooms: MELD's memorisation check and the training sets' decontamination."""

from __future__ import annotations

import Levenshtein


def similarity(truth: str, completion: str) -> float:
    """One minus the character edit distance normalised by the longer string."""
    longest = max(len(truth), len(completion))
    if longest == 0:
        return 1.0
    return 1.0 - Levenshtein.distance(truth, completion) / longest
