"""The task's scorers: the moderator's verdict (the task's score and its environment's reward) and the package's offline
grader beside it, both of the ``osce`` table's diagnoses, one ``correct`` score per conversation.

* ``agentclinic-moderator``: the moderator's recorded Yes/No (1/0). A doctor that gave no diagnosis within its budget,
  or an empty one, is not correct (0: the doctor's own failing); a conversation whose call failed, or a moderator that
  failed or said neither Yes nor No, gives no score (status error, the reason in ``detail``), never a verdict.
* ``agentclinic-offline``: :mod:`craftmd.scoring.offline` (synonym table and matching rules, no model) of the same
  diagnosis against the case's reference diagnosis, read from the pinned source (``--dataset``: the folder holding it)
  and checked against the one the release recorded; a case file of one's own: the release's.
"""

from __future__ import annotations

import json

import pyarrow as pa

from craftmd import CraftMDError
from craftmd.release import SCORE_COLUMNS
from craftmd.scoring.scorers import Scorer, ScorerResult, register_scorer

DATASET = "agentclinic"
#: A conversation's scores: the base columns with the variant key ``conversation`` after the trial.
SCHEMA = pa.schema(
    [
        SCORE_COLUMNS.field("case_id"),
        SCORE_COLUMNS.field("trial"),
        ("conversation", pa.string()),
        *[f for f in SCORE_COLUMNS if f.name not in ("case_id", "trial")],
    ]
)
FAILED = ("refusal", "error")


def _row(r: dict, scorer: str, value: float | None, label: str | None, detail: dict) -> dict:
    return {"case_id": r["case_id"], "trial": r["trial"], "conversation": "osce", "scorer": scorer, "metric": "correct",
            "value": value, "label": label, "detail": json.dumps(detail, ensure_ascii=False, sort_keys=True),
            "status": "error" if value is None else "ok"}  # fmt: skip


def no_diagnosis(r: dict) -> dict | None:
    """The detail of a conversation that has no diagnosis to grade: a failed one (no score) or one that ended without
    (not correct); None when it has one."""
    if r["ended"] in FAILED:
        return {"error": f"the conversation failed: {r['error'] or r['ended']}"}
    if r["ended"] == "out_of_budget":
        return {"reason": "no diagnosis within the budget"}
    if not r["diagnosis"]:
        return {"reason": "an empty diagnosis"}
    return None


class OsceScorer(Scorer):
    """A scorer of the ``osce`` table's conversations."""

    unit = "conversation"
    datasets = (DATASET,)
    metrics = ("correct",)

    def applies(self, release):
        why = super().applies(release)
        return why if why is not None or release.has("osce") else "no osce.parquet"

    def inputs(self, release, ctx) -> dict:
        return {"osce_sha256": release.manifest.files["osce.parquet"]["sha256"]}

    def grade(self, r: dict, ctx, keys) -> tuple[float | None, str | None, dict]:
        raise NotImplementedError

    def keys(self, release, ctx, rows: list[dict]):
        return None

    def run(self, release, ctx) -> ScorerResult:
        rows = release.table("osce").to_pylist()
        keys = self.keys(release, ctx, rows)
        out, counts = [], {"graded": 0, "failed": 0}
        for r in rows:
            detail = no_diagnosis(r)
            if detail is not None:
                value, label = (None if r["ended"] in FAILED else 0.0), None
            else:
                value, label, detail = self.grade(r, ctx, keys)
            out.append(_row(r, self.name, value, label, detail))
            counts["graded" if value is not None else "failed"] += 1
        table = pa.Table.from_pylist(out, schema=SCHEMA)
        return ScorerResult(table, {self.name: dict(self.record(), **counts, inputs=self.inputs(release, ctx))})


class Moderator(OsceScorer):
    name = "agentclinic-moderator"
    about = (
        "AgentClinic's moderator: its recorded Yes/No on whether the doctor's diagnosis names the case's (no diagnosis "
        "within the budget: not correct; a failed call: no score)"
    )

    def identity(self) -> dict:
        return {
            "rule": "the moderator's recorded verdict; no or an empty diagnosis: 0; a failed call or reply: no score",
            "version": 1,
        }  # (the verdict is read from the reply at generation: protocol.verdict_of, part of the protocol's version)

    def grade(self, r, ctx, keys):
        if r["moderator_status"] != "ok":
            return None, r["diagnosis"], {"error": r["error"] or f"the moderator's verdict is {r['moderator_status']}"}
        return float(r["moderator_verdict"] == "yes"), r["diagnosis"], {"moderator": r["moderator_reply"]}


class Offline(OsceScorer):
    name = "agentclinic-offline"
    about = "the package's offline FRQ grader (synonym table and matching rules, no model) of AgentClinic's diagnoses"

    def identity(self) -> dict:
        from craftmd.scoring.offline import default_grader

        return {**default_grader().version, "keys": "the pinned source's reference diagnoses (a case file's: the release's)"}

    def inputs(self, release, ctx) -> dict:
        out = super().inputs(release, ctx)
        sets = sorted(set(release.table("osce", columns=["case_set"]).column("case_set").to_pylist()))
        from .cases import CASE_SETS, COMMIT, PIN

        if any(s in CASE_SETS for s in sets):
            from craftmd.source import load_pin

            pin = load_pin(COMMIT, path=PIN)
            out["keys"] = {s: pin[CASE_SETS[s][0]] for s in sets if s in CASE_SETS}
        return out

    def keys(self, release, ctx, rows):
        """case id -> its reference diagnosis: the pinned source's, each checked against the one the release recorded."""
        from .cases import CASE_SETS, load_cases

        out = {}
        for case_set in sorted({r["case_set"] for r in rows if r["case_set"] in CASE_SETS}):
            cases, _ = load_cases(ctx.dataset(self.name), case_set)
            out.update({c.case_id: c.answer for c in cases})
        for r in rows:
            if r["case_set"] in CASE_SETS:
                if r["case_id"] not in out:
                    raise CraftMDError(f"case {r['case_id']} is not a case of AgentClinic's {r['case_set']} set")
                if r["reference"] != out[r["case_id"]]:
                    raise CraftMDError(f"case {r['case_id']}: the release's reference diagnosis is not the pinned source's")
            else:
                out[r["case_id"]] = r["reference"]
        return out

    def grade(self, r, ctx, keys):
        from craftmd.scoring.offline import default_grader

        g = default_grader().grade(r["diagnosis"], keys[r["case_id"]])
        return float(g.correct), g.resolved, {"resolved_kind": g.resolved_kind, "grader": json.loads(g.detail or "{}")}


register_scorer(Moderator.name, Moderator)
register_scorer(Offline.name, Offline)

__all__ = ["Moderator", "Offline", "SCHEMA", "no_diagnosis"]
