"""The expert-review loop: sheets for clinicians out (:mod:`.sample`, :mod:`.sheets`), their answers in (:mod:`.read`),
agreement computed (:mod:`.statistics`) and written (:mod:`.write`); the form itself is :mod:`.records`."""

from __future__ import annotations

from .read import read_review_files
from .records import (
    EXPERTS,
    KEY_SHEET,
    REVIEW_SHEET,
    CaseCount,
    Rating,
    ReviewInput,
    Unit,
    parse_answer,
    question_ids,
    upstream_question_map,
)
from .sheets import export_review
from .statistics import EXPERT_TEST_COLUMNS, counts_agreement, grader_count_agreement, model_tests, resolve, summarise
from .write import release_labels_by_grader, review_audit, write_with_scores

__all__ = [
    "export_review", "write_with_scores", "read_review_files", "summarise", "review_audit", "resolve", "model_tests", "EXPERT_TEST_COLUMNS",
    "grader_count_agreement", "counts_agreement", "release_labels_by_grader", "parse_answer", "ReviewInput", "Rating", "Unit", "CaseCount",
    "EXPERTS", "KEY_SHEET", "REVIEW_SHEET", "question_ids", "upstream_question_map",
]  # fmt: skip
