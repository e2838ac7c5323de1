"""The offline FRQ grader's measured agreement, as recorded, and the held-out rule it was measured under.

The agreement study (:mod:`craftmd.analysis.agreement.graders`) measures how far the offline grader
agrees with the recorded GPT-4 grader-AI and with the dermatologists; ``bench/bench_grading.py
--write-record`` stores its overall figures in :data:`AGREEMENT_RECORD`, tied to the synonym table and
rules they were measured with. Scoring reads the record (to say how far a grade can be trusted); the
synonym mining keeps to the training cases of :func:`held_out`.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from pathlib import Path

from craftmd.scoring.offline import SynonymTable, rules_sha256

AGREEMENT_RECORD = Path(__file__).resolve().parent / "data" / "offline_agreement.json"


def held_out(case_id: str, source: str | None) -> bool:
    """The fixed held-out rule: derm_private cases, and cases whose id's number is divisible by 5.

    Ids are opaque; the rule reads the last run of digits in the id (``case_205`` -> 205). An id
    without digits is held out when the first byte of its sha256 is divisible by 5."""
    digits = re.findall(r"\d+", case_id)
    n = int(digits[-1]) if digits else hashlib.sha256(case_id.encode()).digest()[0]
    return source == "derm_private" or n % 5 == 0


@cache
def measured_agreement() -> dict[str, dict]:
    """Each grader's measured agreement with people (the dermatologists' grader validation), where measured."""
    try:
        rec = json.loads(AGREEMENT_RECORD.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    out = {}
    for g, d in (rec.get("dermatologists") or {}).items():
        if isinstance(d, dict) and d.get("agreement") is not None:
            out[g] = {"agreement": float(d["agreement"]), "reference": "dermatologists", "trials": d.get("trials")}
    return out


def recorded_agreement() -> dict | None:
    """The recorded measurement for the current table and rules (None when either changed since, or none was recorded)."""
    try:
        rec = json.loads(AGREEMENT_RECORD.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    current = (SynonymTable.load().sha256, rules_sha256())
    return rec if (rec.get("table_sha256"), rec.get("rules_sha256")) == current else None


__all__ = ["AGREEMENT_RECORD", "held_out", "measured_agreement", "recorded_agreement"]
