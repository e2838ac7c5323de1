"""The tests that need the pinned source besides the releases, and the published p-values it holds.

* ``tables/expert_tests.csv``: McNemar's test between models on the dermatologists' labels of their conversations
  (the paper's Supplementary Table 18; :func:`craftmd.analysis.agreement.expert.upstream_expert_tests`).
* ``tables/published_tests.csv``: the preprint's p-values of FRQ against four-choice MCQ
  (``results/statistics/fig3c_stats.tsv``, ``figs3a_stats.tsv``, ``figs3b_stats.tsv``) beside the nearest tests
  here (``tables/format_tests.csv``), cell by cell. A comparison with a different experiment, not a replication:
  the preprint (medRxiv 2024) ran 140 dermatology cases, earlier versions of GPT-4 and GPT-3.5, and 10 trials;
  ``same_p`` says two numbers are equal, not that the experiments agree.

``results/statistics/`` holds the preprint's tables only (GPT-4 and GPT-3.5; the Nature Medicine supplementary
tables are not in the source). Of their comparisons, only "FRQ vs 4-choice MCQ" has data here: upstream released
no many-choice MCQ answers, no physical-exam-only answers and no answers without the physical exam
(``fig4c_stats.tsv``), so those rows have nothing to be compared with. The tables name neither the setting nor the
case set; read as the pattern of the other tables suggests (a main figure on every case, its two supplementary
panels on the two dermatology datasets, as ``fig2c`` / ``figs1b`` / ``figs1c``), they are compared with the
multi-turn conversation, the MCQ under the ``paper`` rule and the FRQ under the recorded GPT-4 grader-AI.
"""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl

from craftmd import CraftMDError

from .escape import csv_safe

#: The dermatologists' own accuracy on the dermatology vignettes as the paper reports it (Johri et al., Nature Medicine
#: 2025: 86 % on four-choice MCQ, 87 % on FRQ). Quoted, not recomputed: the pinned source holds no answers of theirs
#: to the vignettes (``results/expert_annotations/`` has their quality-control labels of the vignettes, their counts
#: of GPT-4's correct answers and their ratings of conversations, nothing they diagnosed themselves).
DERMATOLOGISTS_REPORTED = {"mcq4": 0.86, "frq": 0.87}
STATISTICS = "results/statistics/"
#: preprint table -> (group_by, group) of tables/format_tests.csv it is compared with
FORMAT_TABLES = {"fig3c_stats.tsv": ("all", "all"), "figs3a_stats.tsv": ("dataset", "derm_public"),
                 "figs3b_stats.tsv": ("dataset", "derm_private")}  # fmt: skip
#: the preprint's model names -> the ingested releases
PREPRINT_MODELS = {"GPT4": "gpt4_1106", "GPT-3.5": "gpt3_1106"}
SETTING, MCQ_GRADER, FRQ_GRADER = "multiturn", "paper", "upstream-gpt4"
FORMATS = {"FRQ": "frq", "4-choice MCQ": "mcq4"}
#: two p-values within this are the same (the preprint prints them with 17 significant digits)
SAME = 1e-9
PUBLISHED_COLUMNS = ["table", "preprint_model", "model", "setting", "group_by", "group", "a", "b", "published_p", "published_p_holm",
                     "p_value", "p_adjusted", "same_p", "same_decision"]  # fmt: skip


def read_preprint_table(data: bytes, name: str) -> pl.DataFrame:
    """One of ``results/statistics/*.tsv``: Experiment1, Experiment2, GPT_model, pvalue, corrected_pvalue."""
    try:
        df = pl.read_csv(io.BytesIO(data), separator="\t", infer_schema_length=0)
    except pl.exceptions.PolarsError as exc:
        raise CraftMDError(f"{STATISTICS}{name}: unreadable ({exc})") from None
    need = {"Experiment1", "Experiment2", "GPT_model", "pvalue", "corrected_pvalue"}
    if not need <= set(df.columns):
        raise CraftMDError(f"{STATISTICS}{name}: expected columns {', '.join(sorted(need))}")
    try:
        return df.with_columns(pl.col("pvalue", "corrected_pvalue").cast(pl.Float64))
    except pl.exceptions.PolarsError:
        raise CraftMDError(f"{STATISTICS}{name}: a p-value is not a number") from None


def published_format_comparison(tables: dict[str, bytes], format_tests: pl.DataFrame) -> pl.DataFrame:
    """The preprint's FRQ-vs-4-choice-MCQ rows (``tables``: file name -> bytes of :data:`FORMAT_TABLES`) beside
    the paired bootstrap of ``format_tests`` (:data:`PUBLISHED_COLUMNS`). ``same_p``: the two raw p-values are equal
    (within :data:`SAME`); ``same_decision``: both below 0.05 or both not. A cell with no recomputed test (a model not
    analysed) has null p-values."""
    ours = format_tests.filter(pl.col("setting") == SETTING, pl.col("mcq_grader") == MCQ_GRADER, pl.col("frq_grader") == FRQ_GRADER,
                               ~pl.col("with_image"), pl.col("test") == "paired-bootstrap")  # fmt: skip
    found = {(r["model"], r["group_by"], r["group"]): r for r in ours.iter_rows(named=True)}
    rows = []
    for name, (group_by, group) in FORMAT_TABLES.items():
        if name not in tables:
            raise CraftMDError(f"no {STATISTICS}{name} to compare with")
        df = read_preprint_table(tables[name], name)
        for r in df.iter_rows(named=True):
            pair = {FORMATS.get(r["Experiment1"].strip()), FORMATS.get(r["Experiment2"].strip())}
            model = PREPRINT_MODELS.get(r["GPT_model"].strip())
            if pair != {"frq", "mcq4"} or model is None:
                continue  # many-choice MCQ: no such answers were released
            o = found.get((model, group_by, group))
            p, q = (o["p_value"], o["p_adjusted"]) if o else (None, None)
            rows.append({
                "table": name, "preprint_model": r["GPT_model"].strip(), "model": model, "setting": SETTING, "group_by": group_by,
                "group": group, "a": "mcq4", "b": "frq", "published_p": r["pvalue"], "published_p_holm": r["corrected_pvalue"],
                "p_value": p, "p_adjusted": q,
                "same_p": None if p is None else abs(p - r["pvalue"]) <= SAME,
                "same_decision": None if p is None else (p < 0.05) == (r["pvalue"] < 0.05),
            })  # fmt: skip
    schema = {c: pl.String for c in PUBLISHED_COLUMNS}
    schema.update({c: pl.Float64 for c in ("published_p", "published_p_holm", "p_value", "p_adjusted")})
    schema.update({"same_p": pl.Boolean, "same_decision": pl.Boolean})
    return pl.DataFrame(rows, schema=schema)


def source_tables(a, source, out: Path | str) -> list[Path]:
    """The experts' McNemar tests and the preprint comparison into ``a`` (``expert_tests``, ``published_tests``) and
    ``out/tables/`` (what ``craftmd leaderboard`` adds to an analysis: both need the pinned source)."""
    from .agreement.expert import AGENT_FILES, DATASET_CSV, upstream_expert_tests

    stats = [STATISTICS + n for n in FORMAT_TABLES]
    files = source.read_files([*AGENT_FILES, DATASET_CSV, *stats])  # one pass over the source
    a.expert_tests = upstream_expert_tests(source, files)
    if a.format_tests is not None:
        a.published_tests = published_format_comparison({p.rsplit("/", 1)[1]: files[p] for p in stats}, a.format_tests)
    tables = Path(out) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("expert_tests", "published_tests"):
        df = getattr(a, name, None)
        if df is not None:
            path = tables / f"{name}.csv"
            csv_safe(df).write_csv(path)
            written.append(path)
    return written


__all__ = [
    "DERMATOLOGISTS_REPORTED",
    "published_format_comparison",
    "read_preprint_table",
    "source_tables",
    "FORMAT_TABLES",
    "PUBLISHED_COLUMNS",
]
