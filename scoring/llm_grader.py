"""The paper's grader-AI, through any chat model (``llm:<provider/model>``).

Two steps, one request each, through the same model layer, request cache and retries
as generation (:mod:`craftmd.models`, :class:`~craftmd.models.calls.Caller`):

1. **extract** (prompt ``scoring/prompts/grader_extract_v1.txt``): the diagnosis the
   answer names, or ``multiple`` / ``none``;
2. **judge** (``grader_judge_v1.txt``, the paper's five examples): is that diagnosis the
   correct answer? Synonyms count; a more general diagnosis counts; a more specific one
   does not.

``multiple`` and ``none`` score 0 and skip step 2. A missing answer is ``none`` without
a call. A request that fails after its retries is recorded (``detail.error``) and
scores 0; the number of such failures is returned with the grades. Both steps' raw
outputs are kept in ``detail`` (JSON).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources

from tqdm import tqdm

from craftmd import CraftMDError

PROMPT_SET = "grader-v1"
PROMPT_FILES = {"extract": "grader_extract_v1.txt", "judge": "grader_judge_v1.txt"}
#: Grader calls are deterministic and short.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}


def load_prompts() -> dict[str, str]:
    base = resources.files("craftmd.scoring") / "prompts"
    return {k: (base / f).read_text(encoding="utf-8") for k, f in PROMPT_FILES.items()}


def prompt_set_record() -> dict:
    """What a manifest records about the grader's prompts."""
    prompts = load_prompts()
    h = hashlib.sha256("".join(prompts[k] for k in sorted(prompts)).encode()).hexdigest()
    return {"name": PROMPT_SET, "sha256": h, "files": {k: f"scoring/prompts/{f}" for k, f in sorted(PROMPT_FILES.items())}}


@dataclass(frozen=True)
class LLMGrade:
    resolved: str | None
    resolved_kind: str  # single | multiple | none
    correct: bool
    detail: str  # JSON: both steps' raw outputs
    failed: bool = False


_JUNK = re.compile(r"^[\s\"'*`:.-]*(?:final\s+)?(?:diagnosis\s*[:=-]\s*)?", re.I)


def parse_extraction(text: str | None) -> tuple[str | None, str]:
    """Step 1's reply -> (diagnosis, kind)."""
    if text is None:
        return None, "none"
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = _JUNK.sub("", line).strip().strip("\"'*`.").strip()
    low = line.lower()
    if not line or low in ("none", "no diagnosis", "n/a"):
        return None, "none"
    if re.fullmatch(r"multiple(?: (?:possible )?(?:diagnoses|answers|options|conditions))?\W*", low):
        return None, "multiple"  # not "Multiple sclerosis", "Multiple myeloma": those are names
    return line, "single"


def parse_judgement(text: str | None) -> bool | None:
    """Step 2's reply -> True (correct), False (incorrect), None (unreadable)."""
    if text is None:
        return None
    words = re.findall(r"[a-z]+", text.lower())
    for w in words:
        if w in ("incorrect", "no", "different", "wrong"):
            return False
        if w in ("correct", "yes", "same"):
            return True
    return None


class LLMGrader:
    """``LLMGrader("openai/gpt-4o", base_url=..., cache=...)``; ``.grade_many(pairs)``.

    The model's client lives for one ``grade_many`` (opened and closed on its event loop,
    so no connection is left open); a cache given as a path is opened and closed there too.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        cache=None,
        concurrency: int = 8,
        max_retries: int = 6,
        call=None,
    ):
        """``call`` (async ``(messages, sampling) -> Completion``): the model is called through it, no connection of its
        own (another harness's model, e.g. inspect's ``grader`` role); ``model`` then only names it."""
        from craftmd.models import Sampling
        from craftmd.models.connect import CallSettings, check_names

        self.settings = CallSettings(
            base_url=base_url, api_key=api_key, concurrency=concurrency, max_retries=max_retries, cache=cache
        )
        if call is None:
            check_names([model], self.settings)  # the name, its server and key variables, now
        self.call = call
        self.model_name = model
        self.name = f"llm:{model}"
        self.caller = call  # the Caller of the latest grade_many (its counters), or the given call
        self.server: dict = {}  # where the latest grade_many called the model ({base_url, service})
        self.sampling = Sampling(**SAMPLING)
        self.prompts = load_prompts()

    def _messages(self, step: str, **fields) -> list[dict]:
        text = self.prompts[step]
        for k, v in fields.items():
            text = text.replace("{" + k + "}", v)
        return [{"role": "user", "content": text}]

    async def grade_one(self, response: str | None, answer: str) -> LLMGrade:
        if response is None or not response.strip():
            return LLMGrade(None, "none", False, json.dumps({"extract": None, "judge": None}, sort_keys=True))
        c1 = await self.caller(self._messages("extract", response=response), self.sampling)
        detail: dict = {"extract": c1.text, "judge": None}
        if c1.status != "ok" or c1.text is None:
            detail["error"] = c1.error or c1.status
            return LLMGrade(
                None, "none", False, json.dumps(detail, sort_keys=True, ensure_ascii=False), failed=c1.status == "error"
            )
        dx, kind = parse_extraction(c1.text)
        if kind != "single":
            return LLMGrade(None, kind, False, json.dumps(detail, sort_keys=True, ensure_ascii=False))
        c2 = await self.caller(self._messages("judge", diagnosis=dx, answer=answer.strip().strip('"').strip()), self.sampling)
        detail["judge"] = c2.text
        verdict = parse_judgement(c2.text) if c2.status == "ok" else None
        failed = False
        if verdict is None:
            detail["error"] = c2.error or ("unreadable judgement" if c2.status == "ok" else c2.status)
            failed = c2.status == "error"
        return LLMGrade(dx, "single", bool(verdict), json.dumps(detail, sort_keys=True, ensure_ascii=False), failed=failed)

    async def _grade_all(self, pairs: list[tuple[str | None, str]], progress: bool) -> list[LLMGrade]:
        from craftmd.models.connect import Connections

        bar = tqdm(total=len(pairs), desc=f"grade {self.name}", unit="answer", disable=not progress)

        async def one(p):
            g = await self.grade_one(*p)
            bar.update(1)
            return g

        try:
            if self.call is not None:
                return await asyncio.gather(*(one(p) for p in pairs))
            async with Connections(self.settings, [self.model_name]) as conn:
                self.caller, self.server = conn.caller(self.model_name), conn.server(self.model_name)
                return await asyncio.gather(*(one(p) for p in pairs))
        finally:
            bar.close()

    def grade_many(self, pairs: list[tuple[str | None, str]], *, progress: bool = True) -> list[LLMGrade]:
        """Grade (response, correct answer) pairs; identical pairs are asked once."""
        unique = list(dict.fromkeys(pairs))
        graded = asyncio.run(self._grade_all(unique, progress))
        by_pair = dict(zip(unique, graded))
        return [by_pair[p] for p in pairs]

    def record(self) -> dict:
        """What the release manifest records (no call counters: same inputs, same bytes)."""
        return grader_record(self.model_name)


def grader_record(model: str) -> dict:
    """A grader's identity: its model, prompt set and sampling (a release graded with them, no call failed, is current)."""
    return {"model": model, "prompt_set": prompt_set_record(), "sampling": dict(SAMPLING)}


def parse_grader_name(name: str) -> str:
    """``llm:openai/gpt-4o`` -> ``openai/gpt-4o``."""
    if not name.startswith("llm:") or "/" not in name[4:]:
        raise CraftMDError(f"grader {name!r}: expected llm:PROVIDER/MODEL, e.g. llm:openai/gpt-4o")
    return name[4:]


__all__ = [
    "LLMGrader",
    "LLMGrade",
    "grader_record",
    "parse_extraction",
    "parse_judgement",
    "load_prompts",
    "prompt_set_record",
    "PROMPT_SET",
]
