"""The dataset's typed rows and their Hugging Face features, one place for both.

Every case is a :class:`craftmd.samples.Sample` (the package's one case record); the
builder writes text samples with :func:`text_row` and image samples with
:func:`image_row`, with the :data:`FEATURES` of their config, so
``datasets.load_dataset(DIR, CONFIG)`` reads back exactly these types.
"""

from __future__ import annotations

from datasets import Features, Image, List, Value

from craftmd.dataset_builder.transform import content_sha256, split_history_exam, task_type
from craftmd.release import natural_key
from craftmd.samples import Sample

TEXT_FEATURES = Features(
    {
        "case_id": Value("string"),
        "source": Value("string"),
        "specialty": Value("string"),
        "vignette": Value("string"),
        "question": Value("string"),
        "choices": List(Value("string")),
        "answer": Value("string"),
        "answer_index": Value("int64"),
        "paper_answer": Value("string"),
        "task_type": Value("string"),
        "history": Value("string"),
        "physical_exam": Value("string"),
        "single_dx": Value("bool"),
        "content_sha256": Value("string"),
    }
)
IMAGE_FEATURES = Features(
    {
        "case_id": Value("string"),
        "image": Image(),
        "vignette": Value("string"),
        "question": Value("string"),
        "answer": Value("string"),
        "choices": List(Value("string")),
        "specialty": Value("string"),
        "source": Value("string"),
    }
)
DIAGNOSIS_FEATURES = Features({"diagnosis": Value("string"), "count": Value("int64")})
#: MediQ's atomic facts of a CRAFT-MD case (:mod:`craftmd.dataset_builder.mediq`), one row per matched case.
FACTS_FEATURES = Features(
    {
        "case_id": Value("string"),
        "facts": List(Value("string")),
        "mediq_id": Value("int64"),
        "mediq_file": Value("string"),
        "match_rule": Value("string"),
    }
)

TEXT_CONFIGS = ("medqa_usmle", "derm_public", "derm_private", "all")
CONFIGS = TEXT_CONFIGS + ("nejm_image", "diagnoses", "facts")
FEATURES = {
    **{c: TEXT_FEATURES for c in TEXT_CONFIGS},
    "nejm_image": IMAGE_FEATURES,
    "diagnoses": DIAGNOSIS_FEATURES,
    "facts": FACTS_FEATURES,
}
#: Order of sources inside a config (the upstream CSV's order).
SOURCE_ORDER = ("derm_public", "derm_private", "medqa_usmle")


def text_sample(case_id: str, source: str, specialty: str | None, vignette: str, question: str, choices: tuple[str, ...],
                answer_index: int, paper_answer: str, single_dx: bool | None) -> Sample:
    """A text case as a :class:`~craftmd.samples.Sample`: the answer, the task type and the history/exam split derived here."""
    history, exam = split_history_exam(vignette)
    return Sample(
        case_id=case_id, source=source, specialty=specialty, vignette=vignette, question=question, choices=choices,
        answer=choices[answer_index], answer_index=answer_index, paper_answer=paper_answer, task_type=task_type(question),
        history=history, physical_exam=exam, single_dx=single_dx,
    )  # fmt: skip


def text_row(s: Sample) -> dict:
    """A text sample as a row of the text configs (:data:`TEXT_FEATURES`)."""
    d = {f: getattr(s, f) for f in TEXT_FEATURES if f != "content_sha256"}
    d["choices"] = list(s.choices)
    d["content_sha256"] = content_sha256(d)
    return d


def image_row(s: Sample) -> dict:
    """An NEJM Image Challenge sample as a row of ``nejm_image`` (:data:`IMAGE_FEATURES`)."""
    return {
        "case_id": s.case_id,
        "image": {"bytes": s.image, "path": f"{s.case_id}.{s.image_format}"},
        "vignette": s.vignette,
        "question": s.question,
        "answer": s.answer,
        "choices": [],
        "specialty": None,
        "source": "nejm_image",
    }


def build_order(s: Sample) -> tuple:
    """Where a text sample goes in a config: by source (the upstream CSV's order), then id in natural order."""
    return (SOURCE_ORDER.index(s.source), natural_key(s.case_id))
