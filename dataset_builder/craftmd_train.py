"""CRAFT-MD training cases: the ``craftmd_train`` config (split ``train``), for training a doctor on CRAFT-MD's task.

The candidates are those of the golden consultations (:mod:`craftmd.dataset_builder.golden`): MediQ's MedQA lines
(``data/all_dev_good.jsonl``, CC BY 4.0, Li et al. 2024) and, with ``craftmd build --medqa-train FILE``, the lines
of a MedQA-format file. Each is posed as a CRAFT-MD vignette by the functions the benchmark's own MedQA cases go
through (:func:`craftmd.dataset_builder.schema.text_sample` and :func:`~craftmd.dataset_builder.schema.text_row`:
the question sentence apart from the vignette, the question as CRAFT-MD asks it, the history/physical-exam split,
the task type, ``content_sha256``), so the rows have the columns of the benchmark's text configs (``medqa_usmle``).

Kept: the diagnosis vignettes (the MedQA rule of the benchmark, :func:`craftmd.dataset_builder.medqa.select`) that
are no benchmark case, by the golden consultations' decontamination (:func:`craftmd.dataset_builder.golden.decontaminate`:
the same rule and thresholds against the same benchmark texts); each dropped candidate is listed in the build report
with its nearest case and both scores. Ids are ``train_mediq_<MediQ id>`` and ``train_medqa_<line>``
(:data:`PREFIX`): no benchmark id starts with it, and the build refuses any id that collides. No specialty
(MedQA lines carry none), ``single_dx`` null, ``paper_answer`` the answer itself, as for ``craftmd build --medqa``.
"""

from __future__ import annotations

from craftmd import CraftMDError
from craftmd.dataset_builder import golden as G
from craftmd.dataset_builder import medqa as M
from craftmd.dataset_builder import transform as T
from craftmd.dataset_builder.schema import text_row, text_sample
from craftmd.release import natural_key

CONFIG = "craftmd_train"
SPLIT = G.SPLIT
PREFIX = "train_"
_IDS = {"mediq": "mediq", "medqa-train": "medqa"}


def case_id(c: G.Candidate) -> str:
    """``train_mediq_<id>`` or ``train_medqa_<line>``."""
    return f"{PREFIX}{_IDS[c.source]}_{c.case.partition(':')[2]}"


def sample(c: G.Candidate):
    """A candidate as a CRAFT-MD text case, by the benchmark's own transforms."""
    choices = tuple(c.options)
    return text_sample(case_id(c), "medqa_usmle", None, c.vignette, T.clean_question(c.question), choices, choices.index(c.answer),
                       c.answer, None)  # fmt: skip


def build_rows(candidates: list[G.Candidate], benchmark: dict[str, str]) -> tuple[list[dict], dict]:
    """The config's rows (natural id order, MediQ's first) and the build report's account of them."""
    clean, dropped = G.decontaminate(candidates, benchmark)
    reasons: dict[str, dict[str, int]] = {}
    samples = []
    for c in clean:
        v = M.select(f"{c.vignette} {c.question}")
        by = reasons.setdefault(c.source, {})
        by[v.reason] = by.get(v.reason, 0) + 1
        if v.keep:
            samples.append(sample(c))
    clash = sorted({s.case_id for s in samples} & set(benchmark))
    if clash:
        raise CraftMDError(f"{CONFIG}: training id(s) {', '.join(clash[:5])} are benchmark ids")
    src = {"mediq": 0, "medqa": 1}
    samples.sort(key=lambda s: (src[s.case_id[len(PREFIX) :].split("_")[0]], natural_key(s.case_id)))
    rows = [text_row(s) for s in samples]
    report = {"candidates": len(candidates), "rows": len(rows), "reasons": {s: dict(sorted(r.items())) for s, r in sorted(reasons.items())},
              "dropped": dropped, "decontamination": G.DECONTAMINATION_DOC}  # fmt: skip
    return rows, report


__all__ = ["CONFIG", "SPLIT", "PREFIX", "case_id", "sample", "build_rows"]
