"""The paper's grader-AI, through any chat model (``llm:<provider/model>``).

Two steps through the same model layer, request cache and retries as generation (:mod:`craftmd.models`,
:class:`~craftmd.models.calls.Caller`), with one of two prompt sets (:data:`PROMPT_SETS`):

- ``grader-upstream-3bb2737`` (the default, comparable with the recorded ``upstream-gpt4`` labels): upstream's own
  protocol (``src/utils.py: diagnosis_evaluation`` of the pinned code), its prompts rendered from the pinned
  ``src/prompts.py`` (:mod:`craftmd.upstream_prompts`). **extract**: one ``system`` message
  ``get_extract_diagnosis_name_prompt(answer)``, the reply lower-cased; **evaluate**: one ``system`` message
  ``get_diagnosis_evaluation_prompt(correct answer lower-cased, extracted)``, asked for ``none`` and ``multiple`` too;
  the reply is 1 when it holds "yes", else 0 when it holds "no", else -1 and both steps are asked again, as upstream
  does, up to :data:`UPSTREAM_ATTEMPTS` times in all (attempt k sent with seed k). A missing answer is -1 with
  extraction ``None`` and no call (``src/graderai_eval.py``). The labels 1 / 0 / -1 map to verdicts as ingest maps
  the recorded ones (:func:`upstream_verdict`).
- ``grader-v1``: the package's own wording (``scoring/prompts/grader_extract_v1.txt``, ``grader_judge_v1.txt``, user
  turns): the diagnosis or ``multiple`` / ``none``, then correct / incorrect (the paper's five examples);
  ``multiple`` and ``none`` score 0 and skip step 2; a missing or blank answer is ``none`` without a call.

A request that fails after its retries is recorded (``detail.error``) and scores nothing; the number of such
failures is returned with the grades. The steps' raw outputs are kept in ``detail`` (JSON).
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

UPSTREAM = "grader-upstream-3bb2737"
PROMPT_SET = UPSTREAM  # the default
OWN = "grader-v1"
PROMPT_SETS = (UPSTREAM, OWN)
PROMPT_FILES = {"extract": "grader_extract_v1.txt", "judge": "grader_judge_v1.txt"}
#: Upstream's two prompt functions (src/prompts.py), by step.
UPSTREAM_FUNCTIONS = {"extract": "get_extract_diagnosis_name_prompt", "judge": "get_diagnosis_evaluation_prompt"}
#: Upstream asks both steps again while the evaluation is unreadable and its depth <= 10: 12 attempts in all.
UPSTREAM_ATTEMPTS = 12
#: Grader calls are deterministic and short; upstream's calls are capped at 150 tokens (src/models.py: call_gpt4_api).
SAMPLINGS = {
    OWN: {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": 0},
    UPSTREAM: {"temperature": 0.0, "top_p": 1.0, "max_tokens": 150, "seed": 0},
}


def check_prompt_set(name: str) -> str:
    if name not in PROMPT_SETS:
        raise CraftMDError(f"unknown grader prompt set {name!r}; use one of {', '.join(PROMPT_SETS)}")
    return name


def load_prompts() -> dict[str, str]:
    """The package's own prompt files (``grader-v1``)."""
    base = resources.files("craftmd.scoring") / "prompts"
    return {k: (base / f).read_text(encoding="utf-8") for k, f in PROMPT_FILES.items()}


def prompt_set_record(name: str = PROMPT_SET) -> dict:
    """What a manifest records about the grader's prompts: the set's name and sha256, where they are read from."""
    if check_prompt_set(name) == UPSTREAM:
        from craftmd.source import PINNED_COMMIT
        from craftmd.upstream_prompts import upstream_prompts_sha256

        functions = dict(sorted(UPSTREAM_FUNCTIONS.items()))
        return {
            "name": name,
            "sha256": upstream_prompts_sha256(functions.values()),
            "functions": {k: f"src/prompts.py:{v}" for k, v in functions.items()},
            "source": f"craft-md {PINNED_COMMIT}",
            "roles": "system",
            "attempts": UPSTREAM_ATTEMPTS,
        }
    prompts = load_prompts()
    h = hashlib.sha256("".join(prompts[k] for k in sorted(prompts)).encode()).hexdigest()
    return {"name": name, "sha256": h, "files": {k: f"scoring/prompts/{f}" for k, f in sorted(PROMPT_FILES.items())}}


@dataclass(frozen=True)
class LLMGrade:
    resolved: str | None
    resolved_kind: str  # single | multiple | none
    correct: bool
    detail: str  # JSON: both steps' raw outputs
    failed: bool = False


_JUNK = re.compile(r"^[\s\"'*`:.-]*(?:final\s+)?(?:diagnosis\s*[:=-]\s*)?", re.I)


def parse_extraction(text: str | None) -> tuple[str | None, str]:
    """Step 1's reply (``grader-v1``) -> (diagnosis, kind)."""
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
    """Step 2's reply (``grader-v1``) -> True (correct), False (incorrect), None (unreadable)."""
    if text is None:
        return None
    words = re.findall(r"[a-z]+", text.lower())
    for w in words:
        if w in ("incorrect", "no", "different", "wrong"):
            return False
        if w in ("correct", "yes", "same"):
            return True
    return None


def parse_evaluation(text: str) -> int:
    """Upstream's evaluation reply -> 1 / 0 / -1, as ``helper_eval_responses`` reads it: substrings, "yes" first."""
    low = text.lower()
    return 1 if "yes" in low else 0 if "no" in low else -1


def upstream_verdict(evaluation, extracted) -> tuple[str | None, str, bool]:
    """An upstream label (``evaluation`` 1 / 0 / -1, the ``extracted`` answer) as (resolved, kind, correct): the one
    mapping of recorded labels (ingest) and of this grader's, so the two compare row by row."""
    ex = extracted if isinstance(extracted, str) else None
    if evaluation == -1 or evaluation is None or ex is None or ex.strip().lower() == "none":
        resolved, kind = None, "none"
    elif ex.strip().lower() == "multiple":
        resolved, kind = None, "multiple"
    else:
        resolved, kind = ex, "single"
    return resolved, kind, evaluation == 1


def _json(d: dict) -> str:
    return json.dumps(d, sort_keys=True, ensure_ascii=False)


class LLMGrader:
    """``LLMGrader("openai/gpt-4o", base_url=..., cache=..., prompt_set=...)``; ``.grade_many(pairs)``.

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
        prompt_set: str = PROMPT_SET,
    ):
        """``call`` (async ``(messages, sampling) -> Completion``): the model is called through it, no connection of its
        own (another harness's model, e.g. inspect's ``grader`` role); ``model`` then only names it."""
        from craftmd.models import Sampling
        from craftmd.models.connect import CallSettings, check_names

        self.prompt_set = check_prompt_set(prompt_set)
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
        self.sampling = Sampling(**SAMPLINGS[self.prompt_set])
        self.prompts = load_prompts() if self.prompt_set == OWN else None

    def answer_key(self, answer: str, paper_answer: str | None = None) -> str:
        """The correct answer the grader compares with: upstream's (``correct_ans``: the dataset's ``paper_answer``,
        else its answer, lower-cased) for the upstream set, the dataset's answer for ``grader-v1``."""
        return (paper_answer or answer).lower() if self.prompt_set == UPSTREAM else answer

    def asks(self, response: str | None) -> bool:
        """Whether grading ``response`` calls the model (upstream grades any text; ``grader-v1`` no blank one)."""
        return response is not None and (self.prompt_set == UPSTREAM or bool(response.strip()))

    def _messages(self, step: str, **fields) -> list[dict]:
        text = self.prompts[step]
        for k, v in fields.items():
            text = text.replace("{" + k + "}", v)
        return [{"role": "user", "content": text}]

    @staticmethod
    def _upstream_messages(step: str, *args: str) -> list[dict]:
        from craftmd.upstream_prompts import upstream_prompt

        return [{"role": "system", "content": upstream_prompt(UPSTREAM_FUNCTIONS[step], *args)}]

    async def grade_one(self, response: str | None, answer: str) -> LLMGrade:
        if self.prompt_set == UPSTREAM:
            return await self._grade_upstream(response, answer)
        return await self._grade_own(response, answer)

    async def _grade_upstream(self, response: str | None, answer: str) -> LLMGrade:
        """Upstream's ``diagnosis_evaluation``: extract, evaluate, both again while the evaluation is unreadable."""
        if not self.asks(response):  # upstream grades no missing answer: -1, "None", no call
            return LLMGrade(None, "none", False, _json({"evaluation": -1, "extracted_ans": "None", "attempts": 0}))
        detail: dict = {}
        for attempt in range(UPSTREAM_ATTEMPTS):
            sampling = self.sampling.with_seed(attempt)
            c1 = await self.caller(self._upstream_messages("extract", response), sampling)
            detail.update(attempts=attempt + 1, extract=c1.text, judge=None)
            if c1.status != "ok" or c1.text is None:
                return self._no_reply(c1, detail)
            extracted = c1.text.lower()
            c2 = await self.caller(self._upstream_messages("judge", answer.lower(), extracted), sampling)
            detail.update(judge=c2.text, extracted_ans=extracted)
            if c2.status != "ok" or c2.text is None:
                return self._no_reply(c2, detail)
            evaluation = parse_evaluation(c2.text)
            if evaluation != -1:
                break
        detail["evaluation"] = evaluation
        resolved, kind, correct = upstream_verdict(evaluation, extracted)
        return LLMGrade(resolved, kind, correct, _json(detail))

    @staticmethod
    def _no_reply(c, detail: dict) -> LLMGrade:
        """A step without a reply: a failed call scores nothing (failed); a refusal is no diagnosis."""
        detail["error"] = c.error or c.status
        return LLMGrade(None, "none", False, _json(detail), failed=c.status == "error")

    async def _grade_own(self, response: str | None, answer: str) -> LLMGrade:
        if not self.asks(response):
            return LLMGrade(None, "none", False, _json({"extract": None, "judge": None}))
        c1 = await self.caller(self._messages("extract", response=response), self.sampling)
        detail: dict = {"extract": c1.text, "judge": None}
        if c1.status != "ok" or c1.text is None:
            return self._no_reply(c1, detail)
        dx, kind = parse_extraction(c1.text)
        if kind != "single":
            return LLMGrade(None, kind, False, _json(detail))
        c2 = await self.caller(self._messages("judge", diagnosis=dx, answer=answer.strip().strip('"').strip()), self.sampling)
        detail["judge"] = c2.text
        verdict = parse_judgement(c2.text) if c2.status == "ok" else None
        failed = False
        if verdict is None:
            detail["error"] = c2.error or ("unreadable judgement" if c2.status == "ok" else c2.status)
            failed = c2.status == "error"
        return LLMGrade(dx, "single", bool(verdict), _json(detail), failed=failed)

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
        return grader_record(self.model_name, self.prompt_set)


def grader_record(model: str, prompt_set: str = PROMPT_SET) -> dict:
    """A grader's identity: its model, prompt set and sampling (a release graded with them, no call failed, is current)."""
    return {"model": model, "prompt_set": prompt_set_record(prompt_set), "sampling": dict(SAMPLINGS[prompt_set])}


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
    "parse_evaluation",
    "upstream_verdict",
    "check_prompt_set",
    "load_prompts",
    "prompt_set_record",
    "PROMPT_SET",
    "PROMPT_SETS",
]
