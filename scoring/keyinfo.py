"""The consultation-evaluation framework's information coverage against the key-value information: scorer ``keyinfo``.

ROUGE-1 of the doctor's turns against each case's keys and of the patient's against its values (the dataset's
``keyinfo`` config), and on consultation conversations the framework's turn and diversity measures; the definitions are
below the imports.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa

from craftmd.dataset import dataset_fingerprint
from craftmd.scoring.history import SCHEMA, Reference, fmeasure, split_turns, token_ids

# -- what it computes ------------------------------------------------------------
# For each conversation of a release whose case has key-value information (the dataset's ``keyinfo``
# config, status ``ok``; :mod:`craftmd.keyinfo`), six scores (variant keys
# ``conversation``, ``with_image``, as the ``history`` scorer; metrics in :mod:`craftmd.metrics`):
#
# * ``doctor_key_recall`` / ``_precision`` / ``_f1`` — ROUGE-1 of the doctor's turns joined (the
#   prediction) against the case's keys joined (the reference): how much of what there is to ask
#   the doctor asked about, and how much of what it said was on point;
# * ``patient_value_recall`` / ``_precision`` / ``_f1`` — ROUGE-1 of the patient's turns joined
#   against the case's values joined: how much of the information came out.
#
# On a conversation of the consultation task (it opens with the patient's initial request), the measures of the
# framework's Table 2, Table 3 and Figure 5 too, on the same turns:
#
# * ``doctor_turns`` — the doctor's messages (its questions and its closing turn); ``doctor_words_per_turn`` and
#   ``patient_words_per_turn`` — mean ROUGE tokens per doctor message and per patient reply (no score without one);
# * ``question_similarity_rouge1`` / ``_rouge2`` / ``_rougeL`` — the diversity of the doctor's queries (Eq. 4): the
#   mean ROUGE F1 over all pairs of its questions (a question: a doctor turn the patient answered), exactly as the
#   ``history`` scorer (:func:`craftmd.scoring.history.question_similarity`); none with fewer than two questions;
# * ``doctor_key_f1_at_<p>`` / ``patient_value_f1_at_<p>`` for p in 20, 40, 60, 80, 100 — the turn analysis: the
#   F1 of the doctor's questions and of the patient's answers of the first ⌈p·K/100⌉ of the K rounds (as the
#   consultation task's ``<kind>_<p>`` settings cut them; the closing turn is not a round).
#
# ROUGE-1 is computed exactly as ``rouge-score``'s ``RougeScorer(["rouge1"], use_stemmer=True)``
# with the ``history`` scorer's tokens (:func:`craftmd.scoring.history.token_ids`) and F-measure.
# Which turns count (:data:`RULES`): in a CRAFT-MD conversation, the doctor's turns after its fixed
# opening line and the patient's replies (:func:`craftmd.scoring.history.split_turns`); in a
# conversation that opens with the patient's initial request (the kinds its task declares patient-led,
# :attr:`craftmd.tasks.Task.patient_led`: the consultation task's), every doctor turn and the patient's replies
# after that fixed first message. Image conversations and cases without key-value information get
# no scores (counted in the record as ``no_keyinfo``); a failed conversation gets every score with
# status ``error``. The record holds the rules' hash, the rouge-score and nltk versions, and the
# conversations' and the ``keyinfo`` config's hashes.

SCORER = "keyinfo"
VERSION = 2
RULES = {
    "doctor": "rouge1(target=keys joined by newlines, prediction=doctor turns joined by newlines)",
    "patient": "rouge1(target=values joined by newlines, prediction=patient turns joined by newlines)",
    "rouge": "rouge-score RougeScorer(['rouge1'], use_stemmer=True): overlap counted with multiplicity, precision over the "
    "prediction's tokens, recall over the target's (each at least 1)",
    "craftmd_turns": "doctor: assistant messages after the first (the opening line); patient: user messages after it",
    "patient_led_turns": "doctor: every assistant message; patient: user messages after the first (the initial request)",
    "skipped": "image conversations and cases without ok key-value information: no score",
    "failed": "ended = error -> every metric status error",
    "patient_led_measures": "doctor_turns: assistant messages; words per turn: mean rouge tokens of the doctor's messages and of "
    "the patient's replies after the initial request; questions: assistant messages the next user message "
    "answers; question_similarity as the history scorer; <who>_f1_at_<p>: rouge1 F1 of the first "
    "ceil(p*K/100) of the K rounds' questions (doctor) and answers (patient)",
}
METRIC_NAMES = tuple(f"{who}_{m}" for who in ("doctor_key", "patient_value") for m in ("recall", "precision", "f1"))
#: The shares of rounds of the turn analysis (the consultation task's).
SHARES = (20, 40, 60, 80, 100)
#: The measures of a consultation-task conversation beyond :data:`METRIC_NAMES`.
DIALOGUE_METRICS = (
    "doctor_turns",
    "doctor_words_per_turn",
    "patient_words_per_turn",
    "question_similarity_rouge1",
    "question_similarity_rouge2",
    "question_similarity_rougeL",
)
SHARE_METRICS = tuple(f"{who}_f1_at_{p}" for who in ("doctor_key", "patient_value") for p in SHARES)


def rouge1(reference: str, prediction: str) -> tuple[float, float, float]:
    """(precision, recall, F1) of ROUGE-1, as rouge-score with ``use_stemmer=True`` (target = ``reference``)."""
    ref = Reference(reference, None)
    pred = Counter(token_ids(prediction))
    inter = sum(min(n, ref.counts.get(t, 0)) for t, n in pred.items())
    p = inter / max(sum(pred.values()), 1)
    r = inter / max(ref.total, 1)
    return p, r, fmeasure(p, r)


def turns(patient_led: bool, roles: list[str], contents: list[str | None]) -> tuple[list[str], list[str]]:
    """(doctor turns, patient turns) that count, by :data:`RULES` (``patient_led``: the conversation opens with the
    patient's initial request, :attr:`craftmd.tasks.Task.patient_led`)."""
    if not patient_led:
        doctor, patient, _, _ = split_turns(roles, contents)
        return doctor, patient
    dialogue = [(r, c or "") for r, c in zip(roles, contents) if r in ("user", "assistant")]
    first = next((i for i, (r, _) in enumerate(dialogue) if r == "user"), len(dialogue))
    return [c for r, c in dialogue if r == "assistant"], [c for r, c in dialogue[first + 1 :] if r == "user"]


def rounds(roles: list[str], contents: list[str | None]) -> list[tuple[str, str]]:
    """(doctor question, patient answer) pairs after the patient's first message, in order."""
    d = [(r, c or "") for r, c in zip(roles, contents) if r in ("user", "assistant")]
    first = next((i for i, (r, _) in enumerate(d) if r == "user"), len(d))
    return [(d[i][1], d[i + 1][1]) for i in range(first + 1, len(d) - 1) if d[i][0] == "assistant" and d[i + 1][0] == "user"]


def dialogue_scores(roles: list[str], contents: list[str | None], keys: list[str], values: list[str]) -> list[tuple[str, float]]:
    """(metric, value) of :data:`DIALOGUE_METRICS` (those that exist) and :data:`SHARE_METRICS` of a consultation-task conversation."""
    from craftmd.scoring.history import question_similarity, token_ids

    doctor, patient = turns(True, roles, contents)
    out = [("doctor_turns", float(len(doctor)))]
    if doctor:
        out.append(("doctor_words_per_turn", sum(len(token_ids(t)) for t in doctor) / len(doctor)))
    if patient:
        out.append(("patient_words_per_turn", sum(len(token_ids(t)) for t in patient) / len(patient)))
    pairs = rounds(roles, contents)
    sim = question_similarity([token_ids(q) for q, _ in pairs])
    if sim is not None:
        out += list(zip(DIALOGUE_METRICS[3:], sim))
    keys_text, values_text = "\n".join(keys), "\n".join(values)
    for who, side in (("doctor_key", 0), ("patient_value", 1)):
        for p in SHARES:
            shown = pairs[: -(-p * len(pairs) // 100)]
            out.append(
                (f"{who}_f1_at_{p}", rouge1(keys_text if side == 0 else values_text, "\n".join(x[side] for x in shown))[2])
            )
    return out


def score_conversation(
    patient_led: bool, roles: list[str], contents: list[str | None], keys: list[str], values: list[str]
) -> list[tuple[str, float]]:
    """(metric, value) of one conversation, in :data:`METRIC_NAMES` order, then (on a patient-led conversation, one that
    opens with the patient's initial request: the consultation task's) :func:`dialogue_scores`."""
    doctor, patient = turns(patient_led, roles, contents)
    dp, dr, df = rouge1("\n".join(keys), "\n".join(doctor))
    pp, pr, pf = rouge1("\n".join(values), "\n".join(patient))
    out = list(zip(METRIC_NAMES, (dr, dp, df, pr, pp, pf)))
    return out + dialogue_scores(roles, contents, keys, values) if patient_led else out


def identity() -> dict:
    from importlib.metadata import version

    rules = hashlib.sha256(json.dumps(RULES, sort_keys=True).encode()).hexdigest()
    return {"version": VERSION, "rules_sha256": rules, "rouge_score": version("rouge-score"), "nltk": version("nltk")}


def inputs(release, dataset_dir: Path | str) -> dict:
    """What the scores are made from: the conversations file and the dataset's ``keyinfo`` config."""
    from craftmd.keyinfo import CONFIG

    return {"conversations_sha256": release.manifest.files["conversations.parquet"]["sha256"],
            "keyinfo_sha256": dataset_fingerprint(dataset_dir, (CONFIG,))}  # fmt: skip


def keyinfo_scores(release, dataset_dir: Path | str) -> tuple[pa.Table, dict]:
    """The ``keyinfo`` scores of ``release``'s conversations and their counts (conversations, scored, failed, no_keyinfo;
    the scorer's record adds :func:`identity` and :func:`inputs`)."""
    from craftmd.keyinfo import load_keyinfo

    info = load_keyinfo(dataset_dir)
    t = release.table("conversations", columns=["case_id", "trial", "conversation", "with_image", "messages", "ended"])
    cols: dict[str, list] = {f.name: [] for f in SCHEMA}
    counts = dict.fromkeys(("scored", "failed", "no_keyinfo"), 0)
    led = set(release.task.patient_led)  # the kinds that open with the patient's initial request
    for r in t.to_pylist():
        ki = None if r["with_image"] else info.get(r["case_id"])
        if ki is None:
            counts["no_keyinfo"] += 1
            continue
        if r["ended"] == "error":
            scores = [(m, None) for m in METRIC_NAMES + ((DIALOGUE_METRICS + SHARE_METRICS) if r["conversation"] in led else ())]
            detail = json.dumps({"error": "the conversation failed (ended = error)"})
            counts["failed"] += 1
        else:
            msgs = r["messages"] or []
            scores = score_conversation(
                r["conversation"] in led, [m["role"] for m in msgs], [m["content"] for m in msgs], ki.keys, ki.values
            )
            detail = None
            counts["scored"] += 1
        for metric, value in scores:
            for k in ("case_id", "trial", "conversation", "with_image"):
                cols[k].append(r[k])
            cols["scorer"].append(SCORER)
            cols["metric"].append(metric)
            cols["value"].append(value)
            cols["label"].append(None)
            cols["detail"].append(detail)
            cols["status"].append("error" if value is None else "ok")
    return pa.table(cols, schema=SCHEMA), dict(conversations=t.num_rows, **counts)


__all__ = [
    "keyinfo_scores",
    "inputs",
    "score_conversation",
    "dialogue_scores",
    "rounds",
    "rouge1",
    "turns",
    "identity",
    "SCORER",
    "METRIC_NAMES",
    "DIALOGUE_METRICS",
    "SHARE_METRICS",
    "SHARES",
    "RULES",
]
