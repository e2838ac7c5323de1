"""History taking, measured without a model: the ``history`` scorer over every multi-turn conversation.

Each conversation of a CRAFT-MD release gets ROUGE coverage of what the patient held, MediQ fact recall, turns and words
per turn, the diversity of the doctor's questions and recall by turn; the definitions are below the imports.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from craftmd import CraftMDError
from craftmd.dataset import dataset_fingerprint

# -- what it computes ------------------------------------------------------------
# After the consultation-evaluation framework (its "medical information coverage", "average
# turn and length", "diversity of doctors' queries" and turn analysis), each conversation of
# a release gets these scores (variant keys ``conversation``, ``with_image``; the trial as in
# the conversation; metrics declared in :mod:`craftmd.metrics`):
#
# * ``patient_info_recall`` / ``_precision`` / ``_f1`` — ROUGE-1 of the patient's turns joined
#   (the prediction) against what the patient was told to hold (the reference): the case's
#   ``history`` for a ``no_exam`` conversation, its ``vignette`` otherwise (an image case's
#   vignette from ``nejm_image``). Computed exactly as Google's ``rouge-score``
#   (``RougeScorer(["rouge1"], use_stemmer=True).score(reference, prediction)``), with its own
#   tokenizer and Porter stemmer; each distinct word is stemmed once (:class:`_Stems`).
# * ``patient_fact_recall`` — on cases with MediQ atomic facts (the dataset's ``facts``
#   config): the share of the facts the patient held that its turns reveal. :data:`RULES`
#   states the rule: a fact's content words are its ROUGE tokens (lower-cased, split at
#   anything but a-z and 0-9) with :data:`STOPWORDS` dropped, then stemmed as ROUGE stems;
#   the fact is covered by a text when at least half (:data:`THRESHOLD`) of its distinct
#   content stems occur in the text. A fact is *held* when the reference covers it (MediQ
#   worked from its own copy of some vignettes, and a ``no_exam`` patient holds no exam
#   findings), and *revealed* when the patient's turns cover it. The detail lists each
#   fact's hit: 1 revealed, 0 held but not revealed, null not held. Stated before looking at
#   any rating: 0.5 is "most of the fact's content words", the rule of thumb of ROUGE-style
#   coverage; it was not tuned on the dermatologists' labels.
# * ``doctor_turns`` — the doctor's messages after its fixed opening line (its questions and
#   its final diagnosis); ``doctor_words_per_turn`` and ``patient_words_per_turn`` — mean
#   ROUGE tokens per such doctor turn and per patient turn (the patient's turns are the
#   ``user`` messages after the doctor's first message: a system prompt sent as ``user``, as
#   upstream did for LLaMA-2, is not the patient).
# * ``question_similarity_rouge1`` / ``_rouge2`` / ``_rougeL`` — the framework's diversity of
#   the doctor's queries: the mean ROUGE F1 between the doctor's questions of a conversation
#   over all pairs i≠j (F1 is symmetric, so the mean over pairs i<j, summed exactly with
#   ``math.fsum``); a question is a doctor turn after the opening line that the patient
#   answered. Lower is more diverse. Left out where there are fewer than two questions.
# * ``patient_info_recall_at_10`` … ``_at_100`` — the framework's turn analysis as ten
#   metrics (not a variant key): ``patient_info_recall`` over the patient's replies to the
#   first ⌈s·K/100⌉ of the doctor's K answered turns (the opening line counts: the patient's
#   first reply answers it); ``_at_100`` equals ``patient_info_recall``.
#
# A conversation that failed (``ended = error``) gets every score with status ``error``. The
# scorer's record holds its identity (:data:`HISTORY_VERSION`, the hash of :data:`RULES`,
# the rouge-score and nltk versions, since the stemmer decides tokens) and its inputs (the
# conversations file's and the dataset files' hashes); ``craftmd score --scorer history`` re-runs it when either changes.
# Scoring runs in worker processes (fork) over slices of the conversations; the result does not
# depend on their number. The parent tokenizes every message a metric reads in one polars pass
# (:func:`encode`); a worker scores all question pairs of its slice at once with numpy and scipy
# (:func:`_similarities`: sparse products for the n-gram overlaps, a vectorised bit-parallel LCS), each
# pair's F1 the same float expression as rouge-score's, so the values are rouge-score's to the bit.

SCORER = "history"
HISTORY_VERSION = 1
THRESHOLD = 0.5
SHARES = tuple(range(10, 101, 10))
#: Function words and the vignette's narration words (who is described, how it is reported): never information.
STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be been before being below between both but by
    can could did do does doing down during each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just me more most my myself no nor not of off on once only or other our
    ours out over own same she should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom why will with would you
    your yours s t
    patient patients man men woman women boy girl male female person he she his her him mother father
    reports reported report states stated says said notes noted describes described presents presented presenting
    complains complained complaint complaints denies denied deny endorses endorsed admits admitted""".split()
)
RULES = {
    "reference": "no_exam conversation -> the case's history; otherwise its vignette (nejm_image's for image cases)",
    "patient_turns": "user messages after the doctor's first message",
    "doctor_turns": "assistant messages after the first (the fixed opening line)",
    "questions": "doctor turns after the opening line that the next message (user) answers",
    "rouge": "rouge-score RougeScorer(use_stemmer=True).score(target=reference, prediction=patient turns joined by newlines)",
    "question_similarity": "mean over pairs i<j of RougeScorer F1(target=q_i, prediction=q_j), math.fsum; needs >= 2 questions",
    "recall_at": "patient replies to the first ceil(s*K/100) of the K answered doctor turns (opening line included)",
    "facts": f"content stems (rouge tokens minus stopwords, stemmed) covered >= {THRESHOLD} by a text; held = covered by the "
    "reference, revealed = covered by the patient turns; recall = revealed / held; none held: no score",
    "stopwords": sorted(STOPWORDS),
    "words": "rouge-score tokens",
    "failed": "ended = error -> every metric status error",
}
METRIC_NAMES = (
    "patient_info_recall", "patient_info_precision", "patient_info_f1", "patient_fact_recall",
    "doctor_turns", "doctor_words_per_turn", "patient_words_per_turn",
    "question_similarity_rouge1", "question_similarity_rouge2", "question_similarity_rougeL",
    *(f"patient_info_recall_at_{s}" for s in SHARES),
)  # fmt: skip
SCHEMA = pa.schema(
    [
        ("case_id", pa.string()), ("trial", pa.int16()), ("conversation", pa.string()), ("with_image", pa.bool_()),
        ("scorer", pa.string()), ("metric", pa.string()), ("value", pa.float64()), ("label", pa.string()),
        ("detail", pa.string()), ("status", pa.string()),
    ]
)  # fmt: skip


# -- rouge-score's tokens, each distinct word stemmed once ----------------------------------------


class _Stems(dict):
    """word -> its rouge-score token (stemmed when longer than 3 characters; "" when rouge-score drops it)."""

    def __init__(self):
        super().__init__()
        from rouge_score import tokenize, tokenizers

        self._stem = tokenizers.DefaultTokenizer(use_stemmer=True)._stemmer.stem
        self._valid = tokenize.VALID_TOKEN_RE.match

    def __missing__(self, word: str) -> str:
        s = self._stem(word) if len(word) > 3 else word
        s = s if self._valid(s) else ""
        self[word] = s
        return s


_STEMS: _Stems | None = None


def _stems() -> _Stems:
    global _STEMS
    if _STEMS is None:
        _STEMS = _Stems()
    return _STEMS


def words(text: str | None) -> list[str]:
    """rouge-score's tokens before stemming (lower-cased; anything but a-z0-9 splits)."""
    from rouge_score.tokenize import NON_ALPHANUM_RE

    return NON_ALPHANUM_RE.sub(" ", (text or "").lower()).split()


def tokens(text: str | None) -> list[str]:
    """Exactly ``rouge_score.tokenize.tokenize(text, PorterStemmer())`` (what ``use_stemmer=True`` uses)."""
    get = _stems().__getitem__
    return [s for s in map(get, words(text)) if s]


#: Every rouge token seen so far -> a small integer: the measures compare tokens by id (equal ids, equal tokens).
_IDS: dict[str, int] = {}


def token_ids(text: str | None) -> list[int]:
    """:func:`tokens` as ids of :data:`_IDS`."""
    ids = _IDS
    return [ids.setdefault(t, len(ids)) for t in tokens(text)]


def encode(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_ids` of many texts at once: (ids, offsets), text ``i``'s ids being ``ids[offsets[i]:offsets[i+1]]``.

    The same tokens as rouge-score's: Python lower-cases (``str.lower``, as rouge-score does), polars replaces every
    run of characters but a-z0-9 with a space and splits (the same regular expression), and each distinct word is
    stemmed once by rouge-score's own stemmer (:class:`_Stems`).
    """
    import polars as pl

    n = len(texts)
    lowered = pl.Series("w", [(t or "").lower() for t in texts], dtype=pl.String)
    exploded = (
        pl.DataFrame({"w": lowered.str.replace_all(r"[^a-z0-9]+", " ").str.split(" ")})
        .with_row_index("row")
        .explode("w")
        .filter(pl.col("w").is_not_null() & (pl.col("w") != ""))
    )
    uniq = exploded.get_column("w").unique(maintain_order=True).to_list()
    stems, ids = _stems(), _IDS
    wanted = [stems[w] for w in uniq]
    codes = [ids.setdefault(s, len(ids)) if s else -1 for s in wanted]
    mapped = exploded.with_columns(pl.col("w").replace_strict(uniq, codes, return_dtype=pl.Int64).alias("id")).filter(
        pl.col("id") >= 0
    )
    rows = mapped.get_column("row").to_numpy()
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return mapped.get_column("id").to_numpy(), offsets


def fmeasure(p: float, r: float) -> float:
    """rouge-score's F-measure (``rouge_score.scoring.fmeasure``)."""
    return _f(p, r)


# -- the measures ------------------------------------------------------------------------------


def content_stems(text: str) -> frozenset[str]:
    """A fact's content: its rouge words minus :data:`STOPWORDS`, stemmed as rouge-score stems."""
    get = _stems().__getitem__
    return frozenset(s for s in map(get, (w for w in words(text) if w not in STOPWORDS)) if s)


def content_ids(text: str) -> frozenset[int]:
    """:func:`content_stems` as ids of :data:`_IDS`."""
    ids = _IDS
    return frozenset(ids.setdefault(s, len(ids)) for s in content_stems(text))


def covered(content: frozenset, stems: set | frozenset) -> bool:
    """Whether at least :data:`THRESHOLD` of a fact's content stems occur in ``stems`` (empty content: never)."""
    return bool(content) and len(content & stems) >= THRESHOLD * len(content)


def fact_hits(facts: list[frozenset], reference: set, patient: set) -> list[int | None]:
    """Each fact: 1 revealed by the patient, 0 held but not revealed, None not held (not in the reference)."""
    return [None if not covered(f, reference) else int(covered(f, patient)) for f in facts]


def split_turns(roles: list[str], contents: list) -> tuple[list, list, list[int], int]:
    """(doctor turns after the opening line, patient turns, which doctor turns are questions (indexes into the
    doctor turns), answered doctor turns incl. the opening). ``contents`` are the messages' texts (None read as
    empty) or their token lists."""
    first = next((i for i, r in enumerate(roles) if r == "assistant"), None)
    if first is None:
        return [], [], [], 0
    doctor, patient, questions = [], [], []
    answered = 0
    n = len(roles)
    for i in range(first, n):
        r, c = roles[i], contents[i]
        if c is None:
            c = ""
        if r == "assistant":
            replied = i + 1 < n and roles[i + 1] == "user"
            answered += replied
            if i != first:
                if replied:
                    questions.append(len(doctor))
                doctor.append(c)
        elif r == "user":
            patient.append(c)
    return doctor, patient, questions, answered


def _masks(toks: list[str]) -> dict[str, int]:
    """token -> bit mask of its positions in ``toks``."""
    masks: dict[str, int] = {}
    for i, t in enumerate(toks):
        masks[t] = masks.get(t, 0) | (1 << i)
    return masks


def lcs_length(a: list[str], b: list[str], masks_a: dict[str, int] | None = None) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (bit-parallel, Allison–Dix / Hyyrö: one pass
    over ``b`` with ``a``'s position masks); equals the last cell of rouge-score's LCS table."""
    masks = _masks(a) if masks_a is None else masks_a
    full = (1 << len(a)) - 1
    v = full
    for t in b:
        m = masks.get(t)
        if m:
            u = v & m
            v = (v + u) | (v - u)
    return len(a) - (v & full).bit_count()


def _f(p: float, r: float) -> float:
    # rouge_score.scoring.fmeasure (same expression, same floats)
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


# -- every question pair at once -------------------------------------------------------------------
#
# The doctor's questions of many conversations are scored together with numpy: the questions' token ids
# concatenated (``tok``), question q being ``tok[qoff[q]:qoff[q+1]]``, conversation by conversation. Pair i<j of a
# conversation's questions is row ``pair_start[i] + j - i - 1`` of the per-pair arrays (conversation by
# conversation, i then j ascending: the order of a double loop).


def _ranges(starts, lens) -> np.ndarray:
    """The indexes ``starts[i], …, starts[i] + lens[i] - 1`` of every i, concatenated."""
    lens = np.asarray(lens, np.int64)
    total = int(lens.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    return np.repeat(np.asarray(starts, np.int64) - (ends - lens), lens) + np.arange(total, dtype=np.int64)


def _grouped(grams: np.ndarray, owner: np.ndarray, qconv: np.ndarray, qstart: np.ndarray) -> tuple:
    """The occurrences of n-grams (int codes, equal codes equal n-grams) in questions ``owner``, sorted by
    (conversation, n-gram, question): (the sorting order, each sorted occurrence's group — its (conversation,
    n-gram), numbered 0, 1, … in that order — and its repeat number, 0 for its n-gram's first occurrence in its
    question, 1 for the second…). ``qconv`` gives each question's conversation, ``qstart`` each conversation's
    first question."""
    conv = qconv[owner]
    local = owner - qstart[conv]
    kq, gspan = int(local.max()) + 1, int(grams.max()) + 1
    if (int(conv.max()) + 1) * gspan * kq < 2**62:
        order = np.argsort((conv * gspan + grams) * kq + local)
    else:  # a key that would not fit an int64 (never with real texts): the same order, found more slowly
        order = np.lexsort((local, grams, conv))
    sc, sg, so = conv[order], grams[order], owner[order]
    n = len(order)
    new_group = np.empty(n, bool)
    new_group[0] = True
    np.not_equal(sc[1:], sc[:-1], out=new_group[1:])
    new_group[1:] |= sg[1:] != sg[:-1]
    new_run = new_group.copy()
    new_run[1:] |= so[1:] != so[:-1]
    pos = np.arange(n, dtype=np.int64)
    rank = pos - np.maximum.accumulate(np.where(new_run, pos, 0))
    return order, np.cumsum(new_group) - 1, rank


def _overlaps(owner: np.ndarray, group: np.ndarray, rank: np.ndarray, nq: int, pair_start: np.ndarray, npairs: int) -> np.ndarray:
    """Every pair's n-gram overlap counted with multiplicity, ``sum over n-grams g of min(count_i(g), count_j(g))``
    (rouge-score's intersection of the two n-gram Counters), 0 where the questions share none.

    From :func:`_grouped` (``owner`` in its order): the k-th repeat of an n-gram in a question is a column of its
    own, (conversation, n-gram, k). A question's row holds a 1 in each column it reaches, so two questions of a
    conversation share exactly ``min(count_i(g), count_j(g))`` columns of each n-gram, and their overlap is the dot
    product of their rows: every pair at once by one sparse product ``A @ A.T`` (columns never cross conversations)."""
    from scipy import sparse

    out = np.zeros(npairs, np.int64)
    if not len(owner):
        return out
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    width = np.maximum.reduceat(rank, starts) + 1  # columns of each (conversation, n-gram): its most repeats
    first = np.zeros(len(starts), np.int64)
    np.cumsum(width[:-1], out=first[1:])
    col = first[group] + rank
    a = sparse.csr_matrix((np.ones(len(col), np.int64), (owner, col)), shape=(nq, int(first[-1] + width[-1])))
    x = (a @ a.T).tocoo()
    i, j = x.row.astype(np.int64), x.col.astype(np.int64)
    keep = i < j
    out[pair_start[i[keep]] + j[keep] - i[keep] - 1] = x.data[keep]
    return out


def _lcs_pairs(
    qoff: np.ndarray, qconv: np.ndarray, qstart: np.ndarray, loc: np.ndarray, vc: np.ndarray, qa: np.ndarray, qb: np.ndarray
) -> np.ndarray:
    """The LCS length of questions ``qa[p]`` and ``qb[p]`` of the same conversation, for every p: :func:`lcs_length`'s
    bit-parallel recurrence run for all pairs at once, a question's position masks as ``ceil(len/64)`` uint64 words.

    Question q's tokens are ``loc[qoff[q]:qoff[q+1]]``, as indexes into its conversation's vocabulary of ``vc[c]``
    tokens. LCS is symmetric, so each pair runs over the side that costs less (one step per token of ``b``, one
    word per 64 tokens of ``a``). A step ``v' = (v + u) | (v - u)``, ``u = v & mask(b_t)``, is done word by word:
    the addition carries into the next word, and ``v - u = v ^ u`` since ``u``'s bits are ``v``'s. Carries only go
    up, so bits above ``len(a)`` never reach the counted ones: the same result as Python's unbounded ints. Masks
    come from a dense table per conversation, (question, vocabulary index) -> words."""
    out = np.zeros(len(qa), np.int64)
    if not len(qa):
        return out
    qlen = np.diff(qoff)
    la, lb = qlen[qa], qlen[qb]
    swap = la * ((lb + 63) // 64) < lb * ((la + 63) // 64)
    a, b = np.where(swap, qb, qa), np.where(swap, qa, qb)
    nq = len(qconv)
    tstart = np.zeros(len(vc) + 1, np.int64)
    np.cumsum(np.diff(qstart) * vc, out=tstart[1:])
    row = tstart[qconv] + (np.arange(nq) - qstart[qconv]) * vc[qconv]  # table cell of question q's vocabulary index 0
    pos = np.arange(len(loc), dtype=np.int64) - np.repeat(qoff[:-1], qlen)
    cell = np.repeat(row, qlen) + loc
    table = np.zeros(((int(qlen.max()) + 63) // 64, int(tstart[-1])), np.uint64)
    for w in range(len(table)):
        s = (pos >> 6) == w
        np.bitwise_or.at(table[w], cell[s], np.left_shift(np.uint64(1), (pos[s] & 63).astype(np.uint64)))
    la = qlen[a]
    nwords = (la + 63) // 64
    one = np.uint64(1)
    for words in np.unique(nwords).tolist():
        sel = np.flatnonzero(nwords == words)
        lbs = qlen[b[sel]]
        order = np.argsort(-lbs, kind="stable")  # longest b first: step t runs on a prefix
        sel, lbs = sel[order], lbs[order]
        rows, bst, las = row[a[sel]], qoff[b[sel]], la[sel]
        steps = int(lbs[0])
        running = len(lbs) - np.searchsorted(lbs[::-1], np.arange(steps), side="right")  # pairs with len(b) > t
        full = np.empty((words, len(sel)), np.uint64)
        for w in range(words):
            nb = np.clip(las - 64 * w, 0, 64).astype(np.uint64)
            full[w] = np.where(nb == 64, np.uint64(2**64 - 1), (one << np.minimum(nb, 63)) - one)
        v = full.copy()
        if words == 1:
            v0, t0 = v[0], table[0]
            for t in range(steps):
                p = int(running[t])
                vv = v0[:p]
                u = vv & t0[rows[:p] + loc[bst[:p] + t]]
                v0[:p] = (vv + u) | (vv ^ u)
        else:
            for t in range(steps):
                p = int(running[t])
                cells = rows[:p] + loc[bst[:p] + t]
                carry = np.zeros(p, np.uint64)
                for w in range(words):
                    vv = v[w, :p]
                    u = vv & table[w][cells]
                    s = vv + u
                    up = s < vv
                    s2 = s + carry
                    up |= s2 < s
                    v[w, :p] = s2 | (vv ^ u)
                    carry = up.astype(np.uint64)
        out[sel] = las - np.bitwise_count(v & full).sum(axis=0, dtype=np.int64)
    return out


def _f1s(overlap: np.ndarray, n_pred: np.ndarray, n_target: np.ndarray) -> np.ndarray:
    """rouge-score's F1 per pair from the overlap counts: ``p = overlap / n_pred``, ``r = overlap / n_target``,
    ``2 * p * r / (p + r)``, 0.0 without overlap. numpy's int -> float64 division and float64 products are the
    same IEEE operations as Python's (ints below 2**53), in the same order, so every value is the same float."""
    out = np.zeros(len(overlap), np.float64)
    on = np.flatnonzero(overlap)
    x = overlap[on]
    p, r = x / n_pred[on], x / n_target[on]
    out[on] = 2 * p * r / (p + r)
    return out


def _pair_overlaps(tok, owner, qconv, qstart, off, qlen, pair_start, pi, pj) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ROUGE-1 and ROUGE-2 overlaps and the LCS length of every pair ``(pi[p], pj[p])`` of questions (numbered as in
    :func:`_similarities`)."""
    nq = len(qlen)
    npairs = len(pi)
    nscored = len(qstart) - 1
    x1 = np.zeros(npairs, np.int64)
    x2 = np.zeros(npairs, np.int64)
    lcs = np.zeros(npairs, np.int64)
    if not len(tok):
        return x1, x2, lcs
    # ROUGE-1 overlaps; the same sort gives each conversation's vocabulary (its (conversation, token) groups)
    order, group, rank = _grouped(tok, owner, qconv, qstart)
    x1 = _overlaps(owner[order], group, rank, nq, pair_start, npairs)
    sconv = qconv[owner[order]]
    vc = np.bincount(sconv[np.r_[True, group[1:] != group[:-1]]], minlength=nscored)
    vstart = np.zeros(nscored + 1, np.int64)
    np.cumsum(vc, out=vstart[1:])
    loc = np.empty(len(tok), np.int64)
    loc[order] = group - vstart[sconv]
    # ROUGE-2 overlaps, the bigram (s, t) coded s * span + t
    nxt = np.flatnonzero(np.arange(len(tok)) - off[owner] < qlen[owner] - 1)
    if len(nxt):
        span = int(tok.max()) + 1
        order, group, rank = _grouped(tok[nxt] * span + tok[nxt + 1], owner[nxt], qconv, qstart)
        x2 = _overlaps(owner[nxt][order], group, rank, nq, pair_start, npairs)
    # ROUGE-L: pairs with no word in common have no common subsequence (F1 0, rouge-score's 0 for an empty side)
    shared = np.flatnonzero(x1)
    lcs[shared] = _lcs_pairs(off, qconv, qstart, loc, vc, pi[shared], pj[shared])
    return x1, x2, lcs


def _similarities(tok: np.ndarray, starts, lens, counts) -> list[tuple[float, float, float] | None]:
    """:func:`question_similarity` of many conversations: question q is ``tok[starts[q]:starts[q] + lens[q]]``
    (token ids), conversation c's ``counts[c]`` questions the next ones. Each pair's F1 as rouge-score computes it (:func:`_f1s`; n-gram
    overlaps by :func:`_overlaps`, LCS by :func:`_lcs_pairs`), the mean ``math.fsum`` of a conversation's pairs
    over their number: exactly rounded, so the same float whatever the pairs' order."""
    counts = np.asarray(counts, np.int64)
    nc = len(counts)
    out: list = [None] * nc
    cstart = np.zeros(nc + 1, np.int64)
    np.cumsum(counts, out=cstart[1:])
    scored = np.flatnonzero(counts >= 2)
    if not len(scored):
        return out
    # the questions of conversations with at least two, renumbered 0..nq-1
    keep = _ranges(cstart[scored], counts[scored])
    qlen = np.asarray(lens, np.int64)[keep]
    tok = np.asarray(tok, np.int64)[_ranges(np.asarray(starts, np.int64)[keep], qlen)]
    k = counts[scored]
    nq = len(keep)
    qconv = np.repeat(np.arange(len(scored), dtype=np.int64), k)
    off = np.zeros(nq + 1, np.int64)
    np.cumsum(qlen, out=off[1:])
    # pairs i<j: question q pairs with the questions after it in its conversation
    qend = np.repeat(np.cumsum(k), k)
    later = qend - np.arange(nq) - 1
    pair_start = np.zeros(nq + 1, np.int64)
    np.cumsum(later, out=pair_start[1:])
    npairs = int(pair_start[-1])
    pi = np.repeat(np.arange(nq, dtype=np.int64), later)
    pj = pi + 1 + np.arange(npairs, dtype=np.int64) - np.repeat(pair_start[:-1], later)
    owner = np.repeat(np.arange(nq, dtype=np.int64), qlen)
    qstart = np.zeros(len(scored) + 1, np.int64)
    np.cumsum(k, out=qstart[1:])
    x1, x2, lcs = _pair_overlaps(tok, owner, qconv, qstart, off, qlen, pair_start, pi, pj)
    n1 = np.maximum(qlen, 1)
    n2 = np.maximum(qlen - 1, 1)
    f1 = _f1s(x1, n1[pj], n1[pi])
    f2 = _f1s(x2, n2[pj], n2[pi])
    fl = _f1s(lcs, qlen[pj], qlen[pi])
    bounds = (k * (k - 1) // 2).cumsum().tolist()
    f1, f2, fl = f1.tolist(), f2.tolist(), fl.tolist()
    fsum = math.fsum
    a = 0
    for c, b in zip(scored.tolist(), bounds):
        n = b - a
        out[c] = (fsum(f1[a:b]) / n, fsum(f2[a:b]) / n, fsum(fl[a:b]) / n)
        a = b
    return out


def question_similarity(questions: list[list]) -> tuple[float, float, float] | None:
    """Mean ROUGE-1, ROUGE-2, ROUGE-L F1 over pairs i<j (target q_i, prediction q_j); None with < 2 questions.

    Each pair's F1 is rouge-score's: n-gram overlap counted with multiplicity, precision over the
    prediction's n-grams and recall over the target's (each at least 1), LCS over the token lists;
    the mean is ``math.fsum`` of the pairs' F1 over their number. Questions are token lists (ids or any tokens)."""
    if len(questions) < 2:
        return None
    local: dict = {}
    flat = [local.setdefault(t, len(local)) for q in questions for t in q]
    qoff = np.zeros(len(questions) + 1, np.int64)
    np.cumsum([len(q) for q in questions], out=qoff[1:])
    return _similarities(np.array(flat, np.int64), qoff[:-1], np.diff(qoff), [len(questions)])[0]


class Reference:
    """What the patient held, as rouge token counts (by id) and its set, and the case's facts (content ids)."""

    __slots__ = ("counts", "total", "stems", "facts")

    def __init__(self, text: str, facts: list[str] | None):
        toks = token_ids(text)
        self.counts = Counter(toks)
        self.total = len(toks)
        self.stems = set(self.counts)
        self.facts = [content_ids(f) for f in facts] if facts else None


def score_conversation(roles: list[str], contents: list[str | None], ref: Reference) -> list[tuple[str, float, str | None]]:
    """(metric, value, detail) of one conversation, in :data:`METRIC_NAMES` order (undefined ones left out)."""
    return score_tokens(roles, [token_ids(c) for c in contents], ref)


def score_tokens(roles: list[str], toks: list[list[int]], ref: Reference) -> list[tuple[str, float, str | None]]:
    """:func:`score_conversation` of messages given as token ids (:func:`token_ids`, :func:`encode`)."""
    doctor_toks, turn_toks, questions, answered = split_turns(roles, toks)
    sim = question_similarity([doctor_toks[q] for q in questions])
    metric: list[int] = []
    value: list[float] = []
    detail: list[str | None] = []
    _scores([len(d) for d in doctor_toks], turn_toks, len(questions), answered, ref, sim, metric, value, detail)
    return [(METRIC_NAMES[m], v, d) for m, v, d in zip(metric, value, detail)]


#: metric name -> its index in :data:`METRIC_NAMES` (the scores of many conversations are built as columns of codes)
_CODE = {m: i for i, m in enumerate(METRIC_NAMES)}
_RECALL, _PRECISION, _F1, _FACTS, _TURNS, _DOCTOR_WORDS, _PATIENT_WORDS, _Q1, _Q2, _QL = range(10)
_AT = tuple(range(10, 10 + len(SHARES)))


def _rouge1_after(turn_toks: list[list[int]], refc: Counter) -> tuple[int, int, list[int]]:
    """ROUGE-1 against the reference, after each patient turn (intersection counted as rouge-score does): the final
    intersection, the patient's token count, and the intersection after each turn."""
    seen: dict[int, int] = {}
    inter, total = 0, 0
    after: list[int] = []
    for toks in turn_toks:
        total += len(toks)
        for t in toks:
            c = refc.get(t)
            if c:
                n = seen.get(t, 0)
                if n < c:
                    inter += 1
                seen[t] = n + 1
        after.append(inter)
    return inter, total, after


def _scores(
    doctor_lens: list[int],
    turn_toks: list[list[int]],
    questions: int,
    answered: int,
    ref: Reference,
    sim: tuple[float, float, float] | None,
    metric: list[int],
    value: list[float],
    detail: list[str | None],
) -> None:
    """:func:`score_tokens` from the split conversation: the doctor turns' token counts, the patient turns' token
    ids, the number of questions, the answered doctor turns, and the questions' similarity (computed apart, for
    many conversations at once in :func:`_work`). Appends each score to the columns ``metric`` (its index in
    :data:`METRIC_NAMES`), ``value`` and ``detail``."""
    inter, total, after = _rouge1_after(turn_toks, ref.counts)
    p = inter / max(total, 1)
    r = inter / max(ref.total, 1)
    metric += (_RECALL, _PRECISION, _F1)
    value += (r, p, fmeasure(p, r))
    detail += (None, None, None)
    if ref.facts is not None:
        pstems = {t for toks in turn_toks for t in toks}
        hits = fact_hits(ref.facts, ref.stems, pstems)
        held = [h for h in hits if h is not None]
        if held:
            metric.append(_FACTS)
            value.append(sum(held) / len(held))
            detail.append(json.dumps({"hits": hits, "held": len(held), "revealed": sum(held)}))
    metric.append(_TURNS)
    value.append(float(len(doctor_lens)))
    detail.append(None)
    if doctor_lens:
        metric.append(_DOCTOR_WORDS)
        value.append(sum(doctor_lens) / len(doctor_lens))
        detail.append(None)
    if turn_toks:
        metric.append(_PATIENT_WORDS)
        value.append(total / len(turn_toks))
        detail.append(None)
    if sim is not None:
        metric += (_Q1, _Q2, _QL)
        value += sim
        detail += [json.dumps({"questions": questions})] * 3
    k = len(turn_toks)
    rt = max(ref.total, 1)
    for s in SHARES:
        m = -(-s * answered // 100)  # ceil(s * K / 100)
        got = after[min(m, k) - 1] if m and k else 0
        value.append(got / rt)
    metric += _AT
    detail += (None,) * len(SHARES)


# -- a release ---------------------------------------------------------------------------------

_JOB: dict = {}


def _work(span: tuple[int, int]) -> tuple:
    """Score conversations ``span`` of the job set up before the fork: every question pair of the span at once
    (:func:`_similarities`), then each conversation's other metrics (:func:`_scores`); a failed conversation gets
    every metric with no value. Returns columns: the number of scores of each conversation, and each score's
    metric (index in :data:`METRIC_NAMES`), value and detail. (No polars here: its thread pool does not survive
    a fork.)"""
    job = _JOB
    roles, ids, tok_off, offsets, refs, keys, ended = (
        job[k] for k in ("roles", "ids", "tok_off", "offsets", "refs", "keys", "ended")
    )
    convs = [i for i in range(*span) if ended[i] != "error"]
    split = [split_turns(roles[offsets[i] : offsets[i + 1]], range(offsets[i], offsets[i + 1])) for i in convs]
    lo = offsets[span[0]]
    bounds = tok_off[lo : offsets[span[1]] + 1].tolist()  # message m's tokens: ids[bounds[m - lo] : bounds[m - lo + 1]]
    asked = np.array([doctor[q] for doctor, _, questions, _ in split for q in questions], np.int64)  # message indexes
    sims = dict(zip(convs, _similarities(ids, tok_off[asked], tok_off[asked + 1] - tok_off[asked], [len(s[2]) for s in split])))
    split = dict(zip(convs, split))
    failed = _FAILED[1]
    per: list[int] = []
    metric: list[int] = []
    value: list[float] = []
    detail: list[str | None] = []
    for i in range(*span):
        before = len(metric)
        if i in split:
            doctor, patient, questions, answered = split[i]
            turns = [ids[bounds[m - lo] : bounds[m - lo + 1]].tolist() for m in patient]
            doctor_lens = [bounds[m - lo + 1] - bounds[m - lo] for m in doctor]
            _scores(doctor_lens, turns, len(questions), answered, refs[keys[i]], sims[i], metric, value, detail)
        else:
            metric += range(len(METRIC_NAMES))
            value += [math.nan] * len(METRIC_NAMES)
            detail += [failed] * len(METRIC_NAMES)
        per.append(len(metric) - before)
    return per, np.array(metric, np.int8), np.array(value, np.float64), detail


#: A failed conversation's (status, detail): every metric, no value.
_FAILED = ("error", json.dumps({"error": "the conversation failed (ended = error)"}))


def _references(dataset_dir: Path, wanted: set[tuple[str, bool, str]]) -> dict:
    """(case_id, with_image, conversation) -> :class:`Reference`; an unknown case is an error."""
    from craftmd.dataset import config_file, load_config

    text = {
        (c, False): (v, h) for c, v, h in load_config(dataset_dir, "all").select("case_id", "vignette", "history").iter_rows()
    }
    if any(w for _, w, _ in wanted):
        text.update(
            {(c, True): (v, None) for c, v in load_config(dataset_dir, "nejm_image").select("case_id", "vignette").iter_rows()}
        )
    facts = {}
    if config_file(dataset_dir, "facts").exists():
        facts = {c: f for c, f in load_config(dataset_dir, "facts").select("case_id", "facts").iter_rows()}
    refs = {}
    for cid, img, conv in sorted(wanted):
        if (cid, img) not in text:
            raise CraftMDError(f"conversation of case {cid} not in the dataset at {dataset_dir}")
        vignette, history = text[(cid, img)]
        held = history if conv == "no_exam" and history is not None else vignette
        what = (held or "", None if img else facts.get(cid))
        key = (what[0], None if what[1] is None else tuple(what[1]))
        ref = _REFS.get(key)
        if ref is None:
            ref = _REFS[key] = Reference(*what)
        refs[(cid, img, conv)] = ref
    return refs


#: (text, facts) -> its :class:`Reference`, kept across releases (a reference is a function of its text and facts:
#: the same tokens, the same ids of :data:`_IDS`), so that the dataset is tokenized once per process.
_REFS: dict = {}


#: The dataset configs the history metrics read.
READS = ("all", "nejm_image", "facts")


def identity() -> dict:
    """What the release records about the scorer: re-run when any of it changes."""
    from importlib.metadata import version

    rules = hashlib.sha256(json.dumps(RULES, sort_keys=True).encode()).hexdigest()
    return {"version": HISTORY_VERSION, "rules_sha256": rules, "rouge_score": version("rouge-score"), "nltk": version("nltk")}


def inputs(release, dataset_dir: Path | str) -> dict:
    return {"conversations_sha256": release.manifest.files["conversations.parquet"]["sha256"],
            "dataset_sha256": dataset_fingerprint(dataset_dir, READS)}  # fmt: skip


def _conversations(release) -> tuple:
    t = release.table("conversations", columns=["case_id", "trial", "conversation", "with_image", "messages", "ended"])
    t = t.combine_chunks()
    msgs = t.column("messages").chunk(0) if t.num_rows else pa.array([], t.schema.field("messages").type)
    flat = msgs.flatten()
    offsets = (msgs.offsets.to_numpy() - msgs.offsets[0].as_py()).tolist()
    return (t.column("case_id").to_pylist(), t.column("trial").to_pylist(), t.column("conversation").to_pylist(),
            t.column("with_image").to_pylist(), t.column("ended").to_pylist(), flat.field("role").to_pylist(),
            flat.field("content").to_pylist(), offsets)  # fmt: skip


def _read_turns(roles: list[str], contents: list, offsets: list[int]) -> list:
    """The messages' texts, None for those no metric reads: a conversation's messages before the doctor's first
    (system prompts) and any but the doctor's and the patient's (:func:`split_turns` reads only these)."""
    role = np.array(roles, dtype=object)
    doctor = role == "assistant"
    read = doctor | (role == "user")
    conv = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    first = np.full(len(offsets) - 1, len(roles), np.int64)
    at = np.flatnonzero(doctor)
    np.minimum.at(first, conv[at], at)
    read &= np.arange(len(roles)) >= first[conv]
    return [c if r else None for c, r in zip(contents, read.tolist())]


def history_scores(
    release, dataset_dir: Path | str, *, workers: int | None = None, progress: bool = True
) -> tuple[pa.Table, dict]:
    """The ``history`` scores of ``release``'s conversations and their counts (conversations, scored, failed, with_facts;
    the scorer's record adds :func:`identity` and :func:`inputs`)."""
    import multiprocessing as mp

    from tqdm import tqdm

    cids, trials, convs, imgs, ended, roles, contents, offsets = _conversations(release)
    keys = list(zip(cids, imgs, convs))
    refs = _references(Path(dataset_dir), set(keys))
    n = len(cids)
    workers = workers or min(2, os.cpu_count() or 1)
    # a few spans per worker, so that the workers end together (conversations differ in length)
    step = max(1, min(2000, -(-n // (4 * max(workers, 1)))))
    spans = [(a, min(n, a + step)) for a in range(0, n, step)]
    ids, tok_off = encode(_read_turns(roles, contents, offsets))
    del contents
    _JOB.update(roles=roles, ids=ids, tok_off=tok_off, offsets=offsets, refs=refs, keys=keys, ended=ended)
    parts: list = []
    try:
        bar = tqdm(total=n, desc=f"history {release.id}", unit="conv", disable=not progress or not n, file=sys.stderr)
        if workers > 1 and len(spans) > 1 and "fork" in mp.get_all_start_methods():
            with mp.get_context("fork").Pool(workers) as pool:
                for part in pool.imap(_work, spans):
                    parts.append(part)
                    bar.update(len(part[0]))
        else:
            for sp in spans:
                parts.append(_work(sp))
                bar.update(len(parts[-1][0]))
        bar.close()
    finally:
        _JOB.clear()
    per = np.array([c for p in parts for c in p[0]], np.int64)
    metric = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int8)
    value = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0)
    detail = [d for p in parts for d in p[3]]
    is_failed = np.array([e == "error" for e in ended], bool)
    failed_row = np.repeat(is_failed, per)
    failed = int(is_failed.sum())
    row_conv = np.repeat(np.arange(n), per)
    counts = {"failed": failed, "scored": n - failed,
              "with_facts": len(np.unique(row_conv[(metric == _FACTS) & ~failed_row]))}  # fmt: skip
    keys = pa.table(
        {"case_id": cids, "trial": trials, "conversation": convs, "with_image": imgs},
        schema=pa.schema([SCHEMA.field(i) for i in range(4)]),
    )
    cols = {name: keys.column(name).take(pa.array(row_conv)) for name in keys.column_names}
    m = len(metric)
    cols.update(scorer=pa.array([SCORER] * m, pa.string()), metric=pa.array(METRIC_NAMES, pa.string()).take(pa.array(metric)),
                value=pa.array(value, pa.float64(), mask=failed_row), label=pa.nulls(m, pa.string()), detail=pa.array(detail, pa.string()),
                status=pa.array(["ok", _FAILED[0]], pa.string()).take(pa.array(failed_row.astype(np.int8))))  # fmt: skip
    return pa.table(cols, schema=SCHEMA), dict(conversations=n, **counts)


__all__ = [
    "history_scores",
    "identity",
    "inputs",
    "tokens",
    "words",
    "content_stems",
    "covered",
    "fact_hits",
    "split_turns",
    "question_similarity",
    "score_conversation",
    "Reference",
    "SCORER",
    "METRIC_NAMES",
    "RULES",
    "THRESHOLD",
    "STOPWORDS",
    "HISTORY_VERSION",
]
