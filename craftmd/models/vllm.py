"""``vllm/<model-or-path>``: vLLM's offline engine, every active request of a turn in one ``LLM.chat``.

vLLM is an optional extra (``pip install craftmd[vllm]``), imported only when a
``vllm/`` model is first used. The engine is built once per model and shared; the
blocking ``LLM.chat`` runs in a worker thread so the event loop keeps collecting the
next batch. Multimodal requests use the same OpenAI content parts (``image_url``
with a data URL), which ``LLM.chat`` accepts.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from craftmd import CraftMDError

from .base import EMPTY, ChatModel, Completion, Message, Sampling


def _vllm():
    try:
        import vllm
    except ImportError:
        raise CraftMDError("vllm/ models need vLLM: pip install 'craftmd[vllm]' (on a machine with a GPU)") from None
    return vllm


class VLLMModel(ChatModel):
    provider = "vllm"
    batches = True

    def __init__(
        self,
        model: str,
        *,
        llm: Any | None = None,
        sampling_params: Callable[..., Any] | None = None,
        engine_args: dict | None = None,
    ):
        super().__init__(model)
        self._llm = llm
        self._sampling_params = sampling_params
        self.engine_args = dict(engine_args or {})
        self.batch_sizes: list[int] = []  # one entry per LLM.chat call

    @property
    def llm(self):
        if self._llm is None:
            self._llm = _vllm().LLM(model=self.model, **self.engine_args)
        return self._llm

    def params(self, s: Sampling):
        make = self._sampling_params or _vllm().SamplingParams
        return make(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed)

    async def check(self) -> None:
        if self._llm is None:
            _vllm()  # fail early and clearly when vLLM is missing; the weights load on first use

    async def chat(self, messages: list[Message], sampling: Sampling) -> Completion:
        return (await self.chat_many([messages], sampling))[0]

    async def chat_many(self, batch: list[list[Message]], sampling: Sampling | list[Sampling]) -> list[Completion]:
        if not batch:
            return []
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(batch)
        params = [self.params(s) for s in samplings]
        self.batch_sizes.append(len(batch))
        try:
            outputs = await asyncio.to_thread(self.llm.chat, batch, params, use_tqdm=False)
        except CraftMDError:
            raise
        except Exception as exc:  # an engine failure is recorded per request (not cached: a re-run tries again)
            return [Completion.failure(f"engine {type(exc).__name__}", str(exc), transient=True) for _ in batch]
        return [_completion(o) for o in outputs]


def _completion(out: Any) -> Completion:
    """A vLLM ``RequestOutput`` → Completion."""
    gen = out.outputs[0]
    tin = len(out.prompt_token_ids or [])
    tout = len(gen.token_ids or [])
    if gen.text is None or not gen.text.strip():  # no answer: a failure, not cached (a re-run asks again)
        return Completion.failure(EMPTY, f"the engine gave {'no text' if gen.text is None else 'only whitespace'} "
                                  f"(finish_reason {gen.finish_reason})", transient=True, finish_reason=gen.finish_reason,
                                  tokens_in=tin, tokens_out=tout)
    return Completion(gen.text, "ok", gen.finish_reason, tin, tout)
