"""Which model family a model is of, so that no model grades or judges itself unnoticed."""

from __future__ import annotations

import re

from craftmd import CraftMDError
from craftmd.models import parse_name


def _bare(model: str) -> str:
    """``openai/gpt-4-1106-preview`` -> ``gpt-4-1106-preview``; ``openai-api/local/my-model`` -> ``my-model`` (the
    provider and service say where, not what)."""
    try:
        return parse_name(model).model
    except CraftMDError:
        return model.split("/", 1)[1] if "/" in model else model


def family(model: str) -> str:
    """A model's family: its bare name's leading letters (``gpt``, ``llama``, ``mistral``, ``smollm``)."""
    m = re.match(r"[a-z]+", _bare(model).lower().split("/")[-1])
    return m.group(0) if m else _bare(model).lower()


def grades_itself(grader: str, model_under_test: str, doctor_family: str | None = None) -> bool:
    """Whether an LLM grader is the model under test (same model, or the family the run record names)."""
    if not grader.startswith("llm:"):
        return False
    g = grader[4:]
    if _bare(g).lower() == _bare(model_under_test).lower():
        return True
    return doctor_family is not None and family(g) == doctor_family.lower()


__all__ = ["family", "grades_itself"]
