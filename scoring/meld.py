"""MELD: does a model know the benchmark's vignettes by heart?

Each vignette is cut in two, the model completes the first half, and the completion's similarity to the true second
half flags likely memorised cases (:func:`meld` runs it; ``craftmd meld`` and the ``meld`` scorer share it). The
definitions are below the imports.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from craftmd import CraftMDError
from craftmd.atomic import atomic_dir
from craftmd.text import similarity  # noqa: F401  (MELD's similarity, shared with the decontamination)

# -- what it computes ------------------------------------------------------------
# The paper's contamination check (Extended Data Fig. 1c): each vignette is cut in two,
# the model is given the first half with the prompt of the chosen prompt set (upstream's
# ``get_meld_prompt`` by default: continue the vignette in as many words) and its
# completion is compared with the true second half. A case whose completion is at least
# :data:`THRESHOLD` similar to the truth is flagged as likely memorised.
#
# Definitions (each lives here, once):
#
# * **split** ``chars`` (default, the paper's rule): cut at the space nearest to the
#   character midpoint of the vignette (ties go to the earlier space); ``words``: the first
#   ``floor(n/2)`` whitespace-separated words. Both halves are stripped.
# * **word count** sent to the model: the number of whitespace-separated words of the
#   first half (the paper's choice; the halves are about equal).
# * **similarity**: ``1 - Levenshtein.distance(truth, completion) / max(len(truth),
#   len(completion))`` over characters (python-Levenshtein), i.e. one minus the
#   length-normalised edit distance the paper computed. Not ``Levenshtein.ratio``, which
#   normalises an insert/delete distance by the sum of the lengths. Two empty strings
#   are 1.0. A failed request (status != ok) has no similarity and is never flagged; it
#   is counted as failed in the summary.
#
# * **prompt set** ``meld-upstream-3bb2737`` (default): upstream's ``get_meld_prompt(first_half, word_count)`` rendered
#   from the pinned code (:mod:`craftmd.upstream_prompts`, ``src/meld_distance.py`` sends it as one system message);
#   ``meld-v1``: the package's file ``prompts/meld.txt`` (the same request in the package's own words). Recorded by name
#   and sha256.
#   Upstream's computation is the one above but for three things the package keeps on purpose: upstream stores the
#   distance (``meld_score``), the package its complement; upstream scores a failed request 0 (a perfect match), the
#   package leaves it without a value; upstream halved the CSV's ``case_vignette`` (question included) of the
#   dermatology cases and the MedQA cases asking for a diagnosis, the package the benchmark's vignettes of ``configs``.
#
# The text halved is the dataset's ``vignette`` column (the question sentence removed, as
# the benchmark shows it), of the per-source configs (``medqa_usmle``, ``derm_public``,
# ``derm_private``) unless ``configs`` says otherwise. The prompt is sent as a single
# system message, as the paper did (``role="user"`` for chat templates that need a user turn).
#
# :func:`meld` returns the per-case rows and the summary; ``run_meld`` (``craftmd meld``) writes them as a folder
# (atomically) with ``scores.parquet`` (the release contract's
# scores table: per case, the metrics ``meld_similarity`` and ``meld_flagged`` of the scorer
# ``meld``, variant key ``config``; the completion as the label, the halves and any failure
# reason in the detail; a failed request has status ``error`` and no value), ``summary.json``
# (the run's settings and the figures aggregated from those scores) and ``similarity_hist.png``;
# :func:`read_similarities` reads the scores back as one row per case, and :func:`craftmd.analysis.meld.meld_audit`
# turns the run into the leaderboard's audit dict.
#
# MELD is an audit of a model, not of its answers, so ``craftmd meld --model`` stays its own command.
# The ``meld`` scorer (:class:`craftmd.scoring.scorers.Meld`, ``craftmd score RELEASE --scorer meld``)
# runs the same :func:`meld` on a release's own (doctor) model and returns the per-case rows, which ``craftmd score``
# adds to that release's ``scores.parquet``; current while the model, prompt, sampling, rule and dataset are unchanged.

PROMPT_FILE = Path(__file__).resolve().parent / "prompts" / "meld.txt"
UPSTREAM = "meld-upstream-3bb2737"
OWN = "meld-v1"
PROMPT_SETS = (UPSTREAM, OWN)
PROMPT_SET = UPSTREAM  # the default
UPSTREAM_FUNCTION = "get_meld_prompt"
THRESHOLD = 0.95
SPLITS = ("chars", "words")
#: The per-source configs; ``all`` would repeat them.
DEFAULT_CONFIGS = ("medqa_usmle", "derm_public", "derm_private")
SIMILARITY_DEFINITION = "1 - Levenshtein.distance(truth, completion) / max(len(truth), len(completion))"

SCORES = "scores.parquet"
SCORER = "meld"
SUMMARY = "summary.json"
FIGURE = "similarity_hist.png"


# -- the pure parts ---------------------------------------------------------------
def count_words(text: str) -> int:
    """Whitespace-separated words."""
    return len(text.split())


def split_halves(text: str, how: str = "chars") -> tuple[str, str]:
    """The vignette's first and second half (see the module doc for the two rules)."""
    if how == "words":
        words = text.split()
        k = len(words) // 2
        return " ".join(words[:k]), " ".join(words[k:])
    if how != "chars":
        raise CraftMDError(f"unknown MELD split {how!r}; use one of {', '.join(SPLITS)}")
    mid = len(text) // 2
    after = text.find(" ", mid)
    before = text.rfind(" ", 0, mid)
    forward = after if after != -1 else len(text)
    backward = before if before != -1 else 0
    cut = forward if (forward - mid) < (mid - backward) else backward
    return text[:cut].strip(), text[cut:].strip()


def prompt_template() -> str:
    try:
        return PROMPT_FILE.read_text(encoding="utf-8").rstrip("\n")
    except OSError as exc:
        raise CraftMDError(f"cannot read the MELD prompt {PROMPT_FILE}: {exc}") from None


def prompt_sha256() -> str:
    return hashlib.sha256(PROMPT_FILE.read_bytes()).hexdigest()


def meld_prompt(first_half: str, word_count: int, template: str | None = None) -> str:
    """The ``meld-v1`` prompt (the package's file, or ``template``)."""
    return (template or prompt_template()).format(word_count=word_count, first_half=first_half)


def check_prompt_set(name: str) -> str:
    if name not in PROMPT_SETS:
        raise CraftMDError(f"unknown MELD prompt set {name!r}; use one of {', '.join(PROMPT_SETS)}")
    return name


def renderer(prompt_set: str = PROMPT_SET):
    """``(first_half, word_count) -> prompt`` of a prompt set."""
    if check_prompt_set(prompt_set) == UPSTREAM:
        from craftmd.upstream_prompts import upstream_prompt

        return lambda first_half, word_count: upstream_prompt(UPSTREAM_FUNCTION, first_half, word_count)
    template = prompt_template()
    return lambda first_half, word_count: meld_prompt(first_half, word_count, template)


def prompt_record(prompt_set: str = PROMPT_SET, role: str = "system") -> dict:
    """What a run records about its prompt: the set's name, where it is read from, its sha256, the role it is sent as."""
    if check_prompt_set(prompt_set) == UPSTREAM:
        from craftmd.upstream_prompts import upstream_prompts_sha256

        where = {"function": f"src/prompts.py:{UPSTREAM_FUNCTION}", "sha256": upstream_prompts_sha256([UPSTREAM_FUNCTION])}
    else:
        where = {"file": "scoring/prompts/meld.txt", "sha256": prompt_sha256()}
    return {"name": prompt_set, **where, "role": role}


@dataclass(frozen=True)
class MeldCase:
    case_id: str
    config: str
    first_half: str
    second_half: str
    word_count: int

    def messages(self, render, role: str = "system") -> list[dict]:
        """The request: ``render`` (:func:`renderer`) of the first half, as one message of ``role``."""
        return [{"role": role, "content": render(self.first_half, self.word_count)}]


def meld_cases(
    dataset_dir: Path | str,
    configs: tuple[str, ...] | list[str] = DEFAULT_CONFIGS,
    cases: list[str] | None = None,
    limit: int | None = None,
    split: str = "chars",
) -> list[MeldCase]:
    """The cases of ``configs`` (optionally only ``cases``, or the first ``limit`` per config), halved."""
    from craftmd.dataset import TEXT_CONFIGS, load_config
    from craftmd.release import natural_key

    if split not in SPLITS:
        raise CraftMDError(f"unknown MELD split {split!r}; use one of {', '.join(SPLITS)}")
    bad = [c for c in configs if c not in TEXT_CONFIGS]
    if bad:
        raise CraftMDError(f"MELD needs text configs; {bad} is not one of {', '.join(TEXT_CONFIGS)}")
    if limit is not None and limit < 1:
        raise CraftMDError("--limit must be at least 1")
    wanted = set(cases) if cases else None
    out: list[MeldCase] = []
    seen: set[str] = set()
    for config in configs:
        df = load_config(dataset_dir, config).select("case_id", "vignette")
        rows = sorted(df.iter_rows(), key=lambda r: natural_key(r[0]))
        if wanted is not None:
            rows = [r for r in rows if r[0] in wanted]
        if limit is not None:
            rows = rows[:limit]
        for case_id, vignette in rows:
            if not vignette or not vignette.strip():
                raise CraftMDError(f"{config}/{case_id}: empty vignette")
            first, second = split_halves(vignette, split)
            out.append(MeldCase(case_id, config, first, second, count_words(first)))
            seen.add(case_id)
    if wanted is not None:
        unknown = sorted(wanted - seen, key=natural_key)
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise CraftMDError(f"case {unknown[0]}{more} is not in configs {list(configs)}")
    if not out:
        raise CraftMDError("no cases to test")
    return out


# -- running ----------------------------------------------------------------------
async def _complete_all(caller, cases: list[MeldCase], render, sampling, role: str, progress: bool):
    from tqdm import tqdm

    bar = tqdm(total=len(cases), desc="meld", unit="case", disable=not progress, file=None)

    async def one(c: MeldCase):
        try:
            return await caller(c.messages(render, role), sampling)
        finally:
            bar.update(1)

    try:
        return await asyncio.gather(*(one(c) for c in cases))
    finally:
        bar.close()


def to_scores(table: pl.DataFrame):
    """The per-case frame as scores rows: ``meld_similarity`` and ``meld_flagged`` per case."""
    import pyarrow as pa

    rows = {k: [] for k in ("case_id", "trial", "config", "scorer", "metric", "value", "label", "detail", "status")}
    for r in table.iter_rows(named=True):
        detail = json.dumps(
            {k: r[k] for k in ("word_count", "first_half", "second_half", "error")}, ensure_ascii=False, sort_keys=True
        )
        ok = r["similarity"] is not None
        for metric, value in (("meld_similarity", r["similarity"]), ("meld_flagged", float(r["flagged"]) if ok else None)):
            for k, v in (
                ("case_id", r["case_id"]),
                ("trial", 0),
                ("config", r["config"]),
                ("scorer", SCORER),
                ("metric", metric),
                ("value", value),
                ("label", r["completion"]),
                ("detail", detail),
                ("status", "ok" if ok else "error"),
            ):
                rows[k].append(v)
    return pa.table(rows)


def read_similarities(meld_dir: Path | str) -> pl.DataFrame:
    """A MELD run's scores, one row per case: case_id, config, word_count, first_half, second_half,
    completion, status, error, similarity, flagged."""
    path = Path(meld_dir) / SCORES
    if not path.exists():
        raise CraftMDError(f"{meld_dir}: not a MELD run (no {SCORES}); run `craftmd meld` first")
    s = pl.read_parquet(path).filter(pl.col("scorer") == SCORER)
    sim = s.filter(pl.col("metric") == "meld_similarity")
    flag = s.filter(pl.col("metric") == "meld_flagged").select(
        "case_id", "config", (pl.col("value") == 1).fill_null(False).alias("flagged")
    )
    d = sim["detail"].str.json_decode(
        pl.Struct({"word_count": pl.Int32, "first_half": pl.String, "second_half": pl.String, "error": pl.String})
    )
    return sim.select(
        "case_id",
        "config",
        d.struct.field("word_count"),
        d.struct.field("first_half"),
        d.struct.field("second_half"),
        pl.col("label").alias("completion"),
        "status",
        d.struct.field("error"),
        pl.col("value").alias("similarity"),
    ).join(flag, on=["case_id", "config"], how="left", maintain_order="left")


def _write_outputs(tmp: Path, table: pl.DataFrame, summary: dict, threshold: float) -> None:
    from craftmd.release import encode_scores

    (tmp / SCORES).write_bytes(encode_scores(to_scores(table), {SCORER: scorer_record(summary)}))
    (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    plot_histogram(table, tmp / FIGURE, summary["model"], threshold)


def plot_histogram(table: pl.DataFrame, path: Path, model: str, threshold: float = THRESHOLD) -> None:
    """Similarity histogram per config with the flagging threshold (cf. Extended Data Fig. 1c)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bins = np.linspace(0.0, 1.0, 41)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ok = table.filter(pl.col("similarity").is_not_null())
    configs = sorted(ok["config"].unique().to_list())
    data = [ok.filter(pl.col("config") == c)["similarity"].to_numpy() for c in configs]
    if data:
        ax.hist(data, bins=bins, stacked=True, label=configs, edgecolor="white", linewidth=0.4)
    ax.axvline(threshold, color="black", linestyle="--", linewidth=1)
    ax.text(threshold, ax.get_ylim()[1] * 0.95, f" {threshold:.2f}", ha="left", va="top", fontsize=8)
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlim(0, 1)
    ax.set_xlabel("similarity of completion to the true second half (1 − normalised edit distance)")
    ax.set_ylabel("cases")
    ax.set_title(f"MELD: {model}", fontsize=10)
    if configs:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def summarise(table: pl.DataFrame, threshold: float = THRESHOLD) -> dict:
    """Per config and overall: cases, failures, flagged count and share, similarity mean/median/max."""

    def stats(df: pl.DataFrame) -> dict:
        ok = df.filter(pl.col("similarity").is_not_null())
        n_ok = ok.height
        flagged = int(df["flagged"].sum())
        sims = ok["similarity"]
        return {
            "n": df.height,
            "n_ok": n_ok,
            "n_failed": df.height - n_ok,
            "n_flagged": flagged,
            "share_flagged": round(flagged / n_ok, 6) if n_ok else None,
            "mean_similarity": round(float(sims.mean()), 6) if n_ok else None,
            "median_similarity": round(float(sims.median()), 6) if n_ok else None,
            "max_similarity": round(float(sims.max()), 6) if n_ok else None,
        }

    per = {c: stats(table.filter(pl.col("config") == c)) for c in sorted(table["config"].unique().to_list())}
    return {"configs": per, "overall": stats(table)}


def run_meld(
    dataset_dir: Path | str, model: str, out: Path | str, *, threshold: float = THRESHOLD, overwrite: bool = False, **settings
) -> Path:
    """``craftmd meld``: :func:`meld` for ``model`` over the dataset (``settings``: its keyword arguments), its result
    folder ``out`` written atomically (scores, summary, histogram)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise CraftMDError(f"{out} exists (pass --overwrite to replace it)")
    table, summary = meld(dataset_dir, model, threshold=threshold, **settings)
    with atomic_dir(out, overwrite=overwrite, owns=(SUMMARY,), holds=(SCORES, SUMMARY, FIGURE)) as tmp:
        _write_outputs(tmp, table, summary, threshold)
    return out


def meld(
    dataset_dir: Path | str,
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    configs: tuple[str, ...] | list[str] = DEFAULT_CONFIGS,
    cases: list[str] | None = None,
    limit: int | None = None,
    cache: Path | str | None = None,
    split: str = "chars",
    role: str = "system",
    temperature: float = 0.0,
    max_tokens: int = 1024,
    seed: int = 0,
    concurrency: int = 8,
    threshold: float = THRESHOLD,
    progress: bool = True,
    prompt_set: str = PROMPT_SET,
) -> tuple[pl.DataFrame, dict]:
    """MELD of ``model`` over the dataset: one row per case (its halves, the completion, similarity, flag) and the run's
    summary (settings, prompt, dataset hashes, figures). Writes nothing (:func:`run_meld` and the ``meld`` scorer do)."""
    from craftmd.models import Sampling
    from craftmd.models.connect import CallSettings, Connections

    if role not in ("system", "user"):
        raise CraftMDError(f"--role must be system or user, not {role!r}")
    if not 0.0 < threshold <= 1.0:
        raise CraftMDError(f"threshold {threshold} must be in (0, 1]")
    todo = meld_cases(dataset_dir, tuple(configs), cases, limit, split)
    render = renderer(prompt_set)
    sampling = Sampling(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed)
    conn = Connections(CallSettings(base_url=base_url, api_key=api_key, concurrency=concurrency, cache=cache), [model])
    caller = conn.caller(model)

    async def go():
        async with conn:
            await conn.check()
            return await _complete_all(caller, todo, render, sampling, role, progress)

    table = _case_rows(todo, asyncio.run(go()), threshold)
    summary = _summary(
        dataset_dir, conn.model(model).name, tuple(configs), prompt_record(prompt_set, role), sampling, split, threshold, table
    )
    if progress:  # counters differ between a fresh run and a cached rerun, so they stay out of summary.json
        counts = ", ".join(
            f"{k} {getattr(caller, k)}" for k in ("calls", "cache_hits", "retries", "failures", "tokens_in", "tokens_out")
        )
        print(f"meld: {counts}", file=sys.stderr)
    return table, summary


#: The per-case frame of a MELD run.
CASE_SCHEMA = {
    "case_id": pl.String, "config": pl.String, "word_count": pl.Int32, "first_half": pl.String,
    "second_half": pl.String, "completion": pl.String, "status": pl.String, "error": pl.String,
    "similarity": pl.Float64, "flagged": pl.Boolean,
}  # fmt: skip


def _case_rows(todo: list[MeldCase], completions: list, threshold: float) -> pl.DataFrame:
    """One row per case: its halves, the model's completion and its similarity to the true second half."""
    rows = []
    for c, comp in zip(todo, completions):
        ok = comp.status == "ok" and isinstance(comp.text, str)
        sim = similarity(c.second_half, comp.text) if ok else None
        rows.append({"case_id": c.case_id, "config": c.config, "word_count": c.word_count, "first_half": c.first_half,
                     "second_half": c.second_half, "completion": comp.text if ok else None,
                     "status": comp.status if comp.status != "ok" or ok else "error", "error": comp.error, "similarity": sim,
                     "flagged": bool(sim is not None and sim >= threshold)})  # fmt: skip
    return pl.DataFrame(rows, schema=CASE_SCHEMA)


def _summary(
    dataset_dir, model: str, configs: tuple[str, ...], prompt: dict, sampling, split: str, threshold: float, table: pl.DataFrame
) -> dict:
    from craftmd.dataset import config_file, file_sha256

    return {
        "model": model,
        "prompt": prompt,
        "sampling": sampling.to_dict(),
        "dataset": {c: file_sha256(config_file(dataset_dir, c)) for c in configs},
        "split": split,
        "word_count": "whitespace-separated words of the first half",
        "similarity": SIMILARITY_DEFINITION,
        "threshold": threshold,
        **summarise(table, threshold),
    }


def scorer_record(summary: dict) -> dict:
    """The ``meld`` scorer's record of a run: what it asked, how (model, prompt, sampling, split, rule, threshold)."""
    return {k: summary[k] for k in ("model", "prompt", "sampling", "dataset", "split", "similarity", "threshold")}


# -- the leaderboard's view ------------------------------------------------------------
def read_summary(meld_dir: Path | str) -> dict:
    path = Path(meld_dir) / SUMMARY
    if not path.exists():
        raise CraftMDError(f"{meld_dir}: not a MELD run (no {SUMMARY}); run `craftmd meld` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CraftMDError(f"{path}: unreadable ({exc})") from None


__all__ = [
    "THRESHOLD", "count_words", "split_halves", "similarity", "meld_prompt", "meld_cases", "renderer", "prompt_record",
    "PROMPT_SETS", "PROMPT_SET",
    "run_meld", "meld", "scorer_record", "summarise", "plot_histogram",
]  # fmt: skip
