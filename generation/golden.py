"""Golden consultations written by a model playing both sides: ``craftmd build --golden-writer PROVIDER/MODEL``.

After the consultation-evaluation framework's training set (its §4.2): for each training case kept by the build
(:mod:`craftmd.dataset_builder.golden`: diagnosis vignettes, no benchmark case), two requests to the writer model
through the shared model layer (request cache, bounded concurrency, capped retries), each with fixed sampling
(temperature 0, seed 0):

1. the case's initial request and key-value items, by the package's extraction (``keyinfo-v1``,
   :mod:`craftmd.generation.keyinfo`), from the vignette;
2. the dialogue (``golden-v1``): the doctor's key questions and the patient's answers, then the analysis, as
   one JSON object (:class:`Dialogue`).

The row's messages are the consultation task's doctor prompt, the initial request, the turns, and the analysis
closed by ``**Final Diagnosis:** <the correct answer>``. A case whose call failed, was refused or whose reply did
not validate is listed with its reason (the build report), never written and never replaced by the script.
"""

from __future__ import annotations

import asyncio
import sys

from pydantic import Field

from craftmd.models.base import Sampling
from craftmd.replies import Reply, Text, validated_reply

PROMPT_SET = "golden-v1"
SAMPLING = Sampling(temperature=0.0, top_p=1.0, max_tokens=1536, seed=0)


class Turn(Reply):
    doctor: Text
    patient: Text


class Dialogue(Reply):
    """The reply ``golden-v1`` asks for."""

    turns: list[Turn] = Field(min_length=1)
    analysis: Text


def parse_dialogue(text: str | None) -> tuple[Dialogue | None, str | None]:
    """A reply -> (dialogue, None), or (None, why it does not validate)."""
    return validated_reply(text, Dialogue)


def prompts():
    from craftmd.generation.protocol import PromptSet

    return PromptSet(PROMPT_SET)


def dialogue_messages(p, request: str, items: list[dict], question: str, answer: str) -> list[dict]:
    lines = "\n".join(f"- {i['key']}: {i['value']}" for i in items)
    user = p.text("user.txt", initial_request=request, items=lines, question=question, answer=answer)
    return [{"role": "system", "content": p.text("system.txt")}, {"role": "user", "content": user}]


def writer(model: str, *, base_url: str | None = None, cache=None, limit: int | None = None, progress: bool = True):
    """The build's writer callable for ``model`` (its server checked now, before any work; 8 requests in flight, the
    request cache ``cache`` or the default one): it writes the first ``limit`` (all when None) kept candidates'
    dialogues and returns (rows, failed {case: why}, info)."""
    from craftmd.models.connect import CallSettings, check_names

    check_names([model], CallSettings(base_url=base_url))
    if limit is not None and limit < 1:
        from craftmd import CraftMDError

        raise CraftMDError("--golden-limit must be at least 1")

    def write(candidates, system: str):
        from pathlib import Path

        from craftmd.generation.runner import default_cache

        chosen = candidates[:limit] if limit else list(candidates)
        settings = CallSettings(
            base_url=base_url, concurrency=8, seed=SAMPLING.seed, cache=Path(cache) if cache else default_cache()
        )
        results = asyncio.run(_write_all(chosen, system, model, settings, progress))
        rows = [r for r, _ in results if r is not None]
        failed = {c.case: why for c, (_, why) in zip(chosen, results) if why is not None}
        from craftmd.generation import keyinfo as K

        info = {"model": model, "prompt_set": f"{PROMPT_SET} ({prompts().sha256[:12]})",
                "keyinfo_prompt_set": f"{K.PROMPT_SET} ({K.prompts().sha256[:12]})", "asked": len(chosen),
                "sampling": SAMPLING.to_dict()}  # fmt: skip
        return rows, failed, info

    return write


async def _write_all(chosen, system, model, settings, progress):
    from tqdm import tqdm

    from craftmd.dataset_builder import golden as G
    from craftmd.generation import keyinfo as K
    from craftmd.models.connect import Connections

    conn = Connections(settings, [model])
    caller = conn.caller(model)
    kp, gp = K.prompts(), prompts()
    bar = tqdm(total=len(chosen), desc="golden writer", unit="case", disable=not progress, file=sys.stderr, dynamic_ncols=True)

    async def one(c) -> tuple[dict | None, str | None]:
        try:
            got = await caller(K.messages(c.vignette, kp), K.SAMPLING)
            if got.status != "ok":
                return None, f"keyinfo {got.status}: {got.error or got.status}"
            ext, why = K.parse_reply(got.text)
            if ext is None:
                return None, f"keyinfo {why}"
            items = [i.model_dump() for i in ext.items]
            got = await caller(dialogue_messages(gp, ext.initial_request, items, c.question, c.answer), SAMPLING)
            if got.status != "ok":
                return None, f"dialogue {got.status}: {got.error or got.status}"
            dia, why = parse_dialogue(got.text)
            if dia is None:
                return None, f"dialogue {why}"
            final = f"{dia.analysis}\n**Final Diagnosis:** {c.answer}"
            msgs = G.messages(system, ext.initial_request, [(t.doctor, t.patient) for t in dia.turns], final)
            return G.row(c, model, ext.initial_request, items, msgs), None
        finally:
            bar.update(1)

    try:
        async with conn:
            await conn.check()
            return list(await asyncio.gather(*(one(c) for c in chosen)))
    finally:
        bar.close()


__all__ = ["writer", "parse_dialogue", "Dialogue", "PROMPT_SET", "SAMPLING"]
