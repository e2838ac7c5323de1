"""Two named rules for grading a four-choice MCQ answer, reported side by side.

``paper`` (the published tables' rule: the correct choice's text appears in the answer) and ``strict`` (the answer
resolves to exactly one choice, the right one); the rules are below the imports.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Literal

import Levenshtein

from craftmd import CraftMDError

# -- the rules ------------------------------------------------------------
# ``paper``
#     The rule behind the published MCQ tables, recovered from the release: an answer
#     is correct when the correct choice's text appears in it, case-insensitively.
#     It reproduces every published overall MCQ accuracy within 0.004 when ``answer`` is
#     the key upstream matched, the dataset's ``paper_answer`` (``correct_ans`` verbatim:
#     trailing spaces, stray quotes and typos included); every caller passes that column.
#     It credits an answer that names several choices as long as one of them is the right one.
#
# ``strict``
#     The answer must resolve to exactly one of the four choices: the choice's text
#     (after case, punctuation, markdown and ``Final Diagnosis:`` prefixes are
#     normalised away), a letter (``C``, ``C)``, ``(C)``, ``C.``), or a light
#     paraphrase (edit-distance ratio >= 0.9 to one choice when no choice is named
#     verbatim). An answer naming several choices is narrowed to its
#     ``Final Diagnosis:`` / first line when that names exactly one; otherwise it is
#     ``multiple`` and wrong. An answer naming none is ``none`` and wrong.
#
# Both return ``(resolved, resolved_kind, correct)``: ``resolved`` is the choice (or
# the choices joined by ``"; "``) the answer named, ``resolved_kind`` is ``single``,
# ``multiple`` or ``none``.

RULES = ("paper", "strict")
#: Bump when either rule changes what it decides (releases graded by an older version are re-graded).
#: 4: paper is given the dataset's paper_answer everywhere (submissions and craftmd score included).
RULES_VERSION = 4
Rule = Literal["paper", "strict"]
LETTERS = "abcdefghij"
SEP = "; "

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})
_NON_WORD = re.compile(r"[^0-9a-z']+")
_APOS = re.compile(r"'s\b|'")
_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:final|most\s+likely|likely)?\s*(?:diagnosis|answer|choice|option)\s*(?:is)?\s*[:\-]?\s*)+"
)
_FINAL_SPAN = re.compile(r"final\s+diagnosis\s*[:\-]?\s*(.*)")
_LETTER = re.compile(r"^(?:answer|option|choice)?\s*[:\-]?\s*\(?([a-j])\)?(?:[.):\]]|\s|$)\s*(.*)$", re.S)


def _normalise(text: str) -> str:
    """Lowercase, straighten quotes, drop markdown and punctuation, collapse spaces."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return _NON_WORD.sub(" ", _APOS.sub("", text.lower())).strip()


@lru_cache(maxsize=8192)
def _choice_patterns(choices: tuple[str, ...]) -> tuple[tuple[int, str, re.Pattern], ...]:
    """Word-bounded patterns of each normalised choice, longest first."""
    pats = []
    for i, c in enumerate(choices):
        n = _normalise(c)
        if n:
            pats.append((i, n, re.compile(r"(?<![0-9a-z])" + re.escape(n) + r"(?![0-9a-z])")))
    return tuple(sorted(pats, key=lambda p: -len(p[1])))


def _named(text: str, choices: tuple[str, ...]) -> list[int]:
    """Indices of the choices named in normalised ``text`` (a longer choice hides one inside it)."""
    found = []
    for i, _, pat in _choice_patterns(choices):
        if pat.search(text):
            found.append(i)
            text = pat.sub(" ", text)
    return sorted(found)


_MARKERS = ("hypo", "hyper", "itis", "osis", "non ", "anti", "pre", "post")


def _opposite(a: str, b: str) -> bool:
    """Near-identical spellings that mean different things (hypo-/hyper-, -itis/-osis, non-, ...)."""
    return any((m in a) != (m in b) for m in _MARKERS)


def _strip_prefix(norm: str) -> str:
    return _PREFIX.sub("", norm, count=1).strip()


def _strict(response: str, choices: tuple[str, ...]) -> list[int]:
    raw = response if response.isascii() else unicodedata.normalize("NFKC", response).translate(_QUOTES)
    raw = raw.replace("*", "").replace("#", "").strip()
    norm = _normalise(raw)
    named = _named(norm, choices)
    if len(named) > 1:
        # Narrow a verbose answer to what it gives as its final diagnosis, else its first line.
        low = raw.lower()
        spans = []
        m = _FINAL_SPAN.search(low)
        if m:
            spans.append(re.split(r"[\n.;(]", m.group(1).strip(), maxsplit=1)[0])
        spans.append(low.split("\n", 1)[0])
        for span in spans:
            narrowed = _named(_normalise(span), choices)
            if len(narrowed) == 1:
                return narrowed
        return named
    if named:
        return named
    # A bare letter ("C", "C)", "(C) ...").
    head = _strip_prefix(raw.lower().split("\n", 1)[0].strip())
    m = _LETTER.match(head)
    if m and LETTERS.index(m.group(1)) < len(choices):
        rest = _normalise(m.group(2))
        if not rest or len(rest) <= 2:
            return [LETTERS.index(m.group(1))]
    # A light paraphrase / misspelling of exactly one choice.
    first = _strip_prefix(_normalise(raw.split("\n", 1)[0]))
    if first:
        close = [i for i, n, _ in _choice_patterns(choices) if Levenshtein.ratio(first, n) >= 0.9 and not _opposite(first, n)]
        if len(close) == 1:
            return close
    return []


def grade_mcq(response: str | None, choices: list[str], answer: str, rule: Rule) -> tuple[str | None, str, bool]:
    """Grade one MCQ answer by ``rule``; returns ``(resolved, resolved_kind, correct)``.

    ``response`` None (a missing or non-text answer) is ``(None, "none", False)``.
    """
    if rule not in RULES:
        raise CraftMDError(f"unknown MCQ rule {rule!r}; known: {', '.join(RULES)}")
    if not choices:
        raise CraftMDError("an MCQ answer cannot be graded by rule without its choices")
    if response is None or not response.strip():
        return None, "none", False
    if not answer.strip():
        raise CraftMDError("an MCQ answer cannot be graded without the correct answer's text")
    if rule == "paper":
        low = response.lower()
        hits = [i for i, c in enumerate(choices) if c.lower() in low]
        correct = answer.lower() in low
    else:
        choices = [c.strip() for c in choices]
        target = _normalise(answer)
        key = tuple(choices)
        if target not in {_normalise(c) for c in choices}:
            # The correct answer is not spelled as any choice (one upstream case): it counts as a fifth name.
            key = key + (answer,)
            choices = list(key)
        hits = _strict(response, key)
        correct = len(hits) == 1 and _normalise(choices[hits[0]]) == target
    if not hits:
        return None, "none", correct
    kind = "single" if len(hits) == 1 else "multiple"
    return SEP.join(choices[i] for i in hits), kind, correct


__all__ = ["grade_mcq", "RULES", "RULES_VERSION"]


def answer_rules(task) -> dict[str, int]:
    """The MCQ rules (name -> version) a release of ``task`` is graded by: those among its scorers (a protocol's
    ``answer_rules``, :class:`craftmd.release.Protocol`)."""
    return {r: RULES_VERSION for r in RULES if r in task.scorers}
