"""The dataset's typed rows and their Hugging Face features, one place for both.

A text case becomes a :class:`Case`, an NEJM image case an :class:`ImageCase`; the
builder writes them with the :data:`FEATURES` of their config, so
``datasets.load_dataset(DIR, CONFIG)`` reads back exactly these types.
"""

from __future__ import annotations

from dataclasses import dataclass

from datasets import Features, Image, List, Value

from craftmd.dataset_builder.transform import content_sha256

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

TEXT_CONFIGS = ("medqa_usmle", "derm_public", "derm_private", "all")
CONFIGS = TEXT_CONFIGS + ("nejm_image", "diagnoses")
FEATURES = {
    **{c: TEXT_FEATURES for c in TEXT_CONFIGS},
    "nejm_image": IMAGE_FEATURES,
    "diagnoses": DIAGNOSIS_FEATURES,
}
#: Order of sources inside a config (the upstream CSV's order).
SOURCE_ORDER = ("derm_public", "derm_private", "medqa_usmle")


@dataclass(frozen=True)
class Case:
    """One text case, as a row of the text configs."""

    case_id: str
    source: str
    specialty: str | None
    vignette: str
    question: str
    choices: tuple[str, ...]
    answer: str
    answer_index: int
    paper_answer: str  # the answer key as the paper's MCQ rule matched it (results files' correct_ans), verbatim
    task_type: str
    history: str
    physical_exam: str
    single_dx: bool | None

    def row(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["choices"] = list(self.choices)
        d["content_sha256"] = content_sha256(d)
        return d

    def sort_key(self) -> tuple[int, int, str]:
        num = self.case_id.rsplit("_", 1)[-1]
        return (SOURCE_ORDER.index(self.source), int(num) if num.isdigit() else 0, self.case_id)


@dataclass(frozen=True)
class ImageCase:
    """One NEJM Image Challenge case of the GPT-4V experiments."""

    case_id: str
    image: bytes
    image_format: str  # jpeg | png | ...
    vignette: str
    question: str
    answer: str

    def row(self) -> dict:
        return {
            "case_id": self.case_id,
            "image": {"bytes": self.image, "path": f"{self.case_id}.{self.image_format}"},
            "vignette": self.vignette,
            "question": self.question,
            "answer": self.answer,
            "choices": [],
            "specialty": None,
            "source": "nejm_image",
        }
