"""The order a multiple-choice question shows its options in: CRAFT-MD's ``-T answer_order`` (declared in its task,
:mod:`craftmd.tasks.diagnosis`; here, on the shared ground, because its protocol and the MCQ rules both read it).

``upstream`` (the default) keeps the order of every published run: the case's four choices as upstream's CSV lists
them, the many-choice list as the dataset's ``diagnoses`` config holds it. ``shuffled`` gives each case, trial and
format its own permutation of its options, drawn from ``-T order_seed`` (default 0): position ``i`` goes where
the sha256 of ``"seed/case/trial/format/i"`` sorts, so the order depends on nothing but those (no Python or numpy
version, no run order). The answer that is right stays the same text, so the correct letter follows its choice; the
``strict`` rule reads a letter answer ("C") against the options in the order they were shown (:func:`release_order`
recovers it from the run record, where :class:`craftmd.release.Protocol` holds the option: a shuffled run is never
ranked with an upstream-order one as one protocol).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

AnswerOrder = Literal["upstream", "shuffled"]
#: The orders ``-T answer_order`` takes; the first is the default.
ANSWER_ORDERS: tuple[str, ...] = get_args(AnswerOrder)
#: The formats whose options it orders.
ORDERED_FORMATS = ("mcq4", "mcq_many")


def permutation(n: int, case_id: str, trial: int, fmt: str, seed: int) -> list[int]:
    """The positions of ``n`` options in the order a shuffled run shows them (``out[k]``: the option shown k-th)."""

    def key(i: int) -> bytes:
        return hashlib.sha256(f"{seed}/{case_id}/{trial}/{fmt}/{i}".encode()).digest()

    return sorted(range(n), key=key)


def shown(options: Sequence[str], case_id: str, trial: int, fmt: str, order: str, seed: int) -> list[str]:
    """``options`` in the order the question shows them (``order``: one of :data:`ANSWER_ORDERS`)."""
    if order == "upstream" or fmt not in ORDERED_FORMATS:
        return list(options)
    return [options[i] for i in permutation(len(options), case_id, trial, fmt, seed)]


def release_order(options: Mapping | None) -> tuple[str, int]:
    """(answer order, order seed) of a run's protocol options (:attr:`craftmd.release.Protocol.options`, absent where at
    their default: upstream's order, which every release written before the option showed, ingested or submitted)."""
    options = options or {}
    return str(options.get("answer_order", ANSWER_ORDERS[0])), int(options.get("order_seed", 0))


__all__ = ["AnswerOrder", "ANSWER_ORDERS", "ORDERED_FORMATS", "permutation", "shown", "release_order"]
