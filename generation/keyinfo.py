"""Key-value medical information: the ``keyinfo`` config (:mod:`craftmd.keyinfo`), extracted by a model (``craftmd keyinfo extract``).

:func:`extract_keyinfo` asks a model for each case's initial request and (key, value) items; :func:`write_keyinfo`
writes them as the dataset's ``keyinfo`` config.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from craftmd import CraftMDError
from craftmd.keyinfo import CONFIG, SCHEMA
from craftmd.models.base import Completion, Sampling
from craftmd.replies import Reply, Text, validated_reply

PROMPT_SET = "keyinfo-v1"
PROMPTS_DIR = Path(__file__).parent / "prompts"
SAMPLING = Sampling(temperature=0.0, top_p=1.0, max_tokens=768, seed=0)
PARQUET_OPTIONS = dict(compression="zstd", compression_level=9, use_dictionary=True, write_statistics=True)


class KeyValue(Reply):
    key: Text
    value: Text


class Extraction(Reply):
    """The reply the prompt asks for."""

    initial_request: Text
    items: list[KeyValue] = Field(min_length=1)


def parse_reply(text: str | None) -> tuple[Extraction | None, str | None]:
    """A model's reply -> (extraction, None), or (None, why it does not validate).

    The reply must be one JSON object (:class:`Extraction`, checked with pydantic; a Markdown code
    fence around it is allowed); its schema is declared to the model layer, which asks the server in the
    response format it takes (:mod:`craftmd.models.formats`; the build manifest's ``keyinfo`` entry records
    which). Every case asked gets a row: a reply that does not validate, a
    refusal or a failed call is recorded as that case's failure (``status`` ``invalid``, ``refusal``
    or ``error``, ``items`` empty, the reason in ``error``), listed and counted by the command, never
    dropped. Readers (:func:`craftmd.keyinfo.load_keyinfo`) use the ``ok`` rows.
    """
    return validated_reply(text, Extraction, json_where="reply: ")


def prompts():
    from craftmd.generation.protocol import PromptSet

    return PromptSet(PROMPT_SET, PROMPTS_DIR)


def messages(vignette: str, prompt_set=None) -> list[dict]:
    p = prompt_set or prompts()
    return [
        {"role": "system", "content": p.text("system.txt")},
        {"role": "user", "content": p.text("user.txt", vignette=vignette.strip())},
    ]


def row(case_id: str, c: Completion, model: str, prompt_sha256: str) -> dict:
    """The config row of one case from its completion."""
    base = {"case_id": case_id, "model": model, "prompt_sha256": prompt_sha256}
    if c.status != "ok":
        return {**base, "items": [], "initial_request": None, "status": c.status, "error": c.error or c.status}
    got, why = parse_reply(c.text)
    if got is None:
        return {**base, "items": [], "initial_request": None, "status": "invalid", "error": why}
    return {
        **base,
        "items": [i.model_dump() for i in got.items],
        "initial_request": got.initial_request,
        "status": "ok",
        "error": None,
    }


@dataclass
class ExtractReport:
    path: Path
    cases: int
    ok: int
    failed: dict[str, str] = field(default_factory=dict)  # case_id -> status: reason
    calls: int = 0
    cache_hits: int = 0
    tokens_in: int = 0
    tokens_out: int = 0

    def summary(self) -> str:
        lines = [
            f"keyinfo      {self.path}",
            f"cases        {self.cases}: {self.ok} extracted, {len(self.failed)} failed",
            f"requests     {self.calls} sent, {self.cache_hits} cached; tokens in {self.tokens_in:,}, out {self.tokens_out:,}",
        ]
        lines += [f"  failed     {cid}: {why}" for cid, why in self.failed.items()]
        return "\n".join(lines)


async def _ask_all(
    texts: list[tuple[str, str]], model_name: str, *, base_url, api_key, cache_path, concurrency, max_retries, timeout, progress
) -> tuple[list[Completion], object, dict]:
    from tqdm import tqdm

    from craftmd.models.connect import CallSettings, Connections
    from craftmd.models.formats import structured

    conn = Connections(
        CallSettings(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            concurrency=concurrency,
            seed=SAMPLING.seed,
            cache=cache_path,
        ),
        [model_name],
    )
    caller = conn.caller(model_name)
    p = prompts()
    bar = tqdm(total=len(texts), desc="keyinfo extract", unit="case", disable=not progress, file=sys.stderr, dynamic_ncols=True)

    sampling = structured(SAMPLING, Extraction.model_json_schema(), name="keyinfo")

    async def one(vignette: str) -> Completion:
        c = await caller(messages(vignette, p), sampling)
        k = caller.counters
        bar.update(1)
        bar.set_postfix_str(
            f"sent={k.calls} cached={k.cache_hits} fail={k.failures} tok_in={k.tokens_in:,} tok_out={k.tokens_out:,}"
        )
        return c

    try:
        async with conn:
            await conn.check()
            return list(await asyncio.gather(*(one(v) for _, v in texts))), caller.counters, caller.formats.record()
    finally:
        bar.close()


def extract_keyinfo(
    dataset_dir: Path | str,
    model: str,
    *,
    cases: list[str] | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    cache: Path | str | None = None,
    concurrency: int = 8,
    max_retries: int = 6,
    timeout: float = 120.0,
    progress: bool = True,
) -> ExtractReport:
    """Extract the key-value information of the text cases (all, or ``cases``) and write the ``keyinfo`` config.

    After the data construction of the consultation-evaluation framework: each case's vignette is
    turned by a model into the patient's *initial request* (what the patient says first) and a list
    of (key, value) items of medical information ("Patient age" → "61"). One request per case,
    through the shared model layer (:class:`~craftmd.models.calls.Caller`: request cache, bounded
    concurrency, capped retries), with the versioned prompt set ``generation/prompts/keyinfo-v1`` and fixed
    sampling (temperature 0, seed 0).
    """
    from craftmd.generation.runner import default_cache
    from craftmd.models.connect import CallSettings, check_names
    from craftmd.samples import load_samples

    check_names([model], CallSettings(base_url=base_url, api_key=api_key))
    dataset_dir = Path(dataset_dir)
    samples = [s for s in load_samples(dataset_dir, "all", cases) if s.vignette.strip()]
    if not samples:
        raise CraftMDError(f"{dataset_dir}: no case with a vignette selected")
    p = prompts()
    completions, counts, formats = asyncio.run(_ask_all(
        [(s.case_id, s.vignette) for s in samples], model, base_url=base_url, api_key=api_key,
        cache_path=Path(cache) if cache else default_cache(), concurrency=concurrency, max_retries=max_retries,
        timeout=timeout, progress=progress))  # fmt: skip
    rows = [row(s.case_id, c, model, p.sha256) for s, c in zip(samples, completions)]
    path = write_keyinfo(
        dataset_dir,
        rows,
        {"model": model, "prompt_set": p.describe(), "sampling": SAMPLING.to_dict(), "response_format": formats},
    )
    failed = {r["case_id"]: f"{r['status']}: {r['error']}" for r in rows if r["status"] != "ok"}
    return ExtractReport(path, len(rows), len(rows) - len(failed), failed, counts.calls, counts.cache_hits, counts.tokens_in,
                         counts.tokens_out)  # fmt: skip


def write_keyinfo(dataset_dir: Path, rows: list[dict], producer: dict) -> Path:
    """Write the config atomically; list it in the build manifest and the card's configs when the folder has them.

    The config is written atomically to ``<dataset>/keyinfo/test-00000-of-00001.parquet`` (columns
    :data:`craftmd.keyinfo.SCHEMA`; rows in natural case-id order; the producing model and the prompt set's sha256 on
    every row) and holds exactly the cases of this run. When the folder is a built dataset, its
    ``build_manifest.json`` lists the new file (so ``craftmd publish`` takes it) and its card's
    ``configs`` list names it; nothing else of the build changes.
    """
    from craftmd.atomic import atomic_write_bytes, atomic_write_json, sha256_file
    from craftmd.dataset import config_file
    from craftmd.dataset_builder.build import CARD, MANIFEST

    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    path = atomic_write_bytes(config_file(dataset_dir, CONFIG), sink.getvalue().to_pybytes())
    rel = path.relative_to(dataset_dir).as_posix()
    card = dataset_dir / CARD
    if card.exists():
        _add_to_card(card, rel)
    manifest = dataset_dir / MANIFEST
    if manifest.exists():
        m = json.loads(manifest.read_text(encoding="utf-8"))
        m.setdefault("files", {})[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        if card.exists():
            m["files"][CARD] = {"sha256": sha256_file(card), "bytes": card.stat().st_size}
        m.setdefault("configs", {})[CONFIG] = len(rows)
        m[CONFIG] = {**producer, "cases": len(rows), "ok": sum(r["status"] == "ok" for r in rows)}
        atomic_write_json(manifest, m)
    return path


def _add_to_card(card: Path, rel: str) -> None:
    """Name the config in the card's YAML ``configs`` list (once); the rest of the card is left as it is."""
    from huggingface_hub import DatasetCard

    from craftmd.atomic import atomic_write_bytes

    c = DatasetCard.load(card)
    configs = list(c.data.get("configs") or [])
    if any(x.get("config_name") == CONFIG for x in configs):
        return
    configs.append({"config_name": CONFIG, "data_files": [{"split": "test", "path": rel}]})
    c.data["configs"] = configs
    atomic_write_bytes(card, str(c).encode())


__all__ = ["extract_keyinfo", "write_keyinfo", "parse_reply", "Extraction", "ExtractReport", "PROMPT_SET", "SAMPLING"]
