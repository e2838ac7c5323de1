"""``vllm/<model-or-path>``: vLLM's offline engine, every active request of a turn in one ``LLM.chat``.

vLLM is an optional extra (``pip install craftmd[vllm]``), imported only when a
``vllm/`` model is first used. The engine is built once per model and shared; the
blocking ``LLM.chat`` runs in a worker thread so the event loop keeps collecting the
next batch. Multimodal requests use the same OpenAI content parts (``image_url``
with a data URL), which ``LLM.chat`` accepts.

Engines of one run share the GPU (:func:`plan_engines`): roles that name one model share its one
engine, and distinct engines split the memory by one rule: each engine without an explicit
``gpu_memory_utilization`` gets an equal share of what 0.9 (vLLM's own default for one engine) leaves
after the explicit ones — 0.9 for one engine, 0.45 each for a doctor and a patient on two models.
The settings of :data:`ENGINE_KEYS` can be given per role (``--engine-arg ROLE.KEY=VALUE``) and are
recorded in the run record.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from craftmd import CraftMDError

from .base import EMPTY, ChatModel, Completion, Message, Sampling, visible


def _vllm():
    try:
        import vllm
    except ImportError:
        raise CraftMDError("vllm/ models need vLLM: pip install 'craftmd[vllm]' (on a machine with a GPU)") from None
    return vllm


#: The engine settings a role may set, with their types.
ENGINE_KEYS = {"tensor_parallel_size": int, "gpu_memory_utilization": float, "max_model_len": int, "dtype": str}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
GPU_MEMORY = 0.9  # the fraction of the GPU's memory a run's engines share (vLLM's default for one engine)


def engine_value(key: str, text: str) -> Any:
    """``text`` as the value of engine setting ``key``; one line for an unknown key or a bad value."""
    if key not in ENGINE_KEYS:
        raise CraftMDError(f"engine setting {key!r} is not one of {', '.join(ENGINE_KEYS)}")
    try:
        value = ENGINE_KEYS[key](text)
    except ValueError:
        raise CraftMDError(f"engine setting {key}={text!r}: expected {ENGINE_KEYS[key].__name__}") from None
    if key == "dtype" and value not in DTYPES:
        raise CraftMDError(f"engine setting dtype={text!r}: expected one of {', '.join(DTYPES)}")
    if key == "gpu_memory_utilization" and not 0 < value <= 1:
        raise CraftMDError(f"engine setting gpu_memory_utilization={text!r}: expected a fraction in (0, 1]")
    if key in ("tensor_parallel_size", "max_model_len") and value < 1:
        raise CraftMDError(f"engine setting {key}={text!r}: must be at least 1")
    return value


def engine_args_by_model(roles: Mapping[str, str], given: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-role settings (``given``: role or ``*`` for every ``vllm/`` role -> settings) as settings per model name.

    Roles that name one model share its engine, so they must not give it different values; a setting
    for a role that is not a ``vllm/`` model, or for no role of the run, is an error."""
    unknown = sorted(set(given) - set(roles) - {"*"})
    if unknown:
        raise CraftMDError(f"--engine-arg for {unknown[0]!r}: the run's roles are {', '.join(roles)}")
    if given.get("*") and not any(n.startswith("vllm/") for n in roles.values()):
        raise CraftMDError("--engine-arg is for vllm/ models, and no role of the run is one")
    out: dict[str, dict[str, Any]] = {}
    owner: dict[tuple[str, str], str] = {}
    for role, name in roles.items():
        if not name.startswith("vllm/"):
            if given.get(role):
                raise CraftMDError(f"--engine-arg for {role}: its model {name} is not a vllm/ model")
            continue
        for key, value in {**given.get("*", {}), **given.get(role, {})}.items():
            args = out.setdefault(name, {})
            if key in args and args[key] != value:
                raise CraftMDError(
                    f"{owner[name, key]} and {role} share the engine of {name} but set {key} to "
                    f"{args[key]} and {value}; give it once"
                )
            args[key], owner[name, key] = value, owner.get((name, key), role)
    return out


def plan_engines(models: list[str], given: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each distinct engine's settings: ``given[model]``, with ``gpu_memory_utilization`` shared out by the rule
    (an equal share of what :data:`GPU_MEMORY` leaves after the explicit ones). One line where they cannot fit."""
    models = list(dict.fromkeys(models))
    plan = {m: dict(given.get(m, {})) for m in models}
    explicit = sum(a["gpu_memory_utilization"] for a in plan.values() if "gpu_memory_utilization" in a)
    if explicit > 1:
        raise CraftMDError(f"the run's vLLM engines share the GPU, but their gpu_memory_utilization adds up to {explicit:g} > 1")
    rest = [m for m in models if "gpu_memory_utilization" not in plan[m]]
    if rest:
        share = round((GPU_MEMORY - explicit) / len(rest), 4)
        if share <= 0:
            raise CraftMDError(
                f"no GPU memory left for {', '.join(rest)}: the explicit gpu_memory_utilization values add up "
                f"to {explicit:g}; give every engine its own"
            )
        for m in rest:
            plan[m]["gpu_memory_utilization"] = share
    return plan


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
        self._built_with: dict | None = None  # the settings its engine was built with (None: not built here)
        self.batch_sizes: list[int] = []  # one entry per LLM.chat call

    def configure(self, engine_args: Mapping[str, Any]) -> None:
        """Set the engine's settings before it is built; an engine already loaded cannot change them."""
        if self._built_with is not None and self._built_with != dict(engine_args):
            raise CraftMDError(
                f"the vLLM engine of {self.model} is already loaded with {self._built_with}; "
                f"it cannot be reloaded with {dict(engine_args)} in the same process"
            )
        self.engine_args = dict(engine_args)

    @property
    def llm(self):
        if self._llm is None:
            self._built_with = dict(self.engine_args)
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
    if gen.text is None or not visible(gen.text):  # no answer: a failure, not cached (a re-run asks again)
        return Completion.failure(
            EMPTY,
            f"the engine gave {'no text' if gen.text is None else 'no visible text'} (finish_reason {gen.finish_reason})",
            transient=True,
            finish_reason=gen.finish_reason,
            tokens_in=tin,
            tokens_out=tout,
        )
    return Completion(gen.text, "ok", gen.finish_reason, tin, tout)
