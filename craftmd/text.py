"""Text similarity shared by the rooms: MELD's memorisation check, and the rule that says two texts are the same case
(the training sets' decontamination and the overlap between benchmarks, :mod:`craftmd.overlap`).

The rule: both texts normalised (:func:`normalise`); the cases sharing a word :data:`NGRAM`-gram with a text are found
through an index of n-grams (:class:`NgramIndex`), never by comparing every pair; for those, MELD's similarity
(:func:`similarity`) and the share of the text's distinct n-grams the case also has. A text is a case when one of them
reaches :data:`LEVENSHTEIN_THRESHOLD` or :data:`NGRAM_THRESHOLD` (:func:`same_case`). The thresholds are measured in
:func:`craftmd.dataset_builder.golden.decontaminate`.
"""

from __future__ import annotations

import re

import Levenshtein

NGRAM = 8
LEVENSHTEIN_THRESHOLD = 0.75
NGRAM_THRESHOLD = 0.2
_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")


def similarity(truth: str, completion: str) -> float:
    """One minus the character edit distance normalised by the longer string."""
    longest = max(len(truth), len(completion))
    if longest == 0:
        return 1.0
    return 1.0 - Levenshtein.distance(truth, completion) / longest


def normalise(text: str) -> str:
    """Lower-cased, punctuation dropped, whitespace runs made one space."""
    return _SPACE.sub(" ", _PUNCT.sub("", text.lower())).strip()


def grams(words: list[str]) -> set[tuple[str, ...]]:
    """The distinct word :data:`NGRAM`-grams (the whole text when it is shorter than one)."""
    return set(zip(*(words[i:] for i in range(NGRAM)))) or ({tuple(words)} if words else set())


def similar(a: str, b: str) -> float:
    """MELD's similarity when it reaches :data:`LEVENSHTEIN_THRESHOLD`, else 0 (the edit distance stops early)."""
    longest = max(len(a), len(b), 1)
    if min(len(a), len(b)) < LEVENSHTEIN_THRESHOLD * longest:  # the distance is at least the lengths' difference
        return 0.0
    cut = int((1 - LEVENSHTEIN_THRESHOLD) * longest)
    d = Levenshtein.distance(a, b, score_cutoff=cut)
    return 1.0 - d / longest if d <= cut else 0.0


def same_case(sim: float, share: float) -> bool:
    """The rule's verdict on a similarity and an n-gram share."""
    return sim >= LEVENSHTEIN_THRESHOLD or share >= NGRAM_THRESHOLD


class NgramIndex:
    """Texts by id, normalised (``norm``), with their distinct n-grams (``grams``) and an index n-gram -> ids (``postings``,
    each list in natural id order)."""

    def __init__(self, texts: dict[str, str]):
        from craftmd.release import natural_key

        self.norm = {cid: normalise(t or "") for cid, t in texts.items()}
        order = sorted(self.norm, key=natural_key)
        self.rank = {cid: i for i, cid in enumerate(order)}
        self.grams = {cid: grams(self.norm[cid].split()) for cid in order}
        self._postings: dict[tuple[str, ...], list[str]] | None = None

    @property
    def postings(self) -> dict[tuple[str, ...], list[str]]:
        """n-gram -> the ids that have it, in natural order (made on first use)."""
        if self._postings is None:
            self._postings = {}
            for cid, gs in self.grams.items():
                for g in gs:
                    self._postings.setdefault(g, []).append(cid)
        return self._postings

    def shared(self, text: str) -> tuple[str, int, dict[str, int]]:
        """(``text`` normalised, its distinct n-grams, {id: n-grams it shares with that text}) for the ids sharing one."""
        norm = normalise(text or "")
        gs = grams(norm.split())
        return norm, len(gs), self.counts(gs)

    def counts(self, gs: set[tuple[str, ...]]) -> dict[str, int]:
        """{id: how many of the n-grams ``gs`` it has} for the ids that have one."""
        counts: dict[str, int] = {}
        postings = self.postings
        for g in gs:
            for cid in postings.get(g, ()):
                counts[cid] = counts.get(cid, 0) + 1
        return counts

    def nearest(self, text: str) -> tuple[str | None, float, float]:
        """(the indexed text most like ``text``, similarity, n-gram share of ``text``); (None, 0, 0) when none shares an
        n-gram. The best is the one of highest similarity at or above the threshold, then of highest share, then the
        first in natural id order; its similarity is MELD's, exact."""
        norm, n, counts = self.shared(text)
        best = (None, 0.0, 0.0)
        for cid, k in sorted(counts.items(), key=lambda kv: self.rank[kv[0]]):
            s, share = similar(self.norm[cid], norm), k / n
            if (s, share) > best[1:]:
                best = (cid, s, share)
        return best if best[0] is None else (best[0], similarity(self.norm[best[0]], norm), best[2])


__all__ = ["similarity", "normalise", "grams", "similar", "same_case", "NgramIndex", "NGRAM", "LEVENSHTEIN_THRESHOLD",
           "NGRAM_THRESHOLD"]  # fmt: skip
